"""Plans: the frozen `Plan` of one assessed configuration (`to_plan`, `evaluate`) or of a search
(`make_plan`, the library's `grpo-plan`).

The verbs: `estimate_memory` / `estimate_time` compute one configuration's numbers; `assess` (evaluate.py)
adds every rule's check (the search's inner loop); `to_plan` records an assessment as a `Plan` with its
worst case, verdict (verdict.py) and what the engine needs (execution.py); `evaluate` = assess + to_plan
for exactly the knobs given; `make_plan` searches the knobs first; `recheck` (recheck.py) re-assesses a
plan file before it runs.
"""

from __future__ import annotations

from typing import Any, Mapping

from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.constraints import binding_constraint, violations
from grpo_pilot.planner.evaluate import Assessment, PlanInputs, assess, worst_case_memory
from grpo_pilot.planner.execution import execution_of
from grpo_pilot.planner.lengths import MEMORY_QUANTILE
from grpo_pilot.planner.plan import Plan, Provenance
from grpo_pilot.planner.search import DEFAULT_TRIALS, search
from grpo_pilot.planner.suggest import suggest
from grpo_pilot.planner.support import require_supported
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.planner.verdict import verdict_of


def to_plan(
    inputs: PlanInputs, a: Assessment, *, provenance: Provenance | None = None, suggestions: tuple[str, ...] = ()
) -> Plan:
    """The frozen plan.json record of an assessment (with the worst case beside the expected peak). A job its
    target cannot run, or a launch family the planner does not model, is refused (support.py)."""
    require_supported(inputs.target, inputs.workload, a.knobs, model_is_moe=inputs.model.spec.is_moe)
    memory, time = a.memory, a.time
    worst = memory if inputs.workload.at_max_lengths else worst_case_memory(inputs, a.knobs)
    return Plan(
        fits=a.fits,
        knobs=a.knobs,
        peak_gpu_bytes=memory.peak_gpu_bytes,
        peak_tensor_bytes=memory.peak_tensor_bytes,
        usable_gpu_bytes=inputs.usable_gpu_bytes,
        predicted_step_s=time.step_s,
        phases=dict(memory.phases),
        phase_times_s=dict(time.phases_s),
        tokens_per_s=time.tokens_per_s,
        mfu=time.mfu,
        host=memory.host,
        host_ram_bytes_per_node=inputs.cluster.host_ram_bytes_per_node,
        kv_cache_tokens_per_gpu=memory.kv_cache_tokens_per_gpu,
        max_concurrent_seqs=memory.max_concurrent_seqs,
        binding_constraint=binding_constraint(a.checks, memory),
        violations=tuple(c.message for c in sorted(violations(a.checks), key=lambda c: -c.excess)),  # worst first
        suggestions=suggestions,
        model=inputs.model,
        cluster=inputs.cluster,
        workload=inputs.workload,
        target=inputs.target,
        provenance=provenance or inputs.provenance(),
        headroom_bytes=inputs.reserved_bytes,
        margin_bytes=inputs.usable_gpu_bytes - memory.peak_gpu_bytes,
        memory_quantile=None if inputs.workload.at_max_lengths else MEMORY_QUANTILE,
        worst_case_peak_gpu_bytes=worst.peak_gpu_bytes,
        worst_case_phase=worst.peak_phase,
        worst_case_phases={phase: pm.total_bytes for phase, pm in worst.phases.items()},
        verdict=verdict_of(inputs, a),
        execution=execution_of(
            inputs.model.spec,
            inputs.cluster,
            inputs.workload,
            a.knobs,
            executor=traits_for(inputs.target),
            overheads=inputs.overheads,
        ),
    )


def evaluate(inputs: PlanInputs, knobs: Knobs, *, provenance: Provenance | None = None) -> Plan:
    """Evaluate exactly this configuration (no search); refused first when the target cannot run it."""
    require_supported(inputs.target, inputs.workload, knobs, model_is_moe=inputs.model.spec.is_moe)
    return to_plan(inputs, assess(inputs, knobs), provenance=provenance)


def make_plan(
    inputs: PlanInputs, *, pins: Mapping[str, Any] | None = None, trials: int = DEFAULT_TRIALS, seed: int = 0
) -> Plan:
    """Search (or evaluate, when every searched knob is pinned) and build the plan.

    When nothing fits, the plan is the least infeasible configuration with `fits=False`, its
    violations, and suggestions computed by the estimator (more GPUs, offload, shorter responses).
    """
    pins = dict(pins or {})
    # refuse before searching: the pins and the workload alone decide what the target cannot run
    require_supported(inputs.target, inputs.workload, Knobs(**pins), model_is_moe=inputs.model.spec.is_moe)
    result = search(inputs, pins=pins, trials=trials, seed=seed)
    provenance = inputs.provenance(
        search_trials=result.trials,
        search_seed=result.seed,
        feasible_trials=result.feasible_trials,
        refine_evaluations=result.refine_evaluations,
    )
    suggestions = () if result.best.fits else suggest(inputs, result.best, pins)
    return to_plan(inputs, result.best, provenance=provenance, suggestions=suggestions)
