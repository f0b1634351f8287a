"""The tuner's space: which knobs vary on which hardware, and points ↔ knobs."""

from __future__ import annotations

from tune_helpers import gpu_plan, tiny_plan

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.tuner.space import build_space, grid, knobs_at, params_of, point_key


def test_cpu_hf_space_has_no_gpu_only_knobs():
    space = build_space(tiny_plan())
    # no log-prob budget: without a KL loss and with one on-policy update per step no log-prob pass runs
    assert set(space.choices) == {"update_batch", "gradient_checkpointing", "fused_logprob"}
    # 8 prompts x n=4 on one worker: every power of two up to 32 divides the 32-sequence mini-batch
    assert [c for c in space.choices["update_batch"] if c.startswith("micro:")] == [
        f"micro:{m}" for m in (1, 2, 4, 8, 16, 32)
    ]
    # token budgets are whole 48-token sequences (prompt 32 + response 16)
    assert [c for c in space.choices["update_batch"] if c.startswith("tokens:")] == [
        f"tokens:{48 * k}" for k in (1, 2, 4, 8, 16, 32)
    ]
    assert space.size == 12 * 2 * 2


def test_input_plan_is_a_point_and_round_trips():
    plan = tiny_plan()
    space = build_space(plan)
    base = params_of(space, plan.knobs)
    assert base == {
        "update_batch": "micro:16",
        "gradient_checkpointing": False,
        "fused_logprob": True,
    }
    assert knobs_at(space, base) == plan.knobs
    for point in list(grid(space))[::17]:
        assert params_of(space, knobs_at(space, point)) == point


def test_token_budget_point_sets_dynamic_batching():
    space = build_space(tiny_plan())
    knobs = knobs_at(space, {"update_batch": "tokens:192"})
    assert knobs.max_token_len_per_gpu == 192 and knobs.dynamic_batching
    assert knobs_at(space, {"update_batch": "micro:2"}).max_token_len_per_gpu is None


def test_off_space_knobs_have_no_point():
    space = build_space(tiny_plan())
    assert params_of(space, tiny_plan().knobs.model_copy(update={"micro_batch_size_per_gpu": 3})) is None
    assert params_of(space, tiny_plan().knobs.model_copy(update={"max_num_seqs": 7})) is None  # not a dimension


def test_log_prob_budget_is_searched_when_a_pass_runs():
    kl = gpu_plan("qwen2.5-1.5b", "1xH100-80G", Workload(prompts_per_step=16, mini_batch_prompts=16, n=4))
    split = gpu_plan(
        "qwen2.5-1.5b", "1xH100-80G", Workload(prompts_per_step=16, mini_batch_prompts=8, n=4, use_kl_loss=False)
    )
    for plan in (kl, split):
        # whole 1536-token sequences (512 + 1024), plus the plan's own 16384
        assert build_space(plan).choices["log_prob_max_token_len_per_gpu"] == (
            1536,
            3072,
            6144,
            12288,
            16384,
            24576,
            49152,
        )


def test_gpu_vllm_space():
    plan = gpu_plan("qwen2.5-7b", "8xH100-80G", gpu_memory_utilization=0.55)
    space = build_space(plan)
    # qwen2.5-7b: 28 heads, 4 kv heads -> TP 1, 2, 4 (8 does not divide 28)
    assert space.choices["rollout_tp"] == (1, 2, 4)
    # grpo-run (every trial's engine) has no Ulysses SP: a 2-worker sweep once lost a trial to ulysses_sp=2
    assert "ulysses_sp" not in space.choices
    assert 0.55 in space.choices["gpu_memory_utilization"] and 0.9 in space.choices["gpu_memory_utilization"]
    for name in ("param_offload", "optimizer_offload", "ref_param_offload", "enforce_eager"):
        assert space.choices[name] == (False, True)
    # per-GPU mini-batch 256 prompts x 5 / 8 = 160 sequences: micro-batches must divide it
    assert [c for c in space.choices["update_batch"] if c.startswith("micro:")] == [
        f"micro:{m}" for m in (1, 2, 4, 8, 16, 32)
    ]
    assert params_of(space, plan.knobs) is not None


def test_no_kl_has_no_ref_offload_and_micro_respects_mini_batch():
    plan = gpu_plan(
        "qwen2.5-1.5b", "2xH100-80G", Workload(prompts_per_step=8, mini_batch_prompts=4, n=3, use_kl_loss=False)
    )
    space = build_space(plan)
    assert "ref_param_offload" not in space.choices
    # mini-batch 4 x 3 = 12 sequences over 2 GPUs = 6 per GPU: micro 1 and 2 (and the plan's 4 is off the grid)
    assert {c for c in space.choices["update_batch"] if c.startswith("micro:")} == {"micro:1", "micro:2", "micro:4"}


def test_split_placement_keeps_tp_and_sp_fixed():
    plan = gpu_plan("qwen2.5-7b", "8xH100-80G", placement="split")
    space = build_space(plan)
    assert "rollout_tp" not in space.choices and "ulysses_sp" not in space.choices


def test_restrict_and_point_key():
    space = build_space(tiny_plan()).restrict(["gradient_checkpointing"])
    assert list(grid(space)) == [{"gradient_checkpointing": False}, {"gradient_checkpointing": True}]
    assert knobs_at(space, {"gradient_checkpointing": True}) == tiny_plan().knobs.model_copy(
        update={"gradient_checkpointing": True}
    )
    assert point_key({"b": 1, "a": 2}) == point_key({"a": 2, "b": 1})
    assert Knobs().micro_batch_size_per_gpu == 4


# ---- --sweep-adapter: LoRA rank and target modules (workload settings, not knobs) ----------------------------


def lora_plan():
    from grpo_pilot.planner.plan import load_plan

    return load_plan("examples/tiny/plan-lora.json")


def test_adapter_dimensions_are_opt_in_and_need_a_lora_plan():
    import pytest

    from grpo_pilot.errors import InputError

    assert not {"lora_rank", "lora_targets"} & set(build_space(lora_plan()).choices)
    with pytest.raises(InputError, match="fine-tunes every parameter"):
        build_space(tiny_plan(), sweep_adapter=True)
    space = build_space(lora_plan(), sweep_adapter=True)
    assert space.choices["lora_rank"] == (8, 16, 32, 64)
    assert space.choices["lora_targets"] == ("all-linear", "q_proj,k_proj,v_proj,o_proj", "q_proj,v_proj")
    assert space.size == build_space(lora_plan()).size * 4 * 3


def test_an_adapter_point_changes_the_trial_workload_not_the_knobs():
    from grpo_pilot.planner.recheck import plan_inputs
    from grpo_pilot.tuner.space import inputs_at

    plan = lora_plan()
    space = build_space(plan, sweep_adapter=True)
    base = params_of(space, plan.knobs)
    assert base["lora_rank"] == 8 and base["lora_targets"] == "all-linear"
    assert knobs_at(space, base) == plan.knobs and inputs_at(space, plan_inputs(plan), base) == plan_inputs(plan)
    point = dict(base, lora_rank=32, lora_targets="q_proj,v_proj")
    assert knobs_at(space, point) == plan.knobs
    adapter = inputs_at(space, plan_inputs(plan), point).workload.adapter
    assert (adapter.rank, adapter.target_modules) == (32, ("q_proj", "v_proj"))
    assert adapter.alpha == 64.0  # the plan's alpha / r = 16 / 8 kept: the adapters' scaling does not change
