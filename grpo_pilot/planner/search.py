"""Knob search: Optuna over a discrete space, maximising predicted throughput under constraints.

Three separate pieces (DESIGN.md "Search, objective and storage are separate"):
- the space (`build_space`): one categorical dimension per free knob, choices pruned by the rules
  that do not depend on other knobs (TP and SP must divide the heads and stay within a node); knobs
  the user pinned are not dimensions; `update_batch` joins micro-batch and token budget
  ("micro:4" or "tokens:6144" — the latter is verl's dynamic batching);
- the objective (`objective_value`): predicted trained tokens per second of the whole cluster;
- the constraints (`constraints.py`): normalised excesses (worst GPU phase, host RAM, KV cache) go to
  `trial.set_constraint` (Optuna ≥ 5.0; feasible when ≤ 0) — infeasible is never a penalty score.
  Trials that break a structural rule are pruned before any memory estimate (cheap check).

The study is seeded (TPE, multivariate) and single-threaded, so the same inputs give the same plan.
verl's defaults (`Knobs()` plus pins) are enqueued first, so the result is never worse than them,
then a memory-frugal configuration (offloads, checkpointing, smallest batches) so that a feasible
corner is always tried; when nothing feasible was found, the frugal corners at every TP ×
utilisation are tried before giving up. The sampler explores; `refine` then climbs from the best
feasible trial with moves that exploit the model's structure (a shared knob changes, each phase's
own knobs are re-optimised for it), which closes the gap to the exhaustive grid's optimum.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Iterator, Mapping

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import KNOB_KEYS, Knobs
from grpo_pilot.planner.constraints import constraint_values, violations
from grpo_pilot.planner.evaluate import Assessment, PlanInputs, assess, cheap_checks
from grpo_pilot.planner.knob_space import (
    ANALYTIC_GRID,
    BOOL_KNOBS,
    UPDATE_BATCH,
    knob_choices,
    knobs_at_point,
    update_batch_value,
)
from grpo_pilot.planner.traits import traits_for

DEFAULT_TRIALS = 60  # sampler trials before the refinement; with it, `grpo-plan` stays well under 2 s wall
REFINE_STARTS = 1  # local searches from the best distinct feasible trials
REFINE_MAX_EVALUATIONS = 2500  # cap on configurations the refinement assesses (~0.2 ms each)
# Knobs that, given the shared ones (TP, SP, offloads, eager, fused), act on one phase only:
# group dimensions and the checks that judge them (utilisation also sizes what weight sync holds).
PHASE_GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "rollout": (("gpu_memory_utilization",), ("memory.rollout", "memory.weight_sync", "rollout.kv_cache")),
    "log_prob": (("log_prob_max_token_len_per_gpu",), ("memory.log_prob",)),
    "update": ((UPDATE_BATCH, "gradient_checkpointing"), ("memory.update",)),
}


class SearchSpace(Frozen):
    """Free dimensions (name → ordered choices) and the pinned knob values."""

    choices: dict[str, tuple[Any, ...]] = Field(
        description="Dimension name -> choices; knob names plus 'update_batch'."
    )
    pinned: dict[str, Any] = Field(default_factory=dict, description="Knob name -> value fixed by the user.")

    @property
    def size(self) -> int:
        n = 1
        for values in self.choices.values():
            n *= len(values)
        return n

    @property
    def empty(self) -> bool:
        return not self.choices


class SearchResult(Frozen):
    """The best assessment (or the least infeasible one when nothing fits) and the study's counts."""

    best: Assessment
    trials: int = Field(ge=0, description="Trials the study ran (0 = every searched knob pinned).")
    feasible_trials: int = Field(ge=0)
    refine_evaluations: int = Field(
        default=0, ge=0, description="Configurations the local refinement assessed after the study."
    )
    seed: int | None = None


