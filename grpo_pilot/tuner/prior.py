"""What the planner tells the tuner before anything runs: trial plans, seeds, pruning, dead dimensions.

Every real trial is a plan the planner evaluated (`evaluate`), so each trial carries its prediction
beside its measurement. The planner's knowledge enters the sweep in three places:

- **seeds**: the input plan first, then the best predicted points of the space (one per distinct
  prediction) are enqueued, so the sweep starts where the analytic model says the optimum is and
  never does worse than the plan;
- **pruning**: a candidate whose predicted memory is far over the limit (`PRUNE_FACTOR`) is
  recorded as pruned without running. The prediction is first scaled by the sweep's own measured /
  predicted peak ratio (`memory_ratio`), so a planner that over- or under-counts on this machine
  prunes by what the runs showed, not by its raw estimate;
- **ranking**: candidates are ordered by predicted throughput; ties (the roofline does not model the
  fixed cost of each micro-batch: kernel launches, Python dispatch, per-micro-batch collectives)
  go to more sequences per micro-batch, then to the point closest to the input plan.
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from pydantic import Field

from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.evaluate import PlanInputs
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.reports import OVERHEAD_PREFIX
from grpo_pilot.tuner.space import TuneSpace, grid, inputs_at, knobs_at, params_of, point_key

# "Far over memory": more than 1.5x the limit after the sweep's own correction. The analytic model
# is within a few percent of traced bytes at real sizes (docs/validation.md), so 50% leaves room for
# what it cannot see (allocator behaviour, engine buffers) while skipping hopeless candidates.
PRUNE_FACTOR = 1.5
# Candidates the planner ranks exhaustively; larger spaces are ranked on a seeded sample this size
# (each evaluation is ~0.3 ms, so ranking stays near a second).
MAX_RANKED = 4096
CLIMB_STARTS = 3  # coordinate ascents from the best sampled points of a large space
SEED_PLANS = 3  # enqueued before the sampler: the input plan plus the best predicted points


class MemoryLimit(Frozen):
    """What a trial must fit: the plan's usable GPU memory, host RAM, and an optional tensor-byte cap."""

    usable_gpu_bytes: int = Field(gt=0, description="Device memory minus headroom (the plan's).")
    host_ram_bytes: int = Field(gt=0, description="Host RAM per node (the plan's).")
    tensor_cap_bytes: int | None = Field(
        default=None, gt=0, description="Run config memory_cap_bytes: live tensor bytes per worker the engine allows."
    )


def memory_limit(plan: Plan, tensor_cap_bytes: int | None = None) -> MemoryLimit:
    return MemoryLimit(
        usable_gpu_bytes=plan.usable_gpu_bytes,
        host_ram_bytes=plan.host_ram_bytes_per_node,
        tensor_cap_bytes=tensor_cap_bytes,
    )


def tensor_bytes(items: Mapping[str, int]) -> int:
    return sum(v for k, v in items.items() if not k.startswith(OVERHEAD_PREFIX))


def peak_tensor_bytes(plan: Plan) -> int:
    """The largest phase's tensor bytes (what a tensor tracker or max_memory_allocated measures)."""
    return max(tensor_bytes(p.items) for p in plan.phases.values())


def memory_ratio(pairs: list[tuple[int, int]]) -> float:
    """Median measured / predicted peak tensor bytes over (measured, predicted) pairs; 1.0 with none."""
    ratios = sorted(m / p for m, p in pairs if m > 0 and p > 0)
    if not ratios:
        return 1.0
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else 0.5 * (ratios[mid - 1] + ratios[mid])


def prune_reason(plan: Plan, limit: MemoryLimit, ratio: float = 1.0) -> str | None:
    """Why the planner says this candidate is far over memory, or None to run it.

    Per phase: predicted tensor bytes × `ratio` plus the phase's overhead items against usable GPU
    memory, and the scaled tensor bytes alone against the tensor cap; host RAM against the node's."""
    usable, cap = limit.usable_gpu_bytes, limit.tensor_cap_bytes
    host = plan.host.total_bytes
    checks = [(host / limit.host_ram_bytes, f"host RAM needs {_size(host)} of {_size(limit.host_ram_bytes)}")]
    for phase, mem in plan.phases.items():
        tensors = tensor_bytes(mem.items) * ratio
        need = tensors + mem.total_bytes - tensor_bytes(mem.items)
        checks.append((need / usable, f"{phase} needs {_size(need)} of {_size(usable)} usable"))
        if cap is not None:
            checks.append((tensors / cap, f"{phase} tensors {_size(tensors)} against the cap {_size(cap)}"))
    factor, text = max(checks, key=lambda c: c[0])
    if factor <= PRUNE_FACTOR:
        return None
    scaled = f" (prediction x{ratio:.2f}: this sweep's measured/predicted peak)" if ratio != 1.0 else ""
    return f"predicted {factor:.1f}x over memory: {text}{scaled}"


