"""GPU measurement files: grpo-run on a real GPU beside the plans that predicted it, as calibration input.

A measurement file (tests/planner/gpu_measurements/h200-2026-11-26.json is the first) holds, per run, the
`grpo-plan` command it was planned with, the knobs it ran, per phase `torch.cuda.max_memory_allocated`
and wall seconds (the engine's profile.json and metrics.jsonl), every step's seconds, and the device
footprint (`cudaMemGetInfo` total − free sampled every 20 ms, with what the device held before the engine
started, and `torch.cuda.memory_reserved`). Its `about` field gives the method.

`measured_inputs(case)` rebuilds the planner inputs of one run: the plan command's model, GPUs and
workload, the lengths the run really had (the file's runs use a random-weight model: prompts of exactly
prompt_len − 2 tokens, responses always at response_len, so both spreads are 0), the measured knobs (and
`UNRECORDED_KNOBS`: what the runs did that the file does not record).
`fit_measured(...)` fits a `Calibration` from the completed runs with the same least-squares machinery
as a grpo-tune sweep (`tuner/calibrate.py`), and measures the CUDA context of the engine process: the
footprint minus what the poller held before the engine started minus the allocator's reserve.
Pure apart from reading the file.
"""

from __future__ import annotations

import shlex
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grpo_pilot.errors import InputError
from grpo_pilot.hardware import parse_cluster
from grpo_pilot.inputs import read_json_file
from grpo_pilot.planner.calibration import Calibration, FitError, FittedValue
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import PlanInputs, model_ref
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS
from grpo_pilot.profiles import resolve_model
from grpo_pilot.tuner.calibrate import (
    Candidate,
    Run,
    _Model,
    _observations,
    candidates,
    fit_time,
    phase_error,
    tokens_per_s_factor,
)

MAX_MEASUREMENT_BYTES = 16 << 20
# What a file's runs did that its knobs do not record: the h200-2026-11-26 runs (grpo-run at 34e4d2d) predate the
# static / CUDA-graph decode loop, so their hf rollout decoded eagerly (`Knobs.hf_decode`, default auto, would
# plan CUDA graphs on a GPU). A file whose knobs record hf_decode overrides this.
UNRECORDED_KNOBS: dict[str, Any] = {"hf_decode": "eager"}
# The packaged calibrations carry a fixed fit time, so that refitting the committed measurements reproduces them.
PACKAGED_FIT_TIME = datetime(2026, 11, 26, tzinfo=timezone.utc)


def packaged_name(path: str | Path) -> str:
    """The packaged calibration's name: the measurement file's stem (e.g. 'h200-2026-11-26')."""
    return Path(path).stem


def load_measurements(path: str | Path) -> dict[str, Any]:
    """The measurement file's JSON object (its `cases` and `about`)."""
    raw = read_json_file(Path(path), "GPU measurement file", hint="", max_bytes=MAX_MEASUREMENT_BYTES)
    if not isinstance(raw, dict) or not isinstance(raw.get("cases"), list):
        raise InputError(f"'{path}' is not a GPU measurement file (no 'cases' list).", "")
    return raw


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
            i += 2  # the knobs come from the run's own record
        else:
            out[word.lstrip("-")] = words[i + 1]
            i += 2
    return out


def measured_inputs(case: dict[str, Any], knob_updates: dict[str, Any] | None = None) -> tuple[PlanInputs, Knobs]:
    """The planner inputs and knobs of one measured run (module docstring). `knob_updates`: knobs the file
    does not record but the run had (e.g. its allocator behaviour)."""
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
    ran = {**UNRECORDED_KNOBS, **case["knobs"], **(knob_updates or {})}
    knobs = Knobs(**{k: v for k, v in ran.items() if k in known})
    inputs = PlanInputs(
        model=model_ref(resolve_model(str(flags["model"]))),
        cluster=parse_cluster(str(flags["gpus"])),
        workload=workload,
    )
    return inputs, knobs


def median_phase_s(case: dict[str, Any]) -> dict[str, float]:
    """Each phase's median seconds over the steps after the first (warm-up)."""
    steps = case["phase_s"][1:] or case["phase_s"]
    return {phase: statistics.median(s[phase] for s in steps if phase in s) for phase in steps[0]}


