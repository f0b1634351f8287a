"""`grpo-plan --compare`: two plans of the same model, cluster and workload, side by side per phase."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.rules import phases_present
from grpo_pilot.units import GiB

CRITIC_ITEMS = ("critic_params", "critic_grads", "critic_optimizer_states", "reward_model_params")
# the model states of a plan, by owner: the largest each item reaches in any phase (on the GPU)
STATE_GROUPS = {
    "actor": ("actor_params", "actor_grads", "optimizer_master_params", "optimizer_states", "frozen_base"),
    "reference": ("ref_params",),
    "critic": CRITIC_ITEMS,
}


def _gib(n: int | float) -> str:
    return f"{n / GiB:.2f}"


def _name(plan: Plan) -> str:
    return plan.workload.algorithm.upper()


def render_compare(a: Plan, b: Plan, console: Console) -> None:
    """Memory and time of every phase of plans `a` and `b`, the step, and what the critic adds per GPU."""
    na, nb = _name(a), _name(b)
    table = Table(title=f"{na} beside {nb} ({a.model.resolved}, {a.cluster.label()}, target {a.target})")
    for col in ("phase", f"{na} GiB", f"{nb} GiB", f"{na} s", f"{nb} s"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for phase in phases_present(set(a.phases) | set(b.phases)):
        cells = []
        for plan in (a, b):
            pm = plan.phases.get(phase)
            cells.append(_gib(pm.total_bytes) if pm is not None else "—")
        for plan in (a, b):
            t = plan.phase_times_s.get(phase)
            cells.append(f"{t:,.1f}" if t is not None else "—")
        table.add_row(phase, *cells)
    table.add_section()
    table.add_row(
        "peak / step",
        _gib(a.peak_gpu_bytes),
        _gib(b.peak_gpu_bytes),
        f"{a.predicted_step_s:,.1f}",
        f"{b.predicted_step_s:,.1f}",
    )
    table.add_row("fits", str(a.fits), str(b.fits), "", "")
    console.print(table)
    for plan in (a, b):
        largest = {
            group: sum(max(pm.items.get(item, 0) for pm in plan.phases.values()) for item in items)
            for group, items in STATE_GROUPS.items()
        }
        held = ", ".join(f"{group} {_gib(v)}" for group, v in largest.items() if v)
        console.print(f"{_name(plan)} model states per GPU at their largest (GiB): {held}")
        peak = plan.phases[max(plan.phases, key=lambda p: plan.phases[p].total_bytes)]
        held = {k: peak.items[k] for k in CRITIC_ITEMS if peak.items.get(k)}
        if held:
            parts = ", ".join(f"{k} {_gib(v)}" for k, v in held.items())
            critic_s = plan.phase_times_s.get("values", 0.0) + plan.phase_times_s.get("critic_update", 0.0)
            console.print(
                f"{_name(plan)}: at its peak the critic holds {parts} GiB per GPU; its phases values and "
                f"critic_update take {critic_s:,.1f} s of the {plan.predicted_step_s:,.1f} s step"
            )
    console.print(
        f"{nb} − {na}: peak {_gib(b.peak_gpu_bytes - a.peak_gpu_bytes)} GiB per GPU, "
        f"step {b.predicted_step_s - a.predicted_step_s:+,.1f} s (each plan's knobs searched on its own)"
    )
