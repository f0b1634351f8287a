"""Real GPU runs of grpo-run beside what the planner predicts for exactly those runs.

`h200-2026-11-26.json` (copied from the project's shared measurements) holds grpo-run on one NVIDIA H200:
Qwen2.5 0.5B, 1.5B and 3B shapes, random weights, HF rollout, 3 steps each (its `about` field gives the
method). `compare(case)` re-plans each run with the planner of this checkout — the run's own plan command,
every knob pinned as measured, the lengths the run really had (prompts of exactly prompt_len − 2 tokens,
responses always at response_len: a random model never stops) and the allocator behaviour the runs had
(`MEASURED_ALLOCATOR`: PyTorch's default caching allocator, the cache emptied once per step, after the
rollout) — and returns measured beside predicted:

- tensor bytes per phase: `torch.cuda.max_memory_allocated` after a reset at the phase start, against the
  phase's tensor items (the plan's items without `overhead_*`);
- the device footprint: the largest `total − free` of `cudaMemGetInfo` over the run minus what the
  device held before the engine started (the poller's own CUDA context), against the plan's peak;
- the step time: the median of the steps after the first (warm-up), against the predicted step (with
  the calibration packaged for the GPU, as `grpo-plan` applies it).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, NamedTuple

from grpo_pilot.planner.calibration import calibrated, packaged_for
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.plan import Plan
from grpo_pilot.tuner.measured_runs import load_measurements, measured_inputs, median_phase_s

FILE = Path(__file__).resolve().parent / "h200-2026-11-26.json"
# the allocator behaviour of the measured runs: PyTorch's default allocator (no PYTORCH_CUDA_ALLOC_CONF, no setting in
# the engine at 34e4d2d) and one cache release per step, after the rollout (HFRollout.sleep called
# torch.cuda.empty_cache(): grpo_pilot/engine/rollout/hf.py@34e4d2d lines 171-174, engine/loop.py collect_batch)
MEASURED_ALLOCATOR = {"allocator": "default", "release_cache": "after_rollout"}


def load() -> dict[str, Any]:
    return load_measurements(FILE)


def completed_cases() -> list[dict[str, Any]]:
    return [c for c in load()["cases"] if c["completed"]]


def plan_of(case: dict[str, Any]) -> Plan:
    """The planner's plan for the run as it was measured (module docstring), with the calibration a plan
    for that GPU gets by default (the packaged one)."""
    inputs, knobs = measured_inputs(case, MEASURED_ALLOCATOR)
    packaged = packaged_for(inputs.cluster.gpu.name)
    if packaged is not None:
        inputs = calibrated(inputs, *packaged)
    return evaluate(inputs, knobs)


def device_plan_of(case: dict[str, Any]) -> Plan:
    """The plan of the run as measured with the analytic overheads: the packaged H200 calibration's CUDA context
    was fitted to these very runs (calibrations/H200.json `fitted`), so a check of the device footprint against
    them must not use it."""
    return evaluate(*measured_inputs(case, MEASURED_ALLOCATOR))


def device_footprint_bytes(case: dict[str, Any]) -> int:
    """The run's largest `total - free` (cudaMemGetInfo) minus what the device held before it started (the poller's
    own CUDA context): what nvidia-smi showed for the run."""
    return int(case["device_used_peak_bytes"]) - int(case["device_used_before_bytes"])


class Comparison(NamedTuple):
    name: str
    tensor_bytes: dict[str, tuple[int, int]]  # phase -> (measured, predicted)
    device_bytes: tuple[int, int]
    step_s: tuple[float, float]
    phase_s: dict[str, tuple[float, float]]


def compare(case: dict[str, Any]) -> Comparison:
    plan = plan_of(case)
    tensors = {
        phase: (int(m["measured_peak_bytes"]), plan.phases[phase].tensor_bytes)
        for phase, m in case["phases"].items()
        if phase in plan.phases and m["measured_peak_bytes"] is not None
    }
    device = device_footprint_bytes(case)
    steps = case["step_s"][1:]
    measured_s = median_phase_s(case)
    phase_s = {phase: (measured_s[phase], plan.phase_times_s[phase]) for phase in plan.phase_times_s}
    return Comparison(
        name=case["name"],
        tensor_bytes=tensors,
        device_bytes=(device, plan.peak_gpu_bytes),
        step_s=(statistics.median(steps), plan.predicted_step_s),
        phase_s=phase_s,
    )
