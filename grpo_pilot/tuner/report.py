"""The sweep's outputs in DIR: `plan.json` (best measured), `trials.csv`, `report.png`, `calibration.json`.

- plan.json: the trial plan of the successful trial with the highest measured throughput (the
  planner's evaluation of its knobs, so `grpo-run plan.json` runs exactly what was measured);
- trials.csv: one row per counted trial (`records.trials_frame`), measured beside predicted;
- report.png (matplotlib, Agg): measured vs predicted throughput, phase times and phase peaks (log
  axes, the diagonal is a perfect prediction), and the Pareto front of measured throughput against
  measured peak memory, with failed and pruned trials at their predicted peak;
- calibration.json: the estimator's constants fitted from the measured trials (`tuner.calibrate`),
  which `grpo-plan --calibration` loads.
Every file is written atomically.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from pydantic import Field

from grpo_pilot.atomic import atomic_write_bytes, atomic_write_text
from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.planner.adapters import adapters_modelled
from grpo_pilot.planner.calibration import Calibration, save_calibration
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.plan import Plan, save_plan
from grpo_pilot.planner.recheck import plan_inputs
from grpo_pilot.tuner.calibrate import fit_calibration
from grpo_pilot.tuner.records import TrialRecord, trials_frame
from grpo_pilot.tuner.space import adapter_at

MIB = float(1 << 20)
CALIBRATION_FILE = "calibration.json"
PHASE_COLORS = {"rollout": "tab:blue", "log_prob": "tab:green", "update": "tab:red", "weight_sync": "tab:purple"}
FAILED_MARKERS = {"oom": "x", "worker_died": "X", "crash": "v", "timeout": "s", "pruned": "|"}


class Outputs(Frozen):
    """What the sweep wrote (None = not written, with the reason in `notes`)."""

    plan_path: str | None = None
    trials_csv: str | None = None
    report_png: str | None = None
    calibration_json: str | None = None
    best_trial: int | None = None
    notes: tuple[str, ...] = Field(default=())


def best_record(records: list[TrialRecord]) -> TrialRecord | None:
    ok = [r for r in records if r.status == "ok" and r.measured_tokens_per_s is not None]
    return max(ok, key=lambda r: (r.measured_tokens_per_s, -r.number)) if ok else None


def pareto_front(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """Non-dominated (peak bytes, tokens/s, trial) points: no other point has less or equal memory and
    more throughput (or equal throughput and less memory). Sorted by memory."""
    front: list[tuple[float, float, int]] = []
    best_rate = float("-inf")
    for mem, rate, number in sorted(points, key=lambda p: (p[0], -p[1], p[2])):
        if rate > best_rate:
            front.append((mem, rate, number))
            best_rate = rate
    return front


def best_plan(base: Plan, record: TrialRecord) -> Plan:
    """The planner's evaluation of the best trial's knobs and adapter (what its trial plan was)."""
    inputs = plan_inputs(base)
    adapter = adapter_at(base.workload.adapter, record.params)  # --sweep-adapter: the trial's rank and targets
    if adapter != inputs.workload.adapter:
        inputs = inputs.model_copy(update={"workload": inputs.workload.model_copy(update={"adapter": adapter})})
    return evaluate(inputs, record.knobs)


def write_calibration(
    out_dir: str | Path, base: Plan, records: list[TrialRecord], *, source: str = ""
) -> tuple[Path, Calibration]:
    """Fit the calibration from the measured records and write OUT/calibration.json atomically. Refused (InputError)
    for trials that trained adapters against plans predicting full fine-tuning: the fit would move the full fine-tune
    constants toward LoRA's cheaper update."""
    if base.workload.adapter is not None and not adapters_modelled(base):
        raise InputError(
            "the trials trained adapters, while the plans they are compared with predict full fine-tuning (grpo-plan "
            "does not model adapters yet).",
            "Calibrate from full fine-tuning trials.",
        )
    calibration = fit_calibration(plan_inputs(base), records, source=source)
    return save_calibration(calibration, Path(out_dir) / CALIBRATION_FILE), calibration


def write_outputs(out_dir: str | Path, base: Plan, records: list[TrialRecord], *, source: str = "") -> Outputs:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    frame = trials_frame(records)
    csv_path = atomic_write_text(out / "trials.csv", frame.to_csv(index=False))
    best = best_record(records)
    plan_path = None
    if best is not None:
        plan_path = str(save_plan(best_plan(base, best), out / "plan.json"))
    else:
        notes.append("plan.json not written: no trial has a measurement yet")
    calibration = None
    if best is not None:
        try:
            calibration = str(write_calibration(out, base, records, source=source)[0])
        except InputError as exc:  # e.g. the measured trials ran plans for another GPU than the base plan
            notes.append(f"calibration.json not written: {exc.paragraph()}")
    else:
        notes.append("calibration.json not written: no trial has a measurement yet")
    png = None
    try:
        png = str(atomic_write_bytes(out / "report.png", render_png(records)))
    except ImportError:
        notes.append("report.png not written: matplotlib is not installed (pip install 'grpo-pilot[plot]')")
    return Outputs(
        plan_path=plan_path,
        trials_csv=str(csv_path),
        report_png=png,
        calibration_json=calibration,
        best_trial=best.number if best else None,
        notes=tuple(notes),
    )


