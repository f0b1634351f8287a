"""verl's start-up rules and the memory limits, one rule at a time."""

from __future__ import annotations

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.constraints import (
    binding_constraint,
    constraint_values,
    memory_checks,
    structural_checks,
    violations,
)
from grpo_pilot.planner.reports import MemoryReport, PhaseMemory
from grpo_pilot.profiles import resolve_model

QWEN7 = resolve_model("qwen2.5-7b").spec  # 28 heads, 4 kv heads
A100x8 = parse_cluster("8xA100-80G")


def broken(knobs: Knobs, workload: Workload = Workload(), cluster=A100x8, spec=QWEN7, target="grpo-pilot") -> set[str]:
    return {c.rule for c in violations(structural_checks(spec, cluster, workload, knobs, target=target))}


def test_defaults_break_nothing() -> None:
    assert broken(Knobs()) == set()


def test_batch_must_divide_over_the_world() -> None:
    # 100 prompts × n 5 = 500 responses over 8 GPUs leaves 4 over (verl validate_config).
    assert "batch.divisible_by_world" in broken(Knobs(), Workload(prompts_per_step=100, mini_batch_prompts=100))
    assert "batch.divisible_by_world" not in broken(Knobs(), Workload(prompts_per_step=104, mini_batch_prompts=104))


def test_mini_batch_per_gpu_divisible_by_micro() -> None:
    # 256 prompts × 5 / 8 ranks = 160 responses per GPU: micro 32 divides it, 64 does not.
    assert "mini_batch.divisible_by_micro" not in broken(Knobs(micro_batch_size_per_gpu=32))
    assert "mini_batch.divisible_by_micro" in broken(Knobs(micro_batch_size_per_gpu=64))
    # with SP 2 the 4 data-parallel ranks each get 320: 64 divides it (SP 2 divides 28 heads and 4 kv heads)
    assert "mini_batch.divisible_by_micro" not in broken(Knobs(micro_batch_size_per_gpu=64, ulysses_sp=2))
    # dynamic batching has no micro-batch to divide by
    assert "mini_batch.divisible_by_micro" not in broken(Knobs(micro_batch_size_per_gpu=64, max_token_len_per_gpu=8192))


def test_mini_batch_smaller_than_ranks() -> None:
    w = Workload(prompts_per_step=8, mini_batch_prompts=1, n=4)  # 4 responses over 8 ranks → 0 per GPU
    assert "mini_batch.per_gpu" in broken(Knobs(), w)


def test_micro_batch_must_be_set_without_dynamic_batching() -> None:
    assert "micro_batch.set" in broken(Knobs(micro_batch_size_per_gpu=None))


def test_rollout_tp_rules() -> None:
    assert "rollout.world_divisible_by_tp" in broken(Knobs(rollout_tp=3))
    # 28 heads: TP 8 does not divide them (vLLM); TP 4 does, and TP 4 == 4 kv heads
    assert "rollout.heads_divisible_by_tp" in broken(Knobs(rollout_tp=8))
    assert broken(Knobs(rollout_tp=4)) == set()
    # HF rollout ignores TP
    assert broken(Knobs(rollout_tp=3, rollout_backend="hf")) == set()


def test_ulysses_rules() -> None:
    assert "ulysses.heads_divisible_by_sp" in broken(Knobs(ulysses_sp=8))  # 28 % 8 != 0
    assert "ulysses.world_divisible_by_sp" in broken(Knobs(ulysses_sp=4), cluster=parse_cluster("6xA100-80G"))
    qwen3 = resolve_model("qwen3-32b").spec  # 64 heads, 8 kv heads
    assert broken(Knobs(ulysses_sp=8, rollout_tp=8), spec=qwen3) == set()


def test_token_budgets_follow_the_target() -> None:
    seq = Workload().seq_len_tokens  # 1536
    assert "token_budget.update" in broken(Knobs(max_token_len_per_gpu=seq - 1))
    assert "token_budget.update" not in broken(Knobs(max_token_len_per_gpu=seq))
    # verl multiplies the budget by SP (1000 × 2 ≥ 1536); our engine does not
    half = Knobs(max_token_len_per_gpu=1000, log_prob_max_token_len_per_gpu=1000, ulysses_sp=2)
    assert {"token_budget.update", "token_budget.log_prob"} <= broken(half)
    assert not {"token_budget.update", "token_budget.log_prob"} & broken(half, target="verl")


def test_vllm_scheduler_and_context_rules() -> None:
    assert "rollout.batched_tokens_ge_seqs" in broken(Knobs(max_num_seqs=9000))
    assert "context.max_position" in broken(Knobs(), Workload(response_len_tokens=QWEN7.max_position_embeddings))


def test_split_needs_two_pools() -> None:
    assert "split.pools" in broken(Knobs(placement="split", rollout_tp=1), cluster=parse_cluster("1xA100-80G"))
    assert "split.pools" in broken(Knobs(placement="split", split_rollout_gpus_per_node=8))
    assert "split.pools" not in broken(Knobs(placement="split", split_rollout_gpus_per_node=4))