def _size(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def seqs_per_micro_batch(knobs: Knobs, seq_len_tokens: int) -> int:
    """Sequences in one update micro-batch (a token budget holds budget // full-length sequences)."""
    if knobs.max_token_len_per_gpu is not None:
        return max(1, knobs.max_token_len_per_gpu // seq_len_tokens)
    return knobs.micro_batch_size_per_gpu or 1


class Candidate(Frozen):
    """One point of the space with its prediction."""

    params: dict[str, Any]
    plan: Plan


def rank(space: TuneSpace, inputs: PlanInputs, limit: MemoryLimit, *, seed: int = 0) -> list[Candidate]:
    """Points of the space, best predicted first (fits, throughput, sequences per micro-batch, nearness
    to the input plan). Exhaustive up to `MAX_RANKED` points; a larger space is ranked on a seeded
    sample plus the input plan, then improved by coordinate ascent from the best sampled points (one
    dimension changed at a time, while the ranking key improves), so its top is not left to chance."""
    base = params_of(space, space.base) or {}
    seq = inputs.workload.seq_len_tokens
    scored: dict[tuple[tuple[str, Any], ...], tuple[tuple[Any, ...], Candidate]] = {}

    def score(params: dict[str, Any]) -> tuple[Any, ...]:
        key = point_key(params)
        if key not in scored:
            plan = evaluate(inputs_at(space, inputs, params), knobs_at(space, params))
            fits = plan.fits and _under_cap(plan, limit)
            distance = sum(1 for k, v in params.items() if base.get(k) != v)
            order = (not fits, -plan.tokens_per_s, -seqs_per_micro_batch(plan.knobs, seq), distance)
            scored[key] = (order, Candidate(params=params, plan=plan))
        return scored[key][0]

    exhaustive = space.size <= MAX_RANKED
    for params in grid(space) if exhaustive else _sample(space, seed):
        score(params)
    if not exhaustive:
        starts = sorted(scored.values(), key=lambda s: s[0])[:CLIMB_STARTS]
        for _, start in starts:
            _climb(space, dict(start.params), score)
    return [c for _, c in sorted(scored.values(), key=lambda s: s[0])]


def _climb(space: TuneSpace, point: dict[str, Any], score: Any) -> None:
    """Coordinate ascent: take the best single-dimension change until none improves the ranking key."""
    current = score(point)
    while True:
        moves = [{**point, name: v} for name, options in space.choices.items() for v in options if v != point[name]]
        best = min(moves, key=score, default=None)
        if best is None or score(best) >= current:
            return
        point, current = best, score(best)


def _under_cap(plan: Plan, limit: MemoryLimit) -> bool:
    return limit.tensor_cap_bytes is None or peak_tensor_bytes(plan) <= limit.tensor_cap_bytes


def _sample(space: TuneSpace, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    seen: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
    base = params_of(space, space.base)
    if base is not None:
        seen[point_key(base)] = base
    attempts = 0
    while len(seen) < MAX_RANKED and attempts < 20 * MAX_RANKED:
        attempts += 1
        point = {name: rng.choice(options) for name, options in space.choices.items()}
        seen.setdefault(point_key(point), point)
    return list(seen.values())


def prediction_signature(plan: Plan) -> tuple[Any, ...]:
    """What the planner can tell apart: the verdict, phase times, phase totals and host RAM; and the adapter rank and
    targets of an adapter sweep (trial plans that differ there are different runs even where the planner, which does
    not model adapters yet, predicts them alike)."""
    times = tuple(sorted(plan.phase_times_s.items()))
    memory = tuple(sorted((k, v.total_bytes) for k, v in plan.phases.items()))
    adapter = plan.workload.adapter
    lora = None if adapter is None else (adapter.rank, adapter.target_modules)
    return plan.fits, times, memory, plan.host.total_bytes, lora


def seed_points(space: TuneSpace, ranked: list[Candidate], k: int = SEED_PLANS) -> list[dict[str, Any]]:
    """The input plan's point, then the best ranked points with distinct predictions, `k` in all.

    Points the planner predicts identically (e.g. micro-batch 32 and a token budget of exactly 32
    sequences) would spend two seeds on what it considers one candidate: only the first is taken."""
    out: list[dict[str, Any]] = []
    seen_points: set[tuple[tuple[str, Any], ...]] = set()
    seen_predictions: set[tuple[Any, ...]] = set()
    base = params_of(space, space.base)
    by_point = {point_key(c.params): c for c in ranked}
    firsts = [by_point[point_key(base)]] if base is not None and point_key(base) in by_point else []
    for cand in firsts + list(ranked):
        if len(out) >= k:
            break
        key, signature = point_key(cand.params), prediction_signature(cand.plan)
        if key in seen_points or signature in seen_predictions:
            continue
        seen_points.add(key)
        seen_predictions.add(signature)
        out.append(cand.params)
    return out
