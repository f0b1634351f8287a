"""The launch families through plans: what each executor may run (support.py), the knob space the search
moves, the exports and the readers reading them back, and old plan files still loading."""

from __future__ import annotations

import json

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.adapters import AdapterSettings
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.critic_settings import CriticSettings
from grpo_pilot.planner.evaluate import PlanInputs, model_ref
from grpo_pilot.planner.export import trl_config_text, verl_command, verl_overrides
from grpo_pilot.planner.from_verl import read_verl
from grpo_pilot.planner.knob_space import ANALYTIC_GRID, knob_choices
from grpo_pilot.planner.make_plan import evaluate, make_plan
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.support import unsupported
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles import resolve_model
from tests.planner.conftest import spec

LORA = AdapterSettings(framework="verl", method="lora", rank=32, alpha=32.0, target_modules=("all-linear",))


def _inputs(workload: Workload, target: str = "verl", model: str = "qwen2.5-7b", gpus: str = "8xH100") -> PlanInputs:
    return PlanInputs(
        model=model_ref(resolve_model(model)), cluster=parse_cluster(gpus), workload=workload, target=target
    )


@pytest.mark.parametrize(
    "target, workload, knobs, reason",
    [
        ("grpo-pilot", Workload(algorithm="ppo"), Knobs(), "does not run PPO"),
        ("grpo-pilot", Workload(), Knobs(strategy="megatron"), "megatron backend"),
        ("grpo-pilot", Workload(), Knobs(rollout_backend="sglang"), "no sglang rollout"),
        ("grpo-pilot", Workload(), Knobs(activation_offload=True), "no setting for activation_offload"),
        ("trl", Workload(algorithm="ppo"), Knobs(), "does not run PPO"),
        ("trl", Workload(), Knobs(strategy="megatron", megatron_tp=2), "megatron backend"),
        ("verl", Workload(algorithm="ppo"), Knobs(strategy="megatron"), "critic trained under Megatron"),
        ("verl", Workload(adapter=LORA), Knobs(strategy="megatron"), "LoRA under Megatron"),
        ("verl", Workload(adapter=LORA), Knobs(rollout_backend="sglang"), "LoRA with SGLang"),
        ("verl", Workload(), Knobs(strategy="megatron", rollout_backend="hf"), "vLLM or SGLang"),
        ("trl", Workload(adapter=LORA.model_copy(update={"method": "dora"})), Knobs(), "DoRA"),
        ("trl", Workload(adapter=LORA.model_copy(update={"modules_to_save": ("lm_head",)})), Knobs(), "lm_head"),
        (
            "trl",
            Workload(adapter=LORA.model_copy(update={"method": "none", "base_quantization": "4bit"})),
            Knobs(),
            "no trainable weights",
        ),
    ],
)
def test_what_an_executor_cannot_run_is_refused(target: str, workload: Workload, knobs: Knobs, reason: str) -> None:
    problems = unsupported(target, workload, knobs)
    assert any(reason in p for p in problems), problems
    with pytest.raises(InputError, match="cannot be planned"):
        evaluate(_inputs(workload, target), knobs)


def test_what_verl_runs_is_planned() -> None:
    for workload, knobs in (
        (Workload(algorithm="ppo"), Knobs()),
        (Workload(adapter=LORA), Knobs(layered_summon=True)),
        (Workload(), Knobs(strategy="megatron", megatron_tp=4, megatron_pp=2, micro_batch_size_per_gpu=2)),
        (Workload(), Knobs(rollout_backend="sglang")),
        (Workload(), Knobs(activation_offload=True)),
    ):
        assert unsupported("verl", workload, knobs) == []
        assert evaluate(_inputs(workload), knobs).peak_gpu_bytes > 0
    assert any(
        "Mixture-of-Experts" in p
        for p in unsupported("verl", Workload(), Knobs(strategy="megatron"), model_is_moe=True)
    )


def test_the_search_moves_the_families_knobs_only_where_their_family_is() -> None:
    m, c = spec("qwen2.5-7b"), parse_cluster("8xH100")
    verl = traits_for("verl")

    def dims(workload: Workload, include: Knobs, executor=verl) -> dict:
        return knob_choices(m, c, workload, include=include, executor=executor, grid=ANALYTIC_GRID)

    plain = dims(Workload(), Knobs())
    assert "activation_offload" in plain and "strategy" not in plain  # the strategy is the user's
    assert not any(k.startswith(("megatron_", "critic_")) for k in plain) and "layered_summon" not in plain
    mega = dims(Workload(), Knobs(strategy="megatron"))
    assert mega["megatron_tp"] == (1, 2, 4)  # within the node, dividing 28 heads and 4 kv heads
    assert mega["megatron_pp"] == (1, 2, 4) and mega["megatron_recompute"] == ("full", "none", "selective")
    assert not {"gradient_checkpointing", "ulysses_sp", "activation_offload"} & set(mega)  # FSDP-only
    ppo = dims(Workload(algorithm="ppo"), Knobs())
    assert ppo["critic_param_offload"] == ppo["critic_optimizer_offload"] == (False, True)
    assert dims(Workload(adapter=LORA), Knobs())["layered_summon"] == (False, True)
    ours = dims(Workload(), Knobs(), traits_for("grpo-pilot"))
    assert not {"activation_offload", "layered_summon"} & set(ours)