def _diagonal(ax: Any, values: list[float]) -> None:
    lo, hi = min(values), max(values)
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="measured = predicted")


def _versus(ax: Any, series: dict[str, tuple[str, list[tuple[float, float]]]], title: str, unit: str) -> None:
    """Predicted (x) against measured (y) on log axes, one colour per series; the diagonal is exact."""
    ax.set_title(title)
    values = [v for _, pairs in series.values() for pair in pairs for v in pair]
    if not values:
        ax.text(0.5, 0.5, "no measured trial", ha="center", va="center", transform=ax.transAxes)
        return
    for label, (color, pairs) in series.items():
        if pairs:
            ax.scatter([p for p, _ in pairs], [m for _, m in pairs], color=color, label=label, alpha=0.8, zorder=3)
    _diagonal(ax, values)
    ax.set(xscale="log", yscale="log", xlabel=f"predicted ({unit})", ylabel=f"measured ({unit})")
    ax.minorticks_off()  # minor labels (2x10^0, 3x10^0, ...) collide on short log ranges
    if max(values) < 100 * min(values):  # under two decades: ticks at 1-2-5, else an axis may show none
        from matplotlib.ticker import FuncFormatter, LogLocator

        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.legend(fontsize=8)


def _phase_pairs(
    ok: list[TrialRecord], phase: str, *, measured: str, predicted: str, scale: float
) -> list[tuple[float, float]]:
    pairs = []
    for r in ok:
        p = r.phases.get(phase)
        m, q = (getattr(p, measured), getattr(p, predicted)) if p else (None, None)
        if m and q:  # log axes: phases predicted at 0 (no pass) are left out
            pairs.append((q / scale, m / scale))
    return pairs


def _front_panel(ax: Any, ok: list[TrialRecord], failed: list[TrialRecord]) -> None:
    """Measured throughput against measured peak; the Pareto front; failures at their predicted peak."""
    points = [
        (float(r.measured_peak_bytes) / MIB, float(r.measured_tokens_per_s or 0), r.number)
        for r in ok
        if r.measured_peak_bytes
    ]
    ax.set(
        xlabel="peak tensor memory (MiB)", ylabel="measured tokens/s", title="Pareto front: throughput vs peak memory"
    )
    if points:
        ax.scatter(
            [p[0] for p in points], [p[1] for p in points], color="lightgrey", edgecolor="grey", label="measured"
        )
        front = pareto_front(points)
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="tab:red", label="Pareto front")
        ax.scatter([p[0] for p in front], [p[1] for p in front], color="tab:red", zorder=3)
        for mem, rate, number in front:
            ax.annotate(str(number), (mem, rate), fontsize=7, xytext=(3, 3), textcoords="offset points")
        top = max(front, key=lambda p: p[1])
        ax.scatter([top[0]], [top[1]], marker="*", s=250, color="gold", edgecolor="black", zorder=4, label="best")
    floor = min((p[1] for p in points), default=1.0) * 0.9
    for status, marker in FAILED_MARKERS.items():
        group = [r for r in failed if r.status == status]
        if group:
            xs = [r.predicted_peak_tensor_bytes / MIB for r in group]
            ax.scatter(xs, [floor] * len(group), marker=marker, color="black", label=f"{status} (at predicted peak)")
    if points or failed:
        ax.legend(fontsize=8)


def render_png(records: list[TrialRecord]) -> bytes:
    """The report figure as PNG bytes (raises ImportError without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.status == "ok" and r.measured_tokens_per_s]
    fig, ((ax_rate, ax_time), (ax_mem, ax_front)) = plt.subplots(2, 2, figsize=(13, 10))
    rates = [(r.predicted_tokens_per_s, float(r.measured_tokens_per_s or 0)) for r in ok]
    _versus(ax_rate, {"trials": ("tab:blue", rates)}, "throughput: measured vs predicted", "tokens/s")
    for r, (x, y) in zip(ok, rates):
        ax_rate.annotate(str(r.number), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    times = {
        ph: (c, _phase_pairs(ok, ph, measured="measured_s", predicted="predicted_s", scale=1.0))
        for ph, c in PHASE_COLORS.items()
    }
    _versus(ax_time, times, "phase time: measured vs predicted", "s")
    peaks = {
        ph: (c, _phase_pairs(ok, ph, measured="measured_peak_bytes", predicted="predicted_tensor_bytes", scale=MIB))
        for ph, c in PHASE_COLORS.items()
    }
    _versus(ax_mem, peaks, "phase peak tensor memory: measured vs predicted", "MiB")
    _front_panel(ax_front, ok, [r for r in records if r.status != "ok"])
    fig.suptitle(f"grpo-tune: {len(ok)} measured of {len(records)} trials")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
