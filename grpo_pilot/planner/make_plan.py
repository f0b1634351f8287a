"""`make_plan`: search the knobs for fixed inputs and return the frozen `Plan` (the library's `grpo-plan`)."""

from __future__ import annotations

from typing import Any, Mapping

from grpo_pilot.planner.evaluate import PlanInputs, to_plan
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.search import DEFAULT_TRIALS, search
from grpo_pilot.planner.suggest import suggest


def make_plan(
    inputs: PlanInputs, *, pins: Mapping[str, Any] | None = None, trials: int = DEFAULT_TRIALS, seed: int = 0
) -> Plan:
    """Search (or evaluate, when every searched knob is pinned) and build the plan.

    When nothing fits, the plan is the least infeasible configuration with `fits=False`, its
    violations, and suggestions computed by the estimator (more GPUs, offload, shorter responses).
    """
    pins = dict(pins or {})
    result = search(inputs, pins=pins, trials=trials, seed=seed)
    provenance = inputs.provenance(
        search_trials=result.trials,
        search_seed=result.seed,
        feasible_trials=result.feasible_trials,
        refine_evaluations=result.refine_evaluations,
    )
    suggestions = () if result.best.fits else suggest(inputs, result.best, pins)
    return to_plan(inputs, result.best, provenance=provenance, suggestions=suggestions)