def test_a_megatron_search_finds_a_layout_that_fits_where_the_defaults_do_not() -> None:
    inputs = _inputs(Workload(), model="qwen2.5-32b")
    plan = make_plan(inputs, pins={"strategy": "megatron"}, trials=40)
    k = plan.knobs
    assert plan.fits and k.strategy == "megatron"
    assert 8 % (k.megatron_tp * k.megatron_pp * k.megatron_cp) == 0
    default = evaluate(inputs, Knobs(strategy="megatron"))  # TP 1, PP 1: a whole 32B replica per GPU
    assert not default.fits


def test_verl_export_of_the_families_reads_back() -> None:
    """`--emit verl` of a PPO + LoRA + SGLang + activation-offload plan, and of a Megatron plan, read back by
    --from-verl to the same workload and knobs."""
    workload = Workload(algorithm="ppo", adapter=LORA, critic=CriticSettings(micro_batch_size_per_gpu=4))
    knobs = Knobs(
        rollout_backend="sglang",
        activation_offload=True,
        layered_summon=True,
        critic_param_offload=True,
        micro_batch_size_per_gpu=4,
        log_prob_micro_batch_size_per_gpu=8,
    )
    # LoRA with SGLang is not modelled: plan the LoRA half with vLLM, the SGLang half without adapters
    for w, k in (
        (workload, knobs.model_copy(update={"rollout_backend": "vllm"})),
        (workload.model_copy(update={"adapter": None}), knobs),
    ):
        plan = evaluate(_inputs(w), k)
        launch = read_verl(verl_command(plan))
        got = Workload(**launch.workload)
        assert got.algorithm == "ppo" and got.critic.micro_batch_size_per_gpu == 4
        assert got.adapter == (None if w.adapter is None else got.adapter) and (got.adapter is None) == (
            w.adapter is None
        )
        back = Knobs(**launch.knobs)
        names = ("rollout_backend", "activation_offload", "critic_param_offload")
        for name in names + (("layered_summon",) if w.adapter is not None else ()):
            assert getattr(back, name) == getattr(k, name), name
    mega = Knobs(strategy="megatron", megatron_tp=4, megatron_pp=2, megatron_recompute="full", param_offload=True)
    plan = evaluate(_inputs(Workload(use_kl_loss=False)), mega.model_copy(update={"micro_batch_size_per_gpu": 2}))
    command = verl_command(plan)
    assert "--config-name=ppo_megatron_trainer" in command and "fsdp_config" not in command
    back = Knobs(**read_verl(command).knobs)
    for name in ("strategy", "megatron_tp", "megatron_pp", "megatron_recompute", "param_offload"):
        assert getattr(back, name) == getattr(mega, name), name
    assert dict(verl_overrides(plan))["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] == "4"


def test_trl_export_writes_the_adapter() -> None:
    qlora = LORA.model_copy(update={"framework": "trl", "base_quantization": "4bit", "quant_type": "nf4"})
    w = Workload(prompts_per_step=8, mini_batch_prompts=8, n=8, use_kl_loss=False, adapter=qlora)
    plan = evaluate(_inputs(w, "trl", gpus="1xA100-80G"), Knobs(rollout_backend="hf", rollout_tp=1))
    text = trl_config_text(plan)
    assert "peft_config = LoraConfig(" in text and "r=32," in text and "target_modules='all-linear'" in text
    assert "load_in_4bit=True" in text and 'bnb_4bit_quant_type="nf4"' in text
    assert "# axolotl: adapter: qlora" in text and "# axolotl: lora_target_linear: true" in text
    compile(text, "trl_config.py", "exec")  # the emitted config is Python


def test_old_plan_files_still_load_and_ppo_plans_round_trip() -> None:
    plan = evaluate(_inputs(Workload(algorithm="ppo")), Knobs())
    again = Plan.model_validate_json(plan.to_json())
    assert set(again.phases) == {"rollout", "log_prob", "values", "critic_update", "update", "weight_sync"}
    old = json.loads(evaluate(_inputs(Workload()), Knobs()).to_json())
    for field in ("algorithm", "critic"):  # a plan written before these fields existed
        old["workload"].pop(field, None)
    for name in list(Knobs.model_fields)[-14:]:
        old["knobs"].pop(name, None)
    loaded = Plan.model_validate(old)
    assert loaded.workload.algorithm == "grpo" and loaded.knobs.strategy == "fsdp"
    assert set(loaded.phases) == {"rollout", "log_prob", "update", "weight_sync"}