def build_space(inputs: PlanInputs, pins: Mapping[str, Any] | None = None) -> SearchSpace:
    """The discrete space for these inputs, minus pinned knobs (`knob_space.knob_choices`, analytic grid).
    Knobs no rule searches (engine caps, the layout, the vLLM generation) keep `Knobs()` defaults unless
    pinned."""
    pins = dict(pins or {})
    unknown = sorted(set(pins) - set(KNOB_KEYS))
    if unknown:
        raise InputError(f"Unknown knob(s) {', '.join(unknown)}.", f"Knob keys: {', '.join(KNOB_KEYS)}.")
    choices = knob_choices(
        inputs.model.spec,
        inputs.cluster,
        inputs.workload,
        include=Knobs(**pins),
        executor=traits_for(inputs.target),
        grid=ANALYTIC_GRID,
        fixed=frozenset(pins),
    )
    return SearchSpace(choices=choices, pinned=pins)


def knobs_for(space: SearchSpace, params: Mapping[str, Any]) -> Knobs:
    """Knobs from a point of the space (pins and unsearched knobs keep their values)."""
    return knobs_at_point(space.pinned, params)


def params_for(space: SearchSpace, knobs: Knobs) -> dict[str, Any]:
    """The point of the space matching `knobs` (values not among the choices are left out)."""
    out: dict[str, Any] = {}
    for name, options in space.choices.items():
        value = update_batch_value(knobs) if name == UPDATE_BATCH else getattr(knobs, name)
        if value in options:
            out[name] = value
    return out


def _default_point(space: SearchSpace) -> dict[str, Any]:
    """The pinned/default knobs as a point of the space; a default outside a dimension's choices (verl's
    rollout TP 2 on one GPU) takes the first choice, so the report names the rule that really binds."""
    point = params_for(space, Knobs(**space.pinned))
    return {name: point.get(name, options[0]) for name, options in space.choices.items()}


def grid(space: SearchSpace) -> Iterator[dict[str, Any]]:
    """Every point of the space, in a fixed order (for the exhaustive benchmark)."""
    names = list(space.choices)
    for combo in itertools.product(*(space.choices[n] for n in names)):
        yield dict(zip(names, combo))


def frugal_knobs(space: SearchSpace) -> Knobs:
    """The least memory-hungry point: offloads and checkpointing on, smallest batches, largest TP."""
    params: dict[str, Any] = {}
    for name, options in space.choices.items():
        if name in BOOL_KNOBS:
            params[name] = True
        elif name == UPDATE_BATCH:
            params[name] = options[0]
        elif name in ("rollout_tp", "megatron_tp"):  # more sharding, less memory per GPU (TP within a node;
            params[name] = max(options)  # PP stays at its minimum so TP × PP still divides the GPUs)
        elif name == "megatron_recompute":
            params[name] = "full"
        elif name == "gpu_memory_utilization":
            params[name] = min(options, key=lambda u: abs(u - Knobs().gpu_memory_utilization))
        else:
            params[name] = min(options)
    return knobs_for(space, params)


def trial_constraints(a: Assessment) -> dict[str, float]:
    """The constraints Optuna sees (≤ 0 feasible): the worst GPU phase, host RAM and the KV cache.
    Structural rules never reach Optuna (those trials are pruned first); folding the four phases
    into their maximum keeps the sampler's per-trial bookkeeping small."""
    values = constraint_values(a.checks)
    return {
        "gpu_memory": max(v for k, v in values.items() if k.startswith("memory.")),
        "host_ram": values["host_ram"],
        "kv_cache": values["rollout.kv_cache"],
    }


def frugal_candidates(space: SearchSpace) -> Iterator[Knobs]:
    """`frugal_knobs` at every rollout TP of the space (largest first) × utilisation in steps of 0.1:
    the corners most likely to fit when little does."""
    base = frugal_knobs(space)
    tps = space.choices.get("rollout_tp", (base.rollout_tp,))
    utils = tuple(u for u in space.choices.get("gpu_memory_utilization", ()) if round(u * 10) == u * 10) or (
        base.gpu_memory_utilization,
    )
    for tp in sorted(tps, reverse=True):
        for util in utils:
            yield base.model_copy(update={"rollout_tp": tp, "gpu_memory_utilization": util})


