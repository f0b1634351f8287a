"""`grpo-plan --plot memory.png`: memory per phase as stacked bars by item, against usable memory.

`memory_bars(plan)` is the figure's data, pure and tested against the plan's numbers: one bar per phase
(rollout, log_prob, update, weight_sync), one segment per memory item (the plan's `phases[...].items`,
the same numbers the memory table prints), the usable memory as a line, and the worst case (every
prompt and response at its maximum) as a marker per phase, the phase that peaks in the worst case
named. `render_memory_png` draws it with matplotlib (the `plot` extra, imported only here, lazily: the
planner never imports it); `write_memory_plot` writes the PNG atomically.
"""

from __future__ import annotations

import io
from pathlib import Path

from pydantic import Field

from grpo_pilot.atomic import atomic_write_bytes
from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.rules import PHASE_ORDER

GIB = float(1 << 30)
MIB = float(1 << 20)


class MemoryBars(Frozen):
    """What the memory plot draws, in bytes."""

    phases: tuple[str, ...]
    items: tuple[str, ...] = Field(description="Stack order, bottom to top: tensors first, overhead_* last.")
    heights: dict[str, tuple[int, ...]] = Field(description="item -> bytes in each phase (0 where absent).")
    totals: tuple[int, ...] = Field(description="Each phase's total (the sum of its items).")
    usable_bytes: int
    worst_case: tuple[int, ...] | None = Field(default=None, description="Each phase's total at maximum lengths.")
    worst_case_phase: str | None = None
    peak_phase: str = Field(description="The phase with the largest expected total.")


def memory_bars(plan: Plan) -> MemoryBars:
    """The plot's data from the plan (pure)."""
    phases = tuple(p for p in PHASE_ORDER if p in plan.phases)
    names: list[str] = []
    for phase in phases:
        names += [n for n in plan.phases[phase].items if n not in names]  # type: ignore[index]
    order = sorted(names, key=lambda n: (n.startswith("overhead_"), names.index(n)))
    heights = {n: tuple(int(plan.phases[p].items.get(n, 0)) for p in phases) for n in order}  # type: ignore[index]
    items = tuple(n for n in order if any(heights[n]))
    totals = tuple(int(plan.phases[p].total_bytes) for p in phases)  # type: ignore[index]
    worst = plan.worst_case_phases
    return MemoryBars(
        phases=phases,
        items=items,
        heights={n: heights[n] for n in items},
        totals=totals,
        usable_bytes=plan.usable_gpu_bytes,
        worst_case=tuple(int(worst.get(p, 0)) for p in phases) if worst else None,  # type: ignore[call-overload]
        worst_case_phase=plan.worst_case_phase,
        peak_phase=phases[max(range(len(phases)), key=lambda i: totals[i])],
    )


def _unit(bars: MemoryBars) -> tuple[str, float]:
    top = max([bars.usable_bytes, *bars.totals, *(bars.worst_case or ())])
    return ("GiB", GIB) if top >= GIB else ("MiB", MIB)


def render_memory_png(plan: Plan) -> bytes:
    """The figure as PNG bytes (raises ImportError without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = memory_bars(plan)
    unit, scale = _unit(bars)
    xs = list(range(len(bars.phases)))
    fig, ax = plt.subplots(figsize=(10, 6))
    colors = plt.get_cmap("tab20")
    bottom = [0.0] * len(xs)
    for k, item in enumerate(bars.items):
        values = [h / scale for h in bars.heights[item]]
        hatch = "//" if item.startswith("overhead_") else None
        ax.bar(xs, values, bottom=bottom, color=colors(k % 20), edgecolor="white", hatch=hatch, label=item)
        bottom = [b + v for b, v in zip(bottom, values)]
    usable = bars.usable_bytes / scale
    ax.axhline(usable, color="black", linestyle="-", linewidth=1.5, label=f"usable ({usable:,.1f} {unit})")
    if bars.worst_case is not None:
        worst = [w / scale for w in bars.worst_case]
        label = "worst case (all at max)"
        ax.scatter(xs, worst, marker="_", s=900, linewidths=2.5, color="tab:red", zorder=4, label=label)
        if bars.worst_case_phase in bars.phases:
            i = bars.phases.index(bars.worst_case_phase)
            ax.annotate(
                f"worst case: {worst[i]:,.1f} {unit}",
                (xs[i], worst[i]),
                xytext=(0, 18),
                textcoords="offset points",
                ha="center",
                color="tab:red",
                fontsize=9,
            )
    peak = bars.phases.index(bars.peak_phase)
    ax.annotate(
        f"peak {bars.totals[peak] / scale:,.1f} {unit}",
        (xs[peak], bars.totals[peak] / scale),
        xytext=(0, 4),
        textcoords="offset points",
        ha="center",
        fontsize=9,
        fontweight="bold",
    )
    top = max([bars.usable_bytes, *bars.totals, *(bars.worst_case or ())]) / scale
    ax.set_ylim(0, top * 1.15)  # room for the labels above the highest bar or line
    ax.set_xticks(xs, list(bars.phases))
    ax.set_ylabel(f"memory per {'process' if plan.cluster.gpu.is_cpu else 'GPU'} ({unit})")
    verdict = "fits" if plan.fits else "does not fit"
    ax.set_title(f"{plan.model.resolved} on {plan.cluster.label()}: memory by phase ({verdict})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_memory_plot(plan: Plan, path: str | Path) -> Path:
    """Write the memory plot atomically; without matplotlib an `InputError` says how to install it."""
    try:
        data = render_memory_png(plan)
    except ImportError:
        raise InputError(
            "--plot needs matplotlib, which is not installed.", "pip install 'grpo-pilot[plot]' (or drop --plot)."
        ) from None
    try:
        return atomic_write_bytes(path, data)
    except OSError as exc:
        raise InputError(f"Cannot write the plot to '{path}' ({exc}).", "Check the path.") from None
