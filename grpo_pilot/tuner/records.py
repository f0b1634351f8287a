"""`TrialRecord`: everything one trial stores, built so that calibration can be fitted from it later.

Per trial: the knobs, the trial plan's predicted time and memory per phase (with the memory items),
the measured time and peak memory per phase, the failure if any (kind, worker, phase, step, message),
where it ran (GPU kind, device, software versions) and how it was measured (steps, memory source).
The record lives in the Optuna storage as the trial's `record` user attribute (JSON), so the study
itself is the data set; `trials_frame` flattens records into the trials.csv table.

Status: `ok` (measured), `oom` / `worker_died` / `crash` / `timeout` (ran, failed), `pruned`
(predicted far over memory, not run).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.rules import RUN_PHASES
from grpo_pilot.tuner.prior import tensor_bytes
from grpo_pilot.tuner.runner import TrialOutcome

RecordStatus = Literal["ok", "oom", "worker_died", "crash", "timeout", "pruned"]
Source = Literal["input_plan", "planner", "sampler", "planner_fallback", "random_fallback", "retry"]
RECORD_ATTR = "record"
RECORD_SCHEMA = 1


class PhaseRecord(Frozen):
    """One phase: the plan's prediction beside the measurement (None where either has no number)."""

    predicted_s: float | None = None
    measured_s: float | None = None
    predicted_total_bytes: int | None = Field(default=None, description="Phase total, overheads included.")
    predicted_tensor_bytes: int | None = Field(default=None, description="Phase items without overhead_*.")
    predicted_items: dict[str, int] = Field(default_factory=dict, description="The plan's memory items.")
    measured_peak_bytes: int | None = Field(default=None, description="Peak tensor bytes measured.")
    measured_rss_peak_bytes: int | None = Field(default=None, description="Process peak RSS (CPU).")


class TrialRecord(Frozen):
    """One trial of a sweep."""

    schema_version: int = RECORD_SCHEMA
    number: int = Field(ge=0, description="Optuna trial number.")
    status: RecordStatus
    source: Source = Field(description="Who proposed the point: the input plan, the planner's ranking, the sampler.")
    params: dict[str, Any] = Field(description="The point of the tuner's space.")
    knobs: Knobs
    predicted_fits: bool = Field(description="The planner's verdict for these knobs.")
    predicted_tokens_per_s: float
    measured_tokens_per_s: float | None = None
    predicted_step_s: float
    measured_step_s: float | None = None
    predicted_peak_bytes: int = Field(description="Largest phase total (the plan's peak_gpu_bytes).")
    predicted_peak_tensor_bytes: int = Field(description="Largest phase's tensor bytes.")
    measured_peak_bytes: int | None = Field(default=None, description="Largest measured phase peak (tensor bytes).")
    phases: dict[str, PhaseRecord] = Field(default_factory=dict)
    step_tokens_per_s: tuple[float, ...] = Field(default=(), description="Each measured step's tokens/s.")
    measured_prompt_len_mean_tokens: float | None = Field(default=None, description="Mean prompt, measured steps.")
    measured_response_len_mean_tokens: float | None = Field(
        default=None, description="Mean response of the measured steps (the planner predicted the plan's lengths)."
    )
    steps: int = Field(ge=0, description="Steps the trial was asked to run (0 when pruned).")
    steps_measured: tuple[int, ...] = ()
    failure_kind: str | None = None
    failure_worker: str | None = None
    failure_phase: str | None = None
    failure_step: int | None = None
    failure_message: str | None = None
    prune_reason: str | None = None
    memory_cap_bytes: int | None = Field(default=None, description="Tensor-byte cap the run was held to.")
    gpu_kind: str = Field(description="Accelerator the trial ran on ('cpu' or the CUDA device name).")
    plan_gpu: str = Field(description="GPU the plan was made for (catalog name).")
    device: str | None = Field(default=None, description="The engine's device string (profile.json).")
    memory_source: str | None = None
    versions: dict[str, str | None] = Field(default_factory=dict, description="grpo_pilot, torch, transformers, ...")
    duration_s: float = Field(default=0.0, ge=0.0, description="Wall time of the trial, start-up included.")
    trial_dir: str | None = None


