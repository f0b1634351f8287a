"""The `hf_decode` knob: the static / CUDA-graph decode loop's memory and time in the plan (its trace against
the plan: test_traced_single_rank.py)."""

from __future__ import annotations

import math

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.execution import execution_of
from grpo_pilot.planner.memory.hf_generate import static_decode_memory
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
from grpo_pilot.planner.rollout_time import rollout_breakdown
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS
from grpo_pilot.planner.timing import estimate_time
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles.catalog import resolve_model

Q05 = resolve_model("qwen2.5-0.5b").spec
P05 = 494_032_768  # Qwen2.5-0.5B parameters (tied embeddings once)
WORKLOAD = Workload(prompts_per_step=8, mini_batch_prompts=8, n=4, prompt_len_tokens=512, response_len_tokens=1024)


def _rollout(cluster: str, target: str = "grpo-pilot", **knobs) -> dict[str, dict[str, int]]:
    base = dict(rollout_backend="hf", rollout_tp=1, max_num_seqs=32)
    rep = estimate_memory(Q05, parse_cluster(cluster), WORKLOAD.worst_case(), Knobs(**{**base, **knobs}), target=target)
    return {phase: dict(p.items) for phase, p in rep.phases.items()}


def test_gpu_static_loop_holds_the_bf16_copy_from_weight_sync_through_rollout() -> None:
    eager, static = _rollout("1xA100-80G", hf_decode="eager"), _rollout("1xA100-80G", hf_decode="static")
    for phase in ("rollout", "weight_sync"):
        assert "hf_decode_weight_copy" not in eager[phase]
        assert static[phase]["hf_decode_weight_copy"] == 2 * P05  # bf16 copy of the fp32 policy
    for phase in ("log_prob", "update"):  # `sleep` dropped it after the rollout
        assert "hf_decode_weight_copy" not in static[phase]
    assert "overhead_hf_cuda_graph_pool" not in static["rollout"]
    # the static buffers are bf16, the eager loop's cache fp32 (under autocast): the decode moment's cache halves
    rows, total, per_token_fp32 = 32, 512 + 1024, 2 * 24 * 128 * 4
    assert eager["rollout"]["hf_kv_cache"] == rows * total * per_token_fp32
    static_kv = rows * total * per_token_fp32 // 2
    # here loading the prefill peaks: the buffers, the prefill's fp32 cache (8 prompts × 512), one layer's K of it
    # gathered to the 32 rows
    prefill = 8 * 512 * per_token_fp32
    assert static["rollout"]["hf_kv_cache"] == static_kv + prefill + 32 * 512 * per_token_fp32 // (2 * 24)


@pytest.mark.parametrize("knob", ["cuda_graph", "auto"])
def test_cuda_graph_pool_is_a_non_tensor_item_of_the_rollout(knob: str) -> None:
    graphs, static = _rollout("1xA100-80G", hf_decode=knob), _rollout("1xA100-80G", hf_decode="static")
    # one step's sampling temporaries of the full batch: bf16 logits and two fp32 [B, V] tensors
    assert graphs["rollout"]["overhead_hf_cuda_graph_pool"] == 32 * 151_936 * (2 + 8)
    # reserved, not allocated: the tensor bytes (what max_memory_allocated is compared with) do not move
    g, s = (
        estimate_memory(
            Q05,
            parse_cluster("1xA100-80G"),
            WORKLOAD.worst_case(),
            Knobs(rollout_backend="hf", rollout_tp=1, max_num_seqs=32, hf_decode=k),
        ).phases["rollout"]
        for k in (knob, "static")
    )
    assert g.tensor_bytes == s.tensor_bytes and g.total_bytes - s.total_bytes == 32 * 151_936 * 10
    assert {k: v for k, v in graphs["rollout"].items() if k != "overhead_hf_cuda_graph_pool"} == static["rollout"]
    assert "overhead_hf_cuda_graph_pool" not in graphs["weight_sync"]


def test_cpu_auto_is_eager_and_cpu_static_has_no_copy() -> None:
    auto, eager, static = (_rollout("1xcpu", hf_decode=k) for k in ("auto", "eager", "static"))
    assert auto == eager and "hf_decode_weight_copy" not in auto["rollout"]
    assert static["rollout"].get("hf_decode_weight_copy", 0) == 0  # fp32 weights decode in place
    assert "overhead_hf_cuda_graph_pool" not in static["rollout"]  # cuda_graph off CUDA runs static
    assert _rollout("1xcpu", hf_decode="cuda_graph") == static


@pytest.mark.parametrize(
    ("cluster", "target", "knobs"),
    [
        ("1xA100-80G", "trl", {}),  # TRL's HF rollout is transformers' generate
        ("1xA100-80G", "verl", {}),
        ("2xA100-80G", "verl", {}),  # verl's HF rollout generates on its sharded module: no replica, no knob
        ("1xA100-80G", "grpo-pilot", {"rollout_backend": "vllm", "rollout_tp": 1}),
    ],
)
def test_the_knob_moves_nothing_where_the_static_loop_does_not_run(cluster: str, target: str, knobs: dict) -> None:
    static = _rollout(cluster, target, hf_decode="static", **knobs)
    assert static == _rollout(cluster, target, hf_decode="eager", **knobs)
    assert not any(k.startswith("hf_decode") or k == "overhead_hf_cuda_graph_pool" for p in static.values() for k in p)


