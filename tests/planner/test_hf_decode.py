"""The `hf_decode` knob: the static / CUDA-graph decode loop's memory and time in the plan (its trace against
the plan: test_traced_single_rank.py)."""

from __future__ import annotations

import math

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.memory.hf_generate import static_decode_memory
from grpo_pilot.planner.rollout_time import rollout_breakdown
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS
from grpo_pilot.planner.timing import estimate_time
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
        ("2xA100-80G", "grpo-pilot", {}),  # sharded (DTensor) parameters: the engine decodes eagerly
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