def build_record(
    *,
    number: int,
    source: Source,
    params: dict[str, Any],
    plan: Plan,
    outcome: TrialOutcome | None,
    steps: int,
    gpu_kind: str,
    versions: dict[str, str | None],
    prune_reason: str | None = None,
    memory_cap_bytes: int | None = None,
    trial_dir: str | None = None,
) -> TrialRecord:
    """A record from the trial plan and the run's outcome (`outcome` None = pruned, not run)."""
    phases: dict[str, PhaseRecord] = {}
    for name in RUN_PHASES:
        mem = plan.phases.get(name)  # type: ignore[call-overload]
        measured = outcome.phases.get(name) if outcome is not None else None
        phases[name] = PhaseRecord(
            predicted_s=plan.phase_times_s.get(name),  # type: ignore[call-overload]
            measured_s=measured.wall_s if measured else None,
            predicted_total_bytes=mem.total_bytes if mem else None,
            predicted_tensor_bytes=tensor_bytes(mem.items) if mem else None,
            predicted_items=dict(mem.items) if mem else {},
            measured_peak_bytes=measured.peak_bytes if measured else None,
            measured_rss_peak_bytes=measured.rss_peak_bytes if measured else None,
        )
    failure = outcome.failure if outcome is not None else None
    return TrialRecord(
        number=number,
        status="pruned" if outcome is None else outcome.status,
        source=source,
        params=params,
        knobs=plan.knobs,
        predicted_fits=plan.fits,
        predicted_tokens_per_s=plan.tokens_per_s,
        measured_tokens_per_s=outcome.tokens_per_s if outcome else None,
        predicted_step_s=plan.predicted_step_s,
        measured_step_s=outcome.step_s if outcome else None,
        predicted_peak_bytes=plan.peak_gpu_bytes,
        predicted_peak_tensor_bytes=max(tensor_bytes(p.items) for p in plan.phases.values()),
        measured_peak_bytes=outcome.peak_bytes if outcome else None,
        phases=phases,
        step_tokens_per_s=outcome.step_tokens_per_s if outcome else (),
        measured_prompt_len_mean_tokens=outcome.prompt_len_mean_tokens if outcome else None,
        measured_response_len_mean_tokens=outcome.response_len_mean_tokens if outcome else None,
        steps=0 if outcome is None else steps,
        steps_measured=outcome.steps_measured if outcome else (),
        failure_kind=failure.kind if failure else None,
        failure_worker=failure.worker if failure else None,
        failure_phase=failure.phase if failure else None,
        failure_step=failure.step if failure else None,
        failure_message=failure.message if failure else None,
        prune_reason=prune_reason,
        memory_cap_bytes=memory_cap_bytes,
        gpu_kind=gpu_kind,
        plan_gpu=plan.cluster.gpu.name,
        device=outcome.device if outcome else None,
        memory_source=outcome.memory_source if outcome else None,
        versions=versions,
        duration_s=outcome.wall_s if outcome else 0.0,
        trial_dir=trial_dir,
    )


def trials_frame(records: list[TrialRecord]) -> Any:
    """A pandas DataFrame, one row per trial: knobs, status, measured vs predicted per phase."""
    import pandas as pd

    rows = []
    for r in sorted(records, key=lambda r: r.number):
        row: dict[str, Any] = {"trial": r.number, "status": r.status, "source": r.source}
        row.update({f"knob.{k}": v for k, v in r.params.items()})
        row.update(
            {
                "measured_tokens_per_s": r.measured_tokens_per_s,
                "predicted_tokens_per_s": r.predicted_tokens_per_s,
                "tokens_per_s_error": _rel(r.measured_tokens_per_s, r.predicted_tokens_per_s),
                "measured_step_s": r.measured_step_s,
                "predicted_step_s": r.predicted_step_s,
                "measured_peak_bytes": r.measured_peak_bytes,
                "predicted_peak_tensor_bytes": r.predicted_peak_tensor_bytes,
                "predicted_peak_bytes": r.predicted_peak_bytes,
                "predicted_fits": r.predicted_fits,
                "measured_prompt_len_mean_tokens": r.measured_prompt_len_mean_tokens,
                "measured_response_len_mean_tokens": r.measured_response_len_mean_tokens,
            }
        )
        for name, p in r.phases.items():
            row[f"{name}.measured_s"] = p.measured_s
            row[f"{name}.predicted_s"] = p.predicted_s
            row[f"{name}.measured_peak_bytes"] = p.measured_peak_bytes
            row[f"{name}.predicted_tensor_bytes"] = p.predicted_tensor_bytes
            row[f"{name}.memory_error"] = _rel(p.measured_peak_bytes, p.predicted_tensor_bytes)
            row[f"{name}.predicted_total_bytes"] = p.predicted_total_bytes
            row[f"{name}.measured_rss_peak_bytes"] = p.measured_rss_peak_bytes
        row.update(
            {
                "failure_kind": r.failure_kind,
                "failure_phase": r.failure_phase,
                "failure_step": r.failure_step,
                "failure_worker": r.failure_worker,
                "failure_message": r.failure_message,
                "prune_reason": r.prune_reason,
                "memory_cap_bytes": r.memory_cap_bytes,
                "steps": r.steps,
                "steps_measured": " ".join(str(s) for s in r.steps_measured),
                "duration_s": r.duration_s,
                "gpu_kind": r.gpu_kind,
                "plan_gpu": r.plan_gpu,
                "device": r.device,
                "memory_source": r.memory_source,
            }
        )
        row.update({f"version.{k}": v for k, v in r.versions.items()})
        row["trial_dir"] = r.trial_dir
        rows.append(row)
    return pd.DataFrame(rows)


def _rel(measured: float | None, predicted: float | None) -> float | None:
    """measured / predicted − 1 (None when either is missing or the prediction is 0)."""
    if measured is None or predicted is None or predicted <= 0:
        return None
    return measured / predicted - 1.0