@pytest.mark.parametrize("c", [2, 4])
def test_static_sizes_follow_batch_lengths_and_dtype(c: int) -> None:
    def mem(rows: int, prompt: int, response: int, graphs: bool = True):
        return static_decode_memory(
            batch_seqs=rows,
            prompt_seqs=rows // 4,
            prompt_tokens=prompt,
            response_tokens=response,
            kv_bytes_per_token=1024 * c,
            prefill_kv_bytes_per_token=4096,
            layers=2,
            prefill_bytes_per_token=100,
            vocab=1000,
            compute_bytes=c,
            head_cast_bytes=0,
            weight_copy_bytes=777,
            graphs=graphs,
        )

    base = mem(8, 100, 28)
    assert base.generate.kv_cache_bytes == 8 * 128 * 1024 * c
    assert mem(16, 100, 28).generate.kv_cache_bytes == 2 * base.generate.kv_cache_bytes
    assert mem(8, 200, 56).generate.kv_cache_bytes == 2 * base.generate.kv_cache_bytes
    assert base.graph_pool_bytes == 8 * 1000 * (c + 8) and mem(8, 100, 28, graphs=False).graph_pool_bytes == 0
    assert base.weight_copy_bytes == base.generate.items["hf_decode_weight_copy"] == 777
    # a long response: the decode moment (buffers, sampling temporaries, ids + uniforms + key mask + EOS table)
    long = mem(8, 10, 4000).generate.items
    assert long["hf_kv_cache"] == 8 * 4010 * 1024 * c
    assert long["hf_sampling_logits"] == 8 * 1000 * (c + 8) + 12 * 8 * 4000 + 8 * 4010 + 1001


def test_cuda_graphs_charge_one_launch_per_token_plus_the_captures() -> None:
    cluster, w = parse_cluster("1xH200"), WORKLOAD.worst_case()
    knobs = Knobs(rollout_backend="hf", rollout_tp=1, max_num_seqs=8)
    coef = DEFAULT_TIME_COEFFICIENTS
    eager, static, graphs = (
        rollout_breakdown(Q05, cluster, w, knobs, decode_mode=m) for m in ("eager", "static", "cuda_graph")
    )
    assert static == eager  # the same ops, dispatched one by one
    step_host_s = coef.hf_decode_s_per_layer * Q05.num_layers + coef.hf_decode_s_per_step
    batches = math.ceil(32 / 8)
    assert graphs.decode_steps == eager.decode_steps == batches * 1024
    captures = batches * math.ceil((512 + 1024) / 128)
    saved = eager.decode_steps * (step_host_s - coef.cuda_graph_launch_s) - captures * 2 * step_host_s
    assert eager.decode_overhead_s - graphs.decode_overhead_s == pytest.approx(saved, rel=1e-9)
    assert graphs.decode_roofline_s == eager.decode_roofline_s and graphs.prefill_s == eager.prefill_s
    # the plan's time resolves the knob as the memory does: auto = graphs on a GPU, eager on the cpu device
    for knob, mode in (("auto", "cuda_graph"), ("static", "static"), ("eager", "eager")):
        t = estimate_time(Q05, cluster, w, knobs.model_copy(update={"hf_decode": knob}))
        expected = rollout_breakdown(Q05, cluster, w, knobs, decode_mode=mode).total_s
        assert t.phases_s["rollout"] == pytest.approx(expected, rel=1e-12)
    cpu = parse_cluster("1xcpu")
    auto_cpu = estimate_time(Q05, cpu, w, knobs).phases_s["rollout"]
    assert auto_cpu == pytest.approx(rollout_breakdown(Q05, cpu, w, knobs).total_s, rel=1e-12)


def test_plans_without_the_knob_load_as_auto() -> None:
    from grpo_pilot.planner.plan import load_plan

    assert load_plan("examples/tiny/plan.json").knobs.hf_decode == "auto"


# ---- our engine's replica: several training GPUs or split placement (memory/hf_rollout.py) ----------------------


def test_sharded_policy_decodes_on_a_bf16_replica_resident_in_every_phase() -> None:
    auto, eager = _rollout("2xA100-80G", hf_decode="auto"), _rollout("2xA100-80G", hf_decode="eager")
    for phases in (auto, eager):
        for phase in ("weight_sync", "rollout", "log_prob", "update"):  # never slept nor offloaded
            assert phases[phase]["hf_replica_weights"] == 2 * P05  # engine/worker.py: .to(dtype=torch.bfloat16)
        assert "gathered_layers" not in phases["rollout"] and "root_embed_lm_head" not in phases["rollout"]
    # the replica is unsharded: the static loop runs (CUDA graphs under auto), on the replica's own bf16 weights
    assert auto["rollout"]["hf_decode_weight_copy"] == 0 and "hf_decode_weight_copy" not in eager["rollout"]
    assert auto["rollout"]["overhead_hf_cuda_graph_pool"] == 16 * 151_936 * (2 + 8)  # 32 responses over 2 replicas
    assert auto["rollout"]["autocast_weight_cache"] == eager["rollout"]["autocast_weight_cache"] == 0  # bf16 weights
    # the eager loop's cache is bf16 too (bf16 keys and values), 16 rows of 512 + 1024 tokens
    assert eager["rollout"]["hf_kv_cache"] == 16 * (512 + 1024) * 2 * 24 * 128 * 2
    # the sync gathers every fp32 parameter (the tied embedding under both names) into one 2 GiB bucket at most,
    # plus the parameter gathered past it
    gathered = 4 * (P05 + 151_936 * 896)
    assert gathered > 2 << 30
    assert auto["weight_sync"]["weight_sync_bucket"] == 2 << 30
    assert auto["weight_sync"]["largest_gathered_tensor"] == 4 * 151_936 * 896


