"""Conformance every memory estimate must pass, over a grid of models × clusters × targets × knobs."""

from __future__ import annotations

import itertools

import pytest

from grpo_pilot.planner.config import Workload
from grpo_pilot.planner.rules import PLAN_PHASES as PHASES

GRID_MODELS = ("qwen2.5-0.5b", "qwen2.5-7b", "qwen3-8b", "llama-3.1-8b", "qwen2.5-32b")
GRID_CLUSTERS = ("1xA100-80G", "8xA100-80G", "2x8xH100-80G", "4xL40S", "1xcpu")
TARGETS = ("grpo-pilot", "verl", "trl")
# Knob variants that switch on each technique once (and a few together).
KNOB_VARIANTS: tuple[dict, ...] = (
    {},
    {"max_token_len_per_gpu": 8192},
    {"param_offload": True, "optimizer_offload": True, "ref_param_offload": True},
    {"gradient_checkpointing": False, "micro_batch_size_per_gpu": 1},
    {"fused_logprob": True, "enforce_eager": True},
    {"ulysses_sp": 2, "rollout_tp": 1},
    {"rollout_backend": "hf", "max_num_seqs": 64},
    {"placement": "split", "rollout_tp": 1},
    {"gpu_memory_utilization": 0.9, "max_num_seqs": 256, "max_num_batched_tokens": 4096},
)


def _check_report(report, max_num_seqs: int) -> None:
    for name in PHASES:
        phase = report.phases[name]
        assert all(isinstance(v, int) and v >= 0 for v in phase.items.values()), (name, phase.items)
        assert sum(phase.items.values()) == phase.total_bytes
        assert phase.total_bytes > 0
    assert all(v >= 0 for v in report.host.items.values())
    assert sum(report.host.items.values()) == report.host.total_bytes > 0
    assert report.kv_cache_bytes_per_gpu >= 0 and report.kv_cache_tokens_per_gpu >= 0
    assert 0 <= report.max_concurrent_seqs <= max_num_seqs


@pytest.mark.parametrize("target", TARGETS)
def test_grid_items_non_negative_and_sum_to_totals(target: str, est) -> None:
    for model, cl, knobs in itertools.product(GRID_MODELS, GRID_CLUSTERS, KNOB_VARIANTS):
        report = est(model, cl, target=target, **knobs)
        _check_report(report, knobs.get("max_num_seqs", 1024))


def _series(values, make, totals):
    return [totals(make(v)) for v in values]


def _assert_non_decreasing(series: list[dict[str, int]], label: str) -> None:
    for key in series[0]:
        col = [row[key] for row in series]
        assert col == sorted(col), f"{label}: {key} not monotone: {col}"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("cl", ["8xA100-80G", "1xcpu"])
def test_monotone_in_micro_batch_and_token_budgets(target: str, cl: str, est, totals) -> None:
    model = "qwen2.5-0.5b" if cl == "1xcpu" else "qwen2.5-7b"
    _assert_non_decreasing(
        _series([1, 2, 4, 8, 16], lambda m: est(model, cl, target=target, micro_batch_size_per_gpu=m), totals),
        "micro_batch",
    )
    _assert_non_decreasing(
        _series(
            [1024, 4096, 8192, 16384, 65536], lambda t: est(model, cl, target=target, max_token_len_per_gpu=t), totals
        ),
        "max_token_len",
    )
    _assert_non_decreasing(
        _series(
            [1024, 4096, 16384, 65536],
            lambda t: est(model, cl, target=target, log_prob_max_token_len_per_gpu=t),
            totals,
        ),
        "log_prob_budget",
    )
    # the first micro-batch sizes must really grow the update peak (not a flat, trivially monotone line)
    small, large = (
        est(model, cl, target=target, micro_batch_size_per_gpu=1),
        est(model, cl, target=target, micro_batch_size_per_gpu=16),
    )
    assert large.phases["update"].total_bytes > small.phases["update"].total_bytes


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "knobs", [{}, {"max_token_len_per_gpu": 16384}, {"rollout_backend": "hf"}, {"fused_logprob": True, "ulysses_sp": 2}]
)
def test_monotone_in_response_length(target: str, knobs: dict, est, totals) -> None:
    def make(resp: int):
        return est("qwen3-8b", "8xH100-80G", target=target, workload=Workload(response_len_tokens=resp), **knobs)

    _assert_non_decreasing(_series([128, 512, 1024, 4096, 16384], make, totals), f"response_len {knobs}")


SHARDED = {
    "rollout": ("actor_params", "optimizer_states", "ref_params"),
    "update": ("actor_params", "actor_grads", "optimizer_states", "ref_params"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-7b", "qwen3-8b"])
def test_sharding_by_k_divides_sharded_items_exactly(target: str, model: str, est) -> None:
    clusters = ["1xH100-80G", "2xH100-80G", "4xH100-80G", "8xH100-80G", "2x8xH100-80G"]  # D = 1, 2, 4, 8, 16
    # today's verl keeps its FSDP reference in host RAM (planner/ref_offload.py): shard a pre-#121 one's instead
    era = {"ref_forced_cpu_offload": False} if target == "verl" else {}
    reports = [est(model, cl, target=target, **era) for cl in clusters]
    base = reports[0]
    for k, report in zip([1, 2, 4, 8, 16], reports):
        for phase, names in SHARDED.items():
            for name in names:
                one, sharded = base.phases[phase].items[name], report.phases[phase].items[name]
                assert one > 0
                assert sharded * k == one, (phase, name, k)  # these parameter counts divide by 16


def test_split_placement_shards_over_the_training_pool_only(est) -> None:
    colocated = est("qwen2.5-7b", "8xA100-80G")
    split = est("qwen2.5-7b", "8xA100-80G", placement="split", split_rollout_gpus_per_node=2)  # D = 6
    p = 7_615_616_512
    assert split.phases["update"].items["actor_params"] == -(-p // 6) * 4
    assert colocated.phases["update"].items["actor_params"] == p // 8 * 4
    # rollout GPUs hold the vLLM engine only: no trainer state there
    assert "actor_params" not in split.phases["rollout"].items
    # the vLLM budget is a fraction of total memory, independent of what the trainer holds
    assert split.phases["rollout"].items["vllm_kv_cache"] == colocated.phases["rollout"].items["vllm_kv_cache"]
    assert split.phases["rollout"].total_bytes < colocated.phases["rollout"].total_bytes
    # training GPUs hold no rollout-engine leftovers in the update
    assert not any(k.startswith("vllm_") for k in split.phases["update"].items)
