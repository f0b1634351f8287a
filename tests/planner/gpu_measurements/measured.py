"""Real GPU runs of grpo-run beside what the planner predicts for exactly those runs.

`h200-2026-11-26.json` (copied from the project's shared measurements) holds grpo-run on one NVIDIA H200:
Qwen2.5 0.5B, 1.5B and 3B shapes, random weights, HF rollout, 3 steps each (its `about` field gives the
method). `compare(case)` re-plans each run with the planner of this checkout — the run's own plan command,
every knob pinned as measured, the lengths the run really had (prompts of exactly prompt_len − 2 tokens,
responses always at response_len: a random model never stops) and the allocator behaviour the runs had
(default caching allocator, no cache release between phases) — and returns measured beside predicted:

- tensor bytes per phase: `torch.cuda.max_memory_allocated` after a reset at the phase start, against the
  phase's tensor items (the plan's items without `overhead_*`);
- the device footprint: the largest `total − free` of `cudaMemGetInfo` over the run minus what the
  device held before the engine started (the poller's own CUDA context), against the plan's peak;
- the step time: the median of the steps after the first (warm-up), against the predicted step.
"""

from __future__ import annotations

import json
import shlex
import statistics
from pathlib import Path
from typing import Any, NamedTuple

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import PlanInputs, evaluate, model_ref
from grpo_pilot.planner.plan import Plan
from grpo_pilot.profiles import resolve_model

FILE = Path(__file__).resolve().parent / "h200-2026-11-26.json"
# the allocator behaviour of the measured runs (the file's `about`: no cache release, default allocator)
MEASURED_ALLOCATOR = {"allocator": "caching", "release_cache": False}


def load() -> dict[str, Any]:
    return json.loads(FILE.read_text())


def completed_cases() -> list[dict[str, Any]]:
    return [c for c in load()["cases"] if c["completed"]]


def _flags(command: str) -> dict[str, str | bool]:
    words = shlex.split(command)[1:]
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("--kl", "--no-kl"):
            out["kl"] = word == "--kl"
            i += 1
        elif word == "--pin":
            i += 2  # the knobs come from the case's own record
        else:
            out[word.lstrip("-")] = words[i + 1]
            i += 2
    return out


def plan_of(case: dict[str, Any]) -> Plan:
    """The planner's plan for the run as it was measured (module docstring)."""
    flags = _flags(case["plan_command"])
    prompt, response = int(flags["prompt-len"]), int(flags["response-len"])
    workload = Workload(
        prompts_per_step=int(flags["prompts-per-step"]),
        mini_batch_prompts=int(flags["mini-batch"]),
        n=int(flags["n"]),
        prompt_len_tokens=prompt,
        response_len_tokens=response,
        prompt_len_mean_tokens=prompt - 2,
        prompt_len_std_tokens=0,
        response_len_mean_tokens=response,
        response_len_std_tokens=0,
        use_kl_loss=bool(flags.get("kl", True)),
    )
    known = set(Knobs.model_fields)
    knobs = Knobs(**{k: v for k, v in {**case["knobs"], **MEASURED_ALLOCATOR}.items() if k in known})
    inputs = PlanInputs(
        model=model_ref(resolve_model(str(flags["model"]))),
        cluster=parse_cluster(str(flags["gpus"])),
        workload=workload,
    )
    return evaluate(inputs, knobs)


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
    device = int(case["device_used_peak_bytes"]) - int(case["device_used_before_bytes"])
    steps = case["step_s"][1:]
    phase_s = {
        phase: (statistics.median(p[phase] for p in case["phase_s"][1:]), plan.phase_times_s[phase])
        for phase in plan.phase_times_s
    }
    return Comparison(
        name=case["name"],
        tensor_bytes=tensors,
        device_bytes=(device, plan.peak_gpu_bytes),
        step_s=(statistics.median(steps), plan.predicted_step_s),
        phase_s=phase_s,
    )
