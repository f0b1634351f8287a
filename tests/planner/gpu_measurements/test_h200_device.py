"""The device footprint of the H200 runs (h200-2026-11-26.json) against the plan's peak: within −2 … +10 %.

What nvidia-smi showed for each completed run (cudaMemGetInfo's largest `total − free` minus the poller's own
context) against the plan's largest phase total, re-planned as measured (measured.py): the allocator of the
runs (PyTorch's default, the cache emptied once per step, after the rollout) and the analytic overheads — no
constant fitted to these runs (the packaged H200 calibration's CUDA context was, so it is left out here). The
reserve beyond the tensors comes from the caching allocator's rules (planner/memory/allocator.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import measured  # noqa: E402

from grpo_pilot.planner.make_plan import evaluate  # noqa: E402
from grpo_pilot.planner.memory.allocator import RESERVE_ITEM  # noqa: E402
from grpo_pilot.tuner.measured_runs import measured_inputs  # noqa: E402

LOW, HIGH = -0.02, 0.10
CASES = measured.completed_cases()
GiB = 1 << 30
# Not explained: the allocator replay of the engine's own allocation sequence for this run (verify/allocator_sim.py
# over benchmarks/allocator_replay.py's record, default allocator, the cache emptied after the rollout) reserves
# 48.5 GiB at the update, where the run showed 53.8 GiB (allocated 46.2 GiB in both). The engine the run measured
# (34e4d2d) replays to the same 48.5 GiB, and foreach against fused AdamW, AdamW's lazy states, Python's collector and
# the CUDA kernels' logsumexp / attention scratch move it by at most 1.3 GiB (benchmarks/allocator_replay_34e4d2d.py,
# docs/validation.md "Device footprint"): 5.3 GiB of the measured reserve stay unaccounted for.
UNEXPLAINED = {
    "qwen2.5-1.5b-kl-2minibatch": "the measured reserve is 5.3 GiB above what the allocator's rules give for the "
    "recorded allocations of the engine it measured (34e4d2d) and of today's (docs/validation.md, Device footprint)"
}


def _marked(cases: list[dict]) -> list:
    return [
        pytest.param(c, id=c["name"], marks=pytest.mark.xfail(reason=UNEXPLAINED[c["name"]], strict=True))
        if c["name"] in UNEXPLAINED
        else pytest.param(c, id=c["name"])
        for c in cases
    ]


@pytest.fixture(scope="module")
def plans() -> dict:
    return {case["name"]: measured.device_plan_of(case) for case in CASES}


@pytest.mark.parametrize("case", _marked(CASES))
def test_device_peak_within_band(plans: dict, case: dict) -> None:
    plan, got = plans[case["name"]], measured.device_footprint_bytes(case)
    err = plan.peak_gpu_bytes / got - 1
    assert LOW <= err <= HIGH, (
        f"{case['name']}: device peak {plan.peak_gpu_bytes / GiB:.2f} GiB predicted, {got / GiB:.2f} measured "
        f"({err:+.1%}, band {LOW:+.0%} … {HIGH:+.0%})"
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_reserve_is_what_separates_the_device_peak_from_the_tensor_peak(plans: dict, case: dict) -> None:
    """Without the allocator's reserve the plan would sit below the measured footprint for every run (the
    issue's 5.9-12.5 % gap): the reserve item is what closes it, and the tensor peak stays its own number."""
    plan, got = plans[case["name"]], measured.device_footprint_bytes(case)
    peak = max(plan.phases.values(), key=lambda p: p.tensor_bytes)  # the update: the later phases hold its reserve
    assert plan.peak_tensor_bytes <= peak.total_bytes - peak.items[RESERVE_ITEM]
    assert peak.total_bytes - peak.items[RESERVE_ITEM] < got * (1 + LOW)
    assert peak.items[RESERVE_ITEM] > 0


def test_grpo_runs_default_settings_hold_less_than_the_measured_ones() -> None:
    """grpo-run's defaults (expandable segments, verl's cache releases) plan a smaller device peak than the
    settings the runs had, with the same tensors."""
    for case in CASES:
        inputs, knobs = measured_inputs(case, {"allocator": "expandable", "release_cache": "verl"})
        now = evaluate(inputs, knobs)
        then = measured.device_plan_of(case)
        assert now.peak_tensor_bytes == then.peak_tensor_bytes
        assert now.peak_gpu_bytes < then.peak_gpu_bytes, case["name"]