def test_split_rollout_gpu_holds_the_replica_and_an_unsharded_trainer_sends_in_place() -> None:
    split = _rollout("2xA100-80G", hf_decode="auto", placement="split")
    rollout = split["rollout"]
    assert rollout["hf_replica_weights"] == 2 * P05 and "actor_params" not in rollout  # the rollout GPU's
    assert rollout["overhead_hf_cuda_graph_pool"] == 32 * 151_936 * (2 + 8)  # one replica decodes all 32 rows
    for phase in ("log_prob", "update"):  # the training GPU's: no replica there
        assert "hf_replica_weights" not in split[phase]
    sync = split["weight_sync"]  # one training rank: `param.detach()` gathers nothing; the larger side is reported
    assert "weight_sync_bucket" not in sync and "hf_replica_weights" not in sync and sync["actor_params"] == 4 * P05


def test_verl_and_trl_have_no_replica_and_one_unsharded_gpu_decodes_the_policy() -> None:
    for cluster, target in (("2xA100-80G", "verl"), ("2xA100-80G", "trl"), ("1xA100-80G", "grpo-pilot")):
        phases = _rollout(cluster, target)
        assert not any("hf_replica_weights" in items for items in phases.values())


def test_lora_on_a_replica_decodes_static_and_on_the_policy_eagerly() -> None:
    from grpo_pilot.planner.adapters import AdapterSettings

    lora = WORKLOAD.model_copy(update={"adapter": AdapterSettings(framework="grpo-pilot", method="lora", rank=8)})
    knobs = Knobs(rollout_backend="hf", rollout_tp=1, max_num_seqs=32, hf_decode="static")
    one, two = (estimate_memory(Q05, parse_cluster(c), lora.worst_case(), knobs) for c in ("1xA100-80G", "2xA100-80G"))
    assert "hf_decode_weight_copy" not in one.phases["rollout"].items  # peft's module: eager
    assert two.phases["rollout"].items["hf_decode_weight_copy"] == 0  # the plain replica: static, no copy


def test_time_reads_the_replica_rule_the_memory_reads() -> None:
    cluster, w = parse_cluster("2xH200"), WORKLOAD.worst_case()
    knobs = Knobs(rollout_backend="hf", rollout_tp=1, max_num_seqs=8)
    for target, mode, replica_gpus in (("grpo-pilot", "cuda_graph", 2), ("verl", "eager", None)):
        t = estimate_time(Q05, cluster, w, knobs, target=target)
        expected = rollout_breakdown(Q05, cluster, w, knobs, decode_mode=mode, replica_gpus=replica_gpus)
        assert t.phases_s["rollout"] == pytest.approx(expected.total_s, rel=1e-12)
    # the replica gathers no weight per forward: faster than the same eager loop on the sharded module
    ours = rollout_breakdown(Q05, cluster, w, knobs, replica_gpus=2)
    sharded = rollout_breakdown(Q05, cluster, w, knobs)
    assert ours.decode_overhead_s < sharded.decode_overhead_s and ours.replicas == sharded.replicas == 2
    split = knobs.model_copy(update={"placement": "split"})
    t = estimate_time(Q05, cluster, w, split)  # one rollout GPU decodes all 32 rows
    assert t.phases_s["rollout"] == pytest.approx(
        rollout_breakdown(Q05, cluster, w, split, decode_mode="cuda_graph", replica_gpus=1).total_s, rel=1e-12
    )


def test_plan_json_counts_one_hf_replica_per_gpu_that_generates() -> None:
    cluster = parse_cluster("8xA100-80G")
    ours = traits_for("grpo-pilot")
    knobs = Knobs(rollout_backend="hf", placement="split", split_rollout_gpus_per_node=2)
    split = execution_of(Q05, cluster, Workload(), knobs, executor=ours, overheads=DEFAULT_OVERHEADS)
    assert (split.trainer_workers, split.rollout_replicas) == (6, 2)  # the split rollout GPUs, not the trainers
    colocated = knobs.model_copy(update={"placement": "colocated", "split_rollout_gpus_per_node": 0})
    both = execution_of(Q05, cluster, Workload(), colocated, executor=ours, overheads=DEFAULT_OVERHEADS)
    assert both.rollout_replicas == 8