def host_candidates(gpu: str) -> tuple[Candidate, ...]:
    """The constants a GPU measurement file fits: the host's dispatch times (training passes, the HF decode
    loop per layer and per step), which the file's runs move apart (different layer counts, micro-batch
    counts and decode lengths). The device's rates keep their public sources (the MAMF table, the HBM
    utilisation of LLM decode): three runs of one shape family cannot separate them from the host's time."""
    names = ("train_dispatch_s_per_layer_pass", "hf_decode_s_per_layer", "hf_decode_s_per_step")
    return tuple(c for c in candidates(gpu) if c.name in names)


def measured_runs(cases: list[dict[str, Any]], knob_updates: dict[str, Any] | None = None) -> list[Run]:
    """The completed runs as the time fit's runs."""
    runs = []
    for case in cases:
        if not case.get("completed"):
            continue
        inputs, knobs = measured_inputs(case, knob_updates)
        runs.append(Run(inputs, knobs, inputs.workload, dict(median_phase_s(case))))
    return runs


def engine_context_bytes(cases: list[dict[str, Any]]) -> int | None:
    """Median over the completed runs of what the engine's process held outside the caching allocator:
    device footprint − what the device held before the engine started − the allocator's reserve."""
    values = [
        int(c["device_used_peak_bytes"]) - int(c["device_used_before_bytes"]) - int(c["reserved_peak_bytes"])
        for c in cases
        if c.get("completed") and c.get("device_used_peak_bytes") and c.get("reserved_peak_bytes")
    ]
    return int(statistics.median(values)) if values else None


def fit_measured(
    path: str | Path,
    *,
    name: str,
    knob_updates: dict[str, Any] | None = None,
    created_at: datetime | None = None,
) -> Calibration:
    """The calibration the completed runs of a measurement file determine (module docstring)."""
    raw = load_measurements(path)
    cases = raw["cases"]
    runs = measured_runs(cases, knob_updates)
    if not runs:
        raise InputError(f"'{path}' holds no completed run to calibrate from.", "")
    gpus = {r.inputs.cluster.gpu.name for r in runs}
    if len(gpus) != 1:
        raise InputError(f"'{path}' mixes GPUs ({', '.join(sorted(gpus))}): calibrate one GPU at a time.", "")
    (gpu,) = gpus
    context = engine_context_bytes(cases)
    overheads = DEFAULT_OVERHEADS.model_copy(update={"cuda_context_bytes": context}) if context else DEFAULT_OVERHEADS
    memory_fitted = []
    if context:
        memory_fitted.append(
            FittedValue(
                name="memory.cuda_context_bytes",
                analytic=float(DEFAULT_OVERHEADS.cuda_context_bytes),
                fitted=float(context),
                sensitivity=0.0,
                method="median over the completed runs of device footprint − device used before − reserved peak",
            )
        )
    base = DEFAULT_TIME_COEFFICIENTS
    model = _Model(runs, overheads)
    obs = _observations(runs, model.phases(base))
    coef, fitted, kept = fit_time(model, obs, host_candidates(gpu), base)
    measured_tps = [
        r.workload.responses_per_step * r.workload.seq_mean_tokens / sum(r.measured_s.values()) for r in runs
    ]
    when = (created_at or datetime.now().astimezone()).isoformat(timespec="seconds")
    return Calibration(
        name=name,
        device_kind=str(raw.get("device_kind") or gpu),
        plan_gpu=gpu,
        versions={k: v for k, v in (raw.get("versions") or {}).items()},
        overheads=overheads,
        time_coefficients=coef,
        fitted=tuple(memory_fitted + fitted),
        kept_analytic=tuple(kept),
        num_trials=len(runs),
        num_observations=len(obs),
        fit_error=FitError(
            tokens_per_s_before=tokens_per_s_factor(model, measured_tps, base),
            tokens_per_s_after=tokens_per_s_factor(model, measured_tps, coef),
            phase_time_before=phase_error(model, obs, base),
            phase_time_after=phase_error(model, obs, coef),
        ),
        source=f"{Path(path).name}: {raw.get('about', '')[:300]}",
        created_at=when,
    )