def objective_value(a: Assessment) -> float:
    """What the search maximises: predicted trained tokens per second (whole cluster)."""
    return a.time.tokens_per_s


def better(a: Assessment, b: Assessment | None) -> bool:
    """Feasible beats infeasible; among feasible, higher throughput; among infeasible, smaller excess."""
    if b is None:
        return True
    if a.fits != b.fits:
        return a.fits
    if a.fits:
        return objective_value(a) > objective_value(b)
    return a.total_excess < b.total_excess


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def _chains(space: SearchSpace, dims: tuple[str, ...]) -> list[list[dict[str, Any]]]:
    """A phase group's points as chains, each ordered from most to least memory-hungry: one chain per
    mode (checkpointing on/off × micro-batch or token budget); the ordinal knob runs along it."""
    free = [d for d in dims if d in space.choices]
    modes: list[dict[str, Any]] = [{}]
    for d in free:
        if d in BOOL_KNOBS:
            modes = [{**m, d: v} for m in modes for v in space.choices[d]]
    ordinal = [d for d in free if d not in BOOL_KNOBS]
    if not ordinal:
        return [[m] for m in modes]
    name = ordinal[0]
    values = list(space.choices[name])
    if name == UPDATE_BATCH:
        kinds: dict[str, list[Any]] = {}
        for v in values:
            kinds.setdefault(v.split(":")[0], []).append(v)
        runs = [sorted(vs, key=lambda v: -int(v.split(":")[1])) for vs in kinds.values()]
    else:
        runs = [sorted(values, reverse=True)]
    return [[{**m, name: v} for v in run] for m in modes for run in runs]