def _report(update_bytes: int, host_bytes: int, kv_tokens: int) -> MemoryReport:
    small = PhaseMemory.of({"actor_params": 10, "overhead_cuda_context": 5})
    return MemoryReport(
        phases={
            "rollout": small,
            "log_prob": small,
            "update": PhaseMemory.of({"activations": update_bytes - 20, "actor_params": 20}),
            "weight_sync": small,
        },
        host=PhaseMemory.of({"optimizer_states_offloaded": host_bytes}),
        kv_cache_bytes_per_gpu=kv_tokens * 10,
        kv_cache_tokens_per_gpu=kv_tokens,
        max_concurrent_seqs=1,
    )


def test_memory_checks_normalise_the_excess() -> None:
    w = Workload()
    checks = memory_checks(_report(150, 50, 4096), w, Knobs(), usable_gpu_bytes=100, host_ram_bytes=100)
    values = constraint_values(checks)
    assert values["memory.update"] == pytest.approx(0.5)  # (150 − 100) / 100
    assert values["memory.rollout"] == pytest.approx(-0.85)
    assert values["host_ram"] == pytest.approx(-0.5)
    assert values["rollout.kv_cache"] == pytest.approx((1536 - 4096) / 1536)
    assert binding_constraint(checks, None) == "update.activations"
    assert [c.rule for c in violations(checks)] == ["memory.update"]


def test_kv_cache_must_hold_one_request_and_host_ram_binds() -> None:
    w = Workload()
    checks = memory_checks(_report(50, 300, 1000), w, Knobs(), usable_gpu_bytes=100, host_ram_bytes=100)
    assert {c.rule for c in violations(checks)} == {"host_ram", "rollout.kv_cache"}
    assert binding_constraint(checks, None) == "host.optimizer_states_offloaded"  # excess 2.0 beats (1536−1000)/1536
    hf = memory_checks(_report(50, 50, 0), w, Knobs(rollout_backend="hf"), usable_gpu_bytes=100, host_ram_bytes=100)
    assert violations(hf) == ()  # HF generate has no preallocated KV cache to check


def test_binding_when_everything_fits_is_the_fullest_phase() -> None:
    report = _report(90, 10, 4096)
    checks = memory_checks(report, Workload(), Knobs(), usable_gpu_bytes=100, host_ram_bytes=100)
    assert violations(checks) == ()
    assert binding_constraint(checks, report) == "update.activations"


def test_kv_rule_states_the_budget_shortfall_and_the_utilisation_that_starts_vllm():
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.estimate import rollout_kv_budget_bytes
    from grpo_pilot.planner.evaluate import PlanInputs, assess, model_ref
    from grpo_pilot.profiles import resolve_model

    inputs = PlanInputs(
        model=model_ref(resolve_model("qwen2.5-7b")), cluster=parse_cluster("1xA100-80G"), workload=Workload()
    )
    knobs = Knobs(rollout_tp=1, gpu_memory_utilization=0.1)  # 8 GiB budget < 14.2 GiB of bf16 weights
    kv = next(c for c in assess(inputs, knobs).checks if c.rule == "rollout.kv_cache")
    signed = rollout_kv_budget_bytes(inputs.model.spec, inputs.cluster, inputs.workload, knobs)
    total = inputs.cluster.gpu.memory_bytes
    assert not kv.ok and signed < 0
    assert f"is {-signed / (1 << 30):.1f} GiB short" in kv.message
    assert f"must exceed {0.1 - signed / total:.2f} for it to start" in kv.message
    # a budget that only lacks KV room for one request gets no shortfall clause
    roomy = next(
        c
        for c in assess(inputs, knobs.model_copy(update={"gpu_memory_utilization": 0.9})).checks
        if c.rule == "rollout.kv_cache"
    )
    assert roomy.ok and "short of" not in roomy.message


def test_kv_rule_under_free_memory_says_no_utilisation_starts_vllm():
    """vllm_memory=free (verl's vendored worker): a negative KV budget is memory the profile run lacks beside the
    trainer; raising gpu_memory_utilization cannot mend it."""
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.estimate import rollout_kv_budget_bytes
    from grpo_pilot.planner.evaluate import PlanInputs, assess, model_ref
    from grpo_pilot.profiles import resolve_model

    inputs = PlanInputs(
        model=model_ref(resolve_model("qwen2.5-14b")), cluster=parse_cluster("1xA100-80G"), workload=Workload()
    )
    knobs = Knobs(rollout_tp=1, gpu_memory_utilization=0.9, vllm_memory="free")  # fp32 actor 59 GB + bf16 29.5 GB
    kv = next(c for c in assess(inputs, knobs).checks if c.rule == "rollout.kv_cache")
    signed = rollout_kv_budget_bytes(inputs.model.spec, inputs.cluster, inputs.workload, knobs)
    assert not kv.ok and signed < 0
    assert f"exceed the memory the trainer leaves free by {-signed / (1 << 30):.1f} GiB" in kv.message
    assert "must exceed" not in kv.message
