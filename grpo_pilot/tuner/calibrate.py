"""Fit a `Calibration` from measured trials: which constants the sweep determines, and their values.

Pure: `fit_calibration(inputs, records, ...)` takes the analytic planner inputs of the swept plan and
the study's `TrialRecord`s and returns the calibration; nothing here reads or writes files.

**Time.** Every phase the planner times (rollout, log_prob, update, weight_sync) is a function of the
`TimeCoefficients`; the fit re-evaluates `timing.estimate_time` at each trial's knobs and minimises
Σ ln²(predicted / measured seconds) over every (trial, phase) both sides time (measured ≥ 1 ms), in
log space of the candidates below, by Levenberg–Marquardt (Marquardt 1963, SIAM J. Appl. Math. 11(2);
Jacobian by forward differences). Candidates:

- `train_dispatch_s_per_layer_pass`: host op dispatch per layer pass of each training micro-batch
  (identified when the trials vary the number of micro-batches);
- `hbm_efficiency`: memory-bound traffic (decode weights/KV, activations, logits);
- `matmul_efficiency` of the plan's GPU (the MAMF entry);
- `hf_decode_s_per_layer`, `hf_decode_s_per_step`: the eager HF decode loop's host time per layer and
  per step (identified apart when the runs differ in layer count);
- `eager_launch_s_per_layer`: per-layer dispatch of each vLLM decode step without CUDA graphs;
- `link_efficiency`: collectives (only seen with more than one worker).

A sweep varies few things (the workload is fixed: the tokens per step never change), so some of these
move the predictions in the same proportion. Which ones the trials determine is decided by QR with
column pivoting on the Jacobian of ln(prediction) in ln(value) at the full fit (Golub & Van Loan,
*Matrix Computations*, 4th ed., §5.4.2, the standard subset selection for rank-deficient least squares):
the column with the largest part not explained by those already chosen is taken next while that part
is at least `MIN_SENSITIVITY` (RMS d ln T / d ln value) and `MIN_INDEPENDENCE` of its own size. The
rest are reset to their analytic defaults (recorded with the reason) and the chosen ones refitted.

**Memory.** On the cpu pseudo-device each phase's prediction is tensor bytes + `cpu_process_rss_bytes`
and the engine measures the process peak RSS per phase: the baseline is the median over (trial, phase)
of measured RSS − predicted tensor bytes. The tensor bytes themselves are not scaled: they are the
estimator's formulas, checked against traced bytes (`grpo-plan --verify`), never a fitted factor.
Fragmentation, CUDA context, NCCL and the vLLM constants stay analytic: the records hold allocated
tensor bytes (no allocator reserved bytes, no rollout-engine memory profile) from which they cannot be
separated.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timezone
from typing import Callable, NamedTuple

import numpy as np

from grpo_pilot.errors import InputError
from grpo_pilot.planner.calibration import Calibration, FitError, FittedValue, KeptValue
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.evaluate import PlanInputs
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads
from grpo_pilot.planner.rules import PLAN_PHASES
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS, TimeCoefficients
from grpo_pilot.planner.timing import estimate_time, trained_tokens_per_step
from grpo_pilot.tuner.records import TrialRecord

MIN_MEASURED_S = 1e-3  # below a millisecond the phase is timer noise and Python overhead
MIN_SENSITIVITY = 0.05  # RMS d ln(prediction) / d ln(value): a value moving predictions < 5 % per e-fold
MIN_INDEPENDENCE = 0.2  # share of a column not explained by the values already chosen
LOG_STEP = 1e-4  # forward-difference step in ln(value)
MAX_ITERATIONS = 100
# Bounds in ln(value): efficiencies in (1e-5, 1]; per-layer times between 0.1 µs and 10 s.
EFFICIENCY_BOUNDS = (math.log(1e-5), 0.0)
SECONDS_BOUNDS = (math.log(1e-7), math.log(10.0))
NOT_IN_RECORDS = {
    "memory.cuda_context_bytes": "not separable from tensor bytes in what the trials record",
    "memory.nccl_bytes_per_communicator": "not separable from tensor bytes in what the trials record",
    "memory.vllm_*": "the trials do not record the rollout engine's own memory profile (activation peak, "
    "sampler, CUDA graphs)",
}


class Candidate(NamedTuple):
    """A time coefficient the fit may determine."""

    name: str
    get: Callable[[TimeCoefficients], float]
    set: Callable[[TimeCoefficients, float], TimeCoefficients]
    bounds: tuple[float, float]


def _field(name: str, bounds: tuple[float, float]) -> Candidate:
    return Candidate(
        name,
        lambda c: float(getattr(c, name)),
        lambda c, v: c.model_copy(update={name: v}),
        bounds,
    )


def _matmul(gpu: str) -> Candidate:
    def put(c: TimeCoefficients, v: float) -> TimeCoefficients:
        table = dict(c.matmul_efficiency_by_gpu)
        table[gpu] = min(v, 1.0)
        return c.model_copy(update={"matmul_efficiency_by_gpu": tuple(sorted(table.items()))})

    return Candidate(f"matmul_efficiency_by_gpu[{gpu}]", lambda c: c.matmul_efficiency(gpu), put, EFFICIENCY_BOUNDS)


def candidates(gpu: str) -> tuple[Candidate, ...]:
    return (
        _field("train_dispatch_s_per_layer_pass", SECONDS_BOUNDS),
        _field("hbm_efficiency", EFFICIENCY_BOUNDS),
        _matmul(gpu),
        _field("hf_decode_s_per_layer", SECONDS_BOUNDS),
        _field("hf_decode_s_per_step", SECONDS_BOUNDS),
        _field("eager_launch_s_per_layer", SECONDS_BOUNDS),
        _field("link_efficiency", EFFICIENCY_BOUNDS),
    )


class Observation(NamedTuple):
    record: int  # index into the usable records
    phase: str
    measured_s: float


def usable(records: list[TrialRecord]) -> list[TrialRecord]:
    """Measured trials of one device kind, plan GPU and software stack (the latest trial's)."""
    ok = [r for r in records if r.status == "ok" and r.measured_tokens_per_s and r.measured_step_s]
    if not ok:
        return []
    last = max(ok, key=lambda r: r.number)
    return [r for r in ok if (r.gpu_kind, r.plan_gpu, r.versions) == (last.gpu_kind, last.plan_gpu, last.versions)]


def trial_workload(workload: Workload, record: TrialRecord) -> Workload:
    """The plan's workload at the mean lengths the trial's measured steps had (its maxima kept): the
    measured seconds were spent on those tokens, not on the plan's assumed lengths."""
    update: dict[str, float] = {}
    for field, mean, cap in (
        ("prompt_len_mean_tokens", record.measured_prompt_len_mean_tokens, workload.prompt_len_tokens),
        ("response_len_mean_tokens", record.measured_response_len_mean_tokens, workload.response_len_tokens),
    ):
        if mean is not None and mean > 0:
            update[field] = min(float(mean), float(cap))
    return Workload.model_validate({**workload.model_dump(), **update}) if update else workload


class Run(NamedTuple):
    """One measured run the time fit explains: the inputs it was planned from (analytic constants), the
    knobs and the workload it ran (its measured lengths), and the seconds each phase measured."""

    inputs: PlanInputs
    knobs: Knobs
    workload: Workload
    measured_s: dict[str, float | None]


class _Model:
    """The planner's time predictions of the runs as a function of the candidates' ln(values)."""

    def __init__(self, runs: list[Run], overheads: Overheads) -> None:
        self.runs, self.overheads = runs, overheads
        self.kv = [
            estimate_memory(
                r.inputs.model.spec, r.inputs.cluster, r.workload, r.knobs, target=r.inputs.target, overheads=overheads
            ).kv_cache_tokens_per_gpu
            for r in runs
        ]

    def phases(self, coef: TimeCoefficients) -> list[dict[str, float]]:
        return [
            dict(
                estimate_time(
                    r.inputs.model.spec,
                    r.inputs.cluster,
                    r.workload,
                    r.knobs,
                    target=r.inputs.target,
                    kv_cache_tokens_per_gpu=kv,
                    coefficients=coef,
                    overheads=self.overheads,
                ).phases_s
            )
            for r, kv in zip(self.runs, self.kv)
        ]

    def tokens_per_s(self, coef: TimeCoefficients) -> list[float]:
        return [
            trained_tokens_per_step(r.workload) / max(sum(p.values()), 1e-12)
            for r, p in zip(self.runs, self.phases(coef))
        ]


def trial_runs(inputs: PlanInputs, records: list[TrialRecord]) -> list[Run]:
    """The runs of a sweep's measured trials (every trial ran the swept plan's inputs)."""
    return [
        Run(
            inputs,
            r.knobs,
            trial_workload(inputs.workload, r),
            {phase: rec.measured_s for phase, rec in r.phases.items()},
        )
        for r in records
    ]


def _observations(runs: list[Run], analytic: list[dict[str, float]]) -> list[Observation]:
    out = []
    for index, (run, predicted) in enumerate(zip(runs, analytic)):
        for phase in PLAN_PHASES:
            measured = run.measured_s.get(phase)
            if measured is not None and measured >= MIN_MEASURED_S and predicted.get(phase, 0.0) > 0.0:
                out.append(Observation(index, phase, measured))
    return out


def _apply(base: TimeCoefficients, chosen: tuple[Candidate, ...], logs: np.ndarray) -> TimeCoefficients:
    coef = base
    for cand, value in zip(chosen, logs):
        coef = cand.set(coef, math.exp(float(value)))
    return coef


def _residuals(model: _Model, obs: list[Observation], coef: TimeCoefficients) -> np.ndarray:
    predicted = model.phases(coef)
    return np.array([math.log(max(predicted[o.record][o.phase], 1e-12) / o.measured_s) for o in obs])


def _jacobian(model: _Model, obs: list[Observation], *, base: TimeCoefficients, chosen, logs: np.ndarray) -> np.ndarray:
    r0 = _residuals(model, obs, _apply(base, chosen, logs))
    columns = []
    for k in range(len(chosen)):
        step = logs.copy()
        step[k] += LOG_STEP if step[k] + LOG_STEP <= chosen[k].bounds[1] else -LOG_STEP
        delta = step[k] - logs[k]
        columns.append((_residuals(model, obs, _apply(base, chosen, step)) - r0) / delta)
    return np.stack(columns, axis=1)


def _levenberg_marquardt(model: _Model, obs: list[Observation], base: TimeCoefficients, chosen) -> np.ndarray:
    """ln(values) of `chosen` minimising Σ residual², within their bounds."""
    logs = np.array([math.log(max(c.get(base), 1e-300)) for c in chosen])
    lo = np.array([c.bounds[0] for c in chosen])
    hi = np.array([c.bounds[1] for c in chosen])
    logs = np.clip(logs, lo, hi)
    loss = float(np.sum(_residuals(model, obs, _apply(base, chosen, logs)) ** 2))
    damping = 1e-2
    for _ in range(MAX_ITERATIONS):
        r = _residuals(model, obs, _apply(base, chosen, logs))
        J = _jacobian(model, obs, base=base, chosen=chosen, logs=logs)
        JtJ = J.T @ J
        system = JtJ + damping * (np.diag(np.diag(JtJ)) + 1e-9 * np.eye(len(chosen)))
        step = np.linalg.solve(system, -J.T @ r)
        trial = np.clip(logs + step, lo, hi)
        trial_loss = float(np.sum(_residuals(model, obs, _apply(base, chosen, trial)) ** 2))
        if trial_loss < loss:
            converged = loss - trial_loss < 1e-10 * max(loss, 1e-12) or float(np.max(np.abs(trial - logs))) < 1e-7
            logs, loss, damping = trial, trial_loss, max(damping / 3, 1e-9)
            if converged:
                break
        else:
            damping *= 4
            if damping > 1e9:
                break
    return logs


def _select(J: np.ndarray, names: list[str]) -> tuple[list[int], dict[int, str]]:
    """Column-pivoted Gram–Schmidt on J (rows: observations): the indices the data determine, and why
    each other one is not."""
    n = max(1, J.shape[0])
    remaining = list(range(J.shape[1]))
    basis: list[np.ndarray] = []
    picked: list[int] = []
    residual = {k: J[:, k].astype(float).copy() for k in remaining}
    while remaining:
        best = max(remaining, key=lambda k: float(np.linalg.norm(residual[k])))
        norm = float(np.linalg.norm(residual[best])) / math.sqrt(n)
        own = float(np.linalg.norm(J[:, best])) / math.sqrt(n)
        if norm < MIN_SENSITIVITY or norm < MIN_INDEPENDENCE * own:
            break
        picked.append(best)
        remaining.remove(best)
        unit = residual[best] / np.linalg.norm(residual[best])
        basis.append(unit)
        for k in remaining:
            residual[k] = residual[k] - unit * float(unit @ residual[k])
    reasons = {}
    chosen_names = ", ".join(names[k] for k in picked) or "nothing"
    for k in remaining:
        own = float(np.linalg.norm(J[:, k])) / math.sqrt(n)
        if own < MIN_SENSITIVITY:
            reasons[k] = f"the trials' predictions hardly depend on it (sensitivity {own:.3f} < {MIN_SENSITIVITY})"
        else:
            reasons[k] = f"moves the predictions in the same proportion as {chosen_names} in these trials"
    return picked, reasons


def _factor(log_errors: list[float]) -> float:
    """Geometric RMS factor exp(sqrt(mean(ln²))) (1.0 = exact)."""
    if not log_errors:
        return 1.0
    return math.exp(math.sqrt(sum(e * e for e in log_errors) / len(log_errors)))


def tokens_per_s_factor(model: _Model, measured_tokens_per_s: list[float], coef: TimeCoefficients) -> float:
    predicted = model.tokens_per_s(coef)
    return _factor([math.log(p / m) for p, m in zip(predicted, measured_tokens_per_s)])


def _rss_pairs(records: list[TrialRecord]) -> list[tuple[int, int]]:
    """(measured RSS, predicted tensor bytes) per (trial, phase) with an RSS measurement."""
    pairs = []
    for r in records:
        for phase in r.phases.values():
            if phase.measured_rss_peak_bytes and phase.predicted_tensor_bytes is not None:
                pairs.append((phase.measured_rss_peak_bytes, phase.predicted_tensor_bytes))
    return pairs


def _rss_factor(pairs: list[tuple[int, int]], baseline: int) -> float | None:
    if not pairs:
        return None
    return _factor([math.log((tensors + baseline) / measured) for measured, tensors in pairs])


def _fit_memory(inputs: PlanInputs, records: list[TrialRecord]):
    """(overheads, fitted values, rss error before, after) from the per-phase RSS of cpu trials."""
    pairs = [] if inputs.cluster.device.caching_allocator else _rss_pairs(records)
    base = DEFAULT_OVERHEADS
    if not pairs:
        return base, [], None, None
    baselines = sorted(measured - tensors for measured, tensors in pairs)
    mid = len(baselines) // 2
    median = baselines[mid] if len(baselines) % 2 else (baselines[mid - 1] + baselines[mid]) // 2
    mib = 1 << 20
    value = max(0, int(round(median / mib)) * mib)
    fitted = FittedValue(
        name="memory.cpu_process_rss_bytes",
        analytic=float(base.cpu_process_rss_bytes),
        fitted=float(value),
        sensitivity=math.sqrt(sum((value / (t + value)) ** 2 for _, t in pairs) / len(pairs)) if value else 0.0,
        method=f"median over {len(pairs)} (trial, phase) of measured peak RSS − predicted tensor bytes, to a MiB",
    )
    before = _rss_factor(pairs, base.cpu_process_rss_bytes)
    after = _rss_factor(pairs, value)
    return base.model_copy(update={"cpu_process_rss_bytes": value}), [fitted], before, after


def fit_time(
    model: _Model, obs: list[Observation], cands: tuple[Candidate, ...], base: TimeCoefficients
) -> tuple[TimeCoefficients, list[FittedValue], list[KeptValue]]:
    """The candidates the observations determine (column-pivoted selection), refitted, the rest kept."""
    names = [c.name for c in cands]
    if not obs:
        return (
            base,
            [],
            [KeptValue(name=f"time.{n}", reason="no phase time of at least 1 ms was measured") for n in names],
        )
    full = _levenberg_marquardt(model, obs, base, cands)
    J = _jacobian(model, obs, base=base, chosen=cands, logs=full)
    picked, reasons = _select(J, names)
    kept = [KeptValue(name=f"time.{names[k]}", reason=reasons[k]) for k in sorted(reasons)]
    chosen = tuple(cands[k] for k in picked)
    if not chosen:
        return base, [], kept
    logs = _levenberg_marquardt(model, obs, base, chosen)
    coef = _apply(base, chosen, logs)
    J = _jacobian(model, obs, base=base, chosen=chosen, logs=logs)
    fitted = [
        FittedValue(
            name=f"time.{cand.name}",
            analytic=cand.get(base),
            fitted=cand.get(coef),
            sensitivity=float(np.linalg.norm(J[:, k])) / math.sqrt(len(obs)),
            method=f"least squares of ln(predicted/measured seconds) over {len(obs)} (run, phase) times "
            "(Levenberg-Marquardt)",
        )
        for k, cand in enumerate(chosen)
    ]
    return coef, fitted, kept


def phase_error(model: _Model, obs: list[Observation], coef: TimeCoefficients) -> float:
    """Geometric RMS factor of the per-phase times under `coef` (1.0 without observations)."""
    return _factor(list(_residuals(model, obs, coef))) if obs else 1.0


def fit_calibration(
    inputs: PlanInputs,
    records: list[TrialRecord],
    *,
    name: str | None = None,
    source: str = "",
    created_at: datetime | None = None,
) -> Calibration:
    """The calibration the measured `records` determine for the plan inputs they were swept from.

    `inputs` are the swept plan's inputs with the analytic constants (they are replaced by the defaults
    if not). Raises `InputError` when no record has a measurement."""
    inputs = inputs.model_copy(
        update={"overheads": DEFAULT_OVERHEADS, "time_coefficients": DEFAULT_TIME_COEFFICIENTS, "calibration": None}
    )
    chosen_records = usable(records)
    if not chosen_records:
        raise InputError(
            f"No measured trial to calibrate from ({len(records)} trial(s), none with status ok).",
            "Run grpo-tune until at least one trial is measured, then calibrate.",
        )
    first = chosen_records[0]
    gpu = inputs.cluster.gpu.name
    if first.plan_gpu != gpu:
        raise InputError(
            f"The trials ran plans for {first.plan_gpu}, but the plan given is for {gpu}.",
            "Calibrate with the plan the sweep was run with.",
        )
    overheads, fitted, rss_before, rss_after = _fit_memory(inputs, chosen_records)
    base = DEFAULT_TIME_COEFFICIENTS
    model = _Model(trial_runs(inputs, chosen_records), overheads)
    obs = _observations(model.runs, model.phases(base))
    coef, fitted_time, kept = fit_time(model, obs, candidates(gpu), base)
    fitted += fitted_time
    kept += [KeptValue(name=k, reason=v) for k, v in NOT_IN_RECORDS.items()]
    if inputs.cluster.device.caching_allocator:
        kept.append(KeptValue(name="memory.host_rss_bytes_per_gpu_process", reason="GPU trials record no host RSS"))
    measured_tps = [float(r.measured_tokens_per_s or 0.0) for r in chosen_records]
    versions = Counter(tuple(sorted(r.versions.items())) for r in chosen_records).most_common(1)[0][0]
    when = (created_at or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    return Calibration(
        name=name or f"{first.gpu_kind} {when[:10]}",
        device_kind=first.gpu_kind,
        plan_gpu=gpu,
        versions=dict(versions),
        overheads=overheads,
        time_coefficients=coef,
        fitted=tuple(fitted),
        kept_analytic=tuple(kept),
        num_trials=len(chosen_records),
        num_observations=len(obs),
        fit_error=FitError(
            tokens_per_s_before=tokens_per_s_factor(model, measured_tps, base),
            tokens_per_s_after=tokens_per_s_factor(model, measured_tps, coef),
            phase_time_before=phase_error(model, obs, base),
            phase_time_after=phase_error(model, obs, coef),
            rss_before=rss_before,
            rss_after=rss_after,
        ),
        source=source,
        created_at=when,
    )


def prediction_factor(inputs: PlanInputs, records: list[TrialRecord], calibration: Calibration | None) -> float:
    """Geometric RMS factor between predicted and measured tokens/s of `records` (measured ones) under
    `calibration` (None: the analytic constants) — the check on held-back trials."""
    measured = [r for r in records if r.status == "ok" and r.measured_tokens_per_s]
    overheads = calibration.overheads if calibration else DEFAULT_OVERHEADS
    coef = calibration.time_coefficients if calibration else DEFAULT_TIME_COEFFICIENTS
    model = _Model(trial_runs(inputs, measured), overheads)
    return tokens_per_s_factor(model, [float(r.measured_tokens_per_s or 0.0) for r in measured], coef)