def _single_changes(space: SearchSpace, names: list[str], point: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for name in names:
        for value in space.choices[name]:
            if value != point[name]:
                yield {name: value}


def _double_changes(space: SearchSpace, names: list[str], point: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for i, first in enumerate(names):
        for one in _single_changes(space, [first], point):
            for two in _single_changes(space, names[i + 1 :], point):
                yield {**one, **two}


def refine(
    inputs: PlanInputs, space: SearchSpace, starts: list[Assessment], max_evaluations: int = REFINE_MAX_EVALUATIONS
) -> tuple[Assessment, int]:
    """Deterministic local search from each feasible start.

    Knobs split into phase groups (`PHASE_GROUPS`: utilisation → rollout; log-prob budget →
    log_prob; micro-batch/token budget and checkpointing → update) and shared knobs (TP, SP,
    offloads, eager, fused). Given the shared knobs, each group only changes its own phase's time and
    memory, so it is re-optimised on its own: along each chain, the first point whose phase checks
    pass (the largest utilisation / budget that fits is the fastest), then the fastest chain winner.
    A move changes one shared knob (or, when no such move improves, two) and re-optimises every
    group; the best improving move is taken until none improves or the evaluation budget is spent.
    Every accepted point passes every check (a full assessment). TRL keeps the rollout engine's
    weights and KV cache resident, so for that target utilisation is also judged on log_prob and
    update memory. Returns the best assessment found and the number of configurations assessed."""
    cache: dict[tuple[tuple[str, Any], ...], Assessment | None] = {}

    def look(point: Mapping[str, Any]) -> Assessment | None:
        key = _key(point)
        if key not in cache:
            knobs = knobs_for(space, point)
            structural = cheap_checks(inputs, knobs)
            cache[key] = None if violations(structural) else assess(inputs, knobs, structural)
        return cache[key]

    def phase_ok(a: Assessment | None, rules: tuple[str, ...]) -> bool:
        return a is not None and all(c.ok for c in a.checks if c.rule in rules)

    groups = dict(PHASE_GROUPS)
    if traits_for(inputs.target).keeps_rollout_engine:  # rollout knobs also bound the training phases
        dims, rules = groups["rollout"]
        groups["rollout"] = (dims, rules + ("memory.log_prob", "memory.update"))

    def reoptimise(point: dict[str, Any]) -> dict[str, Any]:
        for phase, (dims, rules) in groups.items():
            winners = []
            for chain in _chains(space, dims):
                for step in chain:
                    a = look({**point, **step})
                    if phase_ok(a, rules):
                        winners.append((a.time.phases_s[phase], step))  # type: ignore[union-attr]
                        break
            if winners:
                point = {**point, **min(winners, key=lambda w: w[0])[1]}
        return point

    overall = max(starts, key=objective_value)
    shared = [d for d in space.choices if not any(d in dims for dims, _ in PHASE_GROUPS.values())]
    for start in starts:
        current = start
        first = look(reoptimise(params_for(space, start.knobs)))
        if first is not None and first.fits and objective_value(first) > objective_value(current):
            current = first
        while len(cache) < max_evaluations:
            point = params_for(space, current.knobs)
            move = None
            for changes in (_single_changes(space, shared, point), _double_changes(space, shared, point)):
                for change in changes:
                    if len(cache) >= max_evaluations:
                        break
                    a = look(reoptimise({**point, **change}))
                    if a is not None and a.fits and objective_value(a) > objective_value(move or current):
                        move = a
                if move is not None:
                    break
            if move is None:
                break
            current = move
        if objective_value(current) > objective_value(overall):
            overall = current
    return overall, len(cache)


def search(
    inputs: PlanInputs, *, pins: Mapping[str, Any] | None = None, trials: int = DEFAULT_TRIALS, seed: int = 0
) -> SearchResult:
    """Seeded Optuna study over `build_space`, then `refine` from its best feasible trials; with no
    free dimension, evaluates the pinned knobs."""
    space = build_space(inputs, pins)
    if space.empty:
        return SearchResult(best=assess(inputs, knobs_for(space, {})), trials=0, feasible_trials=0, seed=None)
    import optuna  # lazy: keeps `import grpo_pilot.planner` light

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    best: list[Assessment] = []
    feasible: list[Assessment] = []

    def objective(trial: "optuna.Trial") -> float:
        params = {name: trial.suggest_categorical(name, options) for name, options in space.choices.items()}
        knobs = knobs_for(space, params)
        structural = cheap_checks(inputs, knobs)
        broken = violations(structural)
        if broken:
            raise optuna.TrialPruned(broken[0].message)
        a = assess(inputs, knobs, structural)
        for name, value in trial_constraints(a).items():
            trial.set_constraint(name, value)
        if a.fits:
            feasible.append(a)
        if better(a, best[0] if best else None):
            best[:] = [a]
        return objective_value(a)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # multivariate TPE is flagged experimental
        sampler = optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=min(20, max(1, trials // 4))
        )
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.enqueue_trial(params_for(space, Knobs(**space.pinned)), skip_if_exists=True)
        study.enqueue_trial(params_for(space, frugal_knobs(space)), skip_if_exists=True)
        study.optimize(objective, n_trials=max(trials, 2), catch=())
        if not feasible:  # last resort: sweep the frugal corners before giving up
            seen = {_key(t.params) for t in study.get_trials(deepcopy=False)}
            fresh = [p for p in (params_for(space, k) for k in frugal_candidates(space)) if _key(p) not in seen]
            for point in fresh:
                study.enqueue_trial(point)
            if fresh:
                study.optimize(objective, n_trials=len(fresh), catch=())
    if not best:  # every trial broke a structural rule: report the pinned/default configuration
        best.append(assess(inputs, knobs_for(space, _default_point(space))))
    refined, evaluations = best[0], 0
    if feasible:
        starts = sorted(
            {_key(params_for(space, a.knobs)): a for a in feasible}.values(), key=objective_value, reverse=True
        )[:REFINE_STARTS]
        refined, evaluations = refine(inputs, space, starts)
    return SearchResult(
        best=refined, trials=len(study.trials), feasible_trials=len(feasible), refine_evaluations=evaluations, seed=seed
    )
