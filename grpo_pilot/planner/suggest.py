"""What would make an infeasible request fit — every suggestion computed with the estimator.

When nothing fits (or a pinned configuration does not), `suggest(inputs, assessment, pins)` returns
short sentences, in this order:
0. for a TRL launch with replicated states (DDP, ZeRO-1/2), sharding them (FSDP / ZeRO-3), if that alone fits;
1. turning on every offload for the configuration that failed, if that alone fits;
2. the host RAM per node that would let a frugal configuration fit, when host RAM is what binds;
3. the fewest GPUs of the same type that fit (same GPUs per node; more nodes), with the most
   memory-frugal settings of the search space — only layouts whose GPU count divides prompts per
   step × n (the binding rule batch.divisible_by_world); when no larger layout does, it says so and
   names the --prompts-per-step that would let more GPUs help;
4. the longest response (binary search on `response_len_tokens`) that fits on this cluster;
5. when none of these applies because a frugal configuration already fits this cluster as the request stands,
   the knobs it changes (`_other_knobs`).
When none applies, the one sentence says only what was checked and found not to fit (`_nothing_found`).
A candidate "fits" when any of a small set of frugal configurations passes every check: offloads
and checkpointing on, smallest batches and token budgets, each rollout TP of the space ×
gpu_memory_utilization in steps of 0.1 (`search.frugal_candidates`); knobs the user pinned stay
pinned (except the offloads, which suggestion 1 is about). Suggestions 3 and 4 are only made when
the frugal configurations do not already fit as the request stands.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.hardware.gpus import GiB
from grpo_pilot.planner.config import Workload
from grpo_pilot.planner.constraints import violations
from grpo_pilot.planner.evaluate import Assessment, PlanInputs, assess, cheap_checks, largest_fitting
from grpo_pilot.planner.lengths import std_bound
from grpo_pilot.planner.ref_offload import ref_offloaded
from grpo_pilot.planner.search import build_space, frugal_candidates
from grpo_pilot.planner.traits import traits_for

UNLIMITED_HOST_RAM_BYTES = 1 << 50  # 1 PiB: "as much host RAM as it takes" for the host-RAM suggestion
MAX_NODES = 64  # largest cluster the GPU-count suggestion considers (nodes of the user's size)
OFFLOADS: tuple[str, ...] = ("param_offload", "optimizer_offload", "ref_param_offload")


def first_fit(inputs: PlanInputs, pins: Mapping[str, Any]) -> Assessment | None:
    """The first frugal configuration that fits these inputs, or None."""
    for knobs in frugal_candidates(build_space(inputs, pins)):
        structural = cheap_checks(inputs, knobs)
        if violations(structural):
            continue
        a = assess(inputs, knobs, structural)
        if a.fits:
            return a
    return None


def _with_sharding(inputs: PlanInputs, failed: Assessment) -> str | None:
    """A TRL launch whose states are replicated (DDP, DeepSpeed ZeRO-1/2: memory/zero.py): sharding every state
    (FSDP or ZeRO-3) with the same knobs, if that alone fits."""
    if failed.knobs.state_sharding == "full":
        return None
    a = assess(inputs, failed.knobs.model_copy(update={"state_sharding": "full"}))
    if not a.fits:
        return None
    peak, usable = a.memory.peak_gpu_bytes / GiB, inputs.usable_gpu_bytes / GiB
    return (
        f"sharding every model state instead of {failed.knobs.state_sharding} fits: peak {peak:.1f} GiB of "
        f"{usable:.1f} GiB usable (an accelerate FSDP or DeepSpeed ZeRO-3 config: --override fsdp=full_shard or "
        "--override deepspeed=zero3)."
    )


def _with_offloads(inputs: PlanInputs, failed: Assessment) -> str | None:
    knobs = failed.knobs
    # no reference key to suggest without a reference, or where the executor offloads it anyway (verl's FSDP
    # reference since #121: planner/ref_offload.py)
    ref_movable = inputs.workload.use_kl_loss and not ref_offloaded(knobs, traits_for(inputs.target))
    off = [k for k in OFFLOADS if not getattr(knobs, k) and (k != "ref_param_offload" or ref_movable)]
    if not off:
        return None
    a = assess(inputs, knobs.model_copy(update={k: True for k in off}))
    if not a.fits:
        return None
    pins = " ".join(f"--pin {k}=true" for k in off)
    peak, usable = a.memory.peak_gpu_bytes / GiB, inputs.usable_gpu_bytes / GiB
    return f"turning on {', '.join(off)} fits: peak {peak:.1f} GiB of {usable:.1f} GiB usable ({pins})."


def _cluster_sizes(cluster: Cluster) -> Iterator[tuple[int, int]]:
    """(nodes, gpus per node) larger than the current cluster, smallest first."""
    current = cluster.world_size
    if cluster.num_nodes == 1:
        for per_node in (1, 2, 4, 8):
            if current < per_node <= max(cluster.gpus_per_node, 8):
                yield 1, per_node
    per_node = max(cluster.gpus_per_node, 8) if cluster.num_nodes == 1 else cluster.gpus_per_node
    for nodes in range(2, MAX_NODES + 1):
        if nodes * per_node > current:
            yield nodes, per_node


def _fewest_gpus(inputs: PlanInputs, pins: Mapping[str, Any]) -> str | None:
    if not inputs.cluster.device.offload_meaningful or first_fit(inputs, pins) is not None:
        return None
    layouts = list(_cluster_sizes(inputs.cluster))
    if not layouts:  # already MAX_NODES nodes or more: no larger cluster is considered
        return None
    divisible = 0
    for nodes, per_node in layouts:
        bigger = inputs.cluster.model_copy(update={"num_nodes": nodes, "gpus_per_node": per_node})
        candidate = inputs.model_copy(update={"cluster": bigger})
        if inputs.workload.responses_per_step % bigger.world_size:
            continue  # the binding rule batch.divisible_by_world (verl validate_config) rules this layout out
        divisible += 1
        if first_fit(candidate, pins) is not None:
            label = bigger.label()
            return f"fewest {inputs.cluster.gpu.name} GPUs that fit: {bigger.world_size} ({label}; try --gpus {label})."
    return None if divisible else _indivisible(inputs, [nodes * per_node for nodes, per_node in layouts])


def _indivisible(inputs: PlanInputs, worlds: list[int]) -> str:
    """No larger layout (`worlds`: their GPU counts) divides the responses per step: more GPUs cannot help until
    prompts per step × n does (batch.divisible_by_world). Names the next --prompts-per-step that one divides (a
    multiple of the smallest world lies within that many prompts, so the search is short)."""
    w, per_node = inputs.workload, max(inputs.cluster.gpus_per_node, 8)
    prompts, world = next(
        (p, world)
        for p in range(w.prompts_per_step + 1, w.prompts_per_step + min(worlds) + 1)
        for world in sorted(worlds)
        if p * w.n % world == 0
    )
    return (
        f"more GPUs cannot help as the job stands: prompts per step × n = {w.responses_per_step} is divisible by "
        f"none of the larger layouts of {per_node}-GPU nodes (every GPU needs an equal share); with "
        f"--prompts-per-step {prompts} ({prompts * w.n} responses) {world} GPUs divide it, and more nodes can be "
        "tried."
    )


def _host_ram_needed(inputs: PlanInputs, pins: Mapping[str, Any]) -> str | None:
    """When host RAM binds: the host RAM per node the first frugal configuration needs."""
    roomy = inputs.cluster.model_copy(update={"host_ram_bytes_per_node": UNLIMITED_HOST_RAM_BYTES})
    a = first_fit(inputs.model_copy(update={"cluster": roomy}), pins)
    if a is None or a.memory.host.total_bytes <= inputs.cluster.host_ram_bytes_per_node:
        return None
    need_gib = -(-a.memory.host.total_bytes // GiB)
    return f"with {need_gib} GiB of host RAM per node it fits on {inputs.cluster.label()} (--host-ram {need_gib}GiB)."


def capped_response(w: Workload, cap: int) -> Workload:
    """The same job with responses truncated at `cap` tokens.

    Truncation min(R, cap) never raises the mean above min(μ, cap) and never raises the standard
    deviation (x ↦ min(x, cap) is 1-Lipschitz), so these statistics stay upper bounds; the tail is capped.
    """
    update: dict[str, Any] = {"response_len_tokens": cap}
    if w.response_len_mean_tokens is not None:
        update["response_len_mean_tokens"] = min(w.response_len_mean_tokens, cap)
    if w.response_len_std_tokens is not None:
        mean = update.get("response_len_mean_tokens", cap)
        update["response_len_std_tokens"] = min(w.response_len_std_tokens, std_bound(mean, cap))
    if w.response_tail_tokens is not None:
        update["response_tail_tokens"] = min(w.response_tail_tokens, cap)
    return Workload(**{**w.model_dump(), **update})


def _longest_response(inputs: PlanInputs, pins: Mapping[str, Any]) -> str | None:
    w = inputs.workload

    def fits(length: int) -> bool:
        shorter = capped_response(w, length)
        return first_fit(inputs.model_copy(update={"workload": shorter}), pins) is not None

    lo, hi = 0, w.response_len_tokens - 1  # lo: longest known to fit (0 = none yet)
    if hi < 1 or fits(w.response_len_tokens) or not fits(1):
        return None
    lo = largest_fitting(fits, 1, hi)
    return f"responses of up to {lo} tokens fit on {inputs.cluster.label()} (--response-len {lo})."


def suggest(
    inputs: PlanInputs,
    failed: Assessment,
    pins: Mapping[str, Any] | None = None,
    *,
    kept: Mapping[str, Any] | None = None,
) -> tuple[str, ...]:
    """Suggestions for a configuration that does not fit (see module docstring). `kept`: a launch's knobs that no
    search moves (its launcher, load dtype, era behaviour, engine caps), held in every candidate and never
    suggested away — unlike `pins`."""
    pins, kept = dict(pins or {}), dict(kept or {})
    free = {**kept, **{k: v for k, v in pins.items() if k not in OFFLOADS}}
    found = [
        _with_sharding(inputs, failed),
        _with_offloads(inputs, failed),
        _host_ram_needed(inputs, free),
        _fewest_gpus(inputs, free),
        _longest_response(inputs, free),
    ]
    out = tuple(s for s in found if s)
    if not out:  # the frugal configurations already fit as the request stands (suggestions 3-4 are moot)
        other = _other_knobs(inputs, failed, free)
        out = (other,) if other else ()
    if not out and pins:  # the pins themselves may be what cannot fit: say what would fit without them
        unpinned = [_host_ram_needed(inputs, kept), _fewest_gpus(inputs, kept), _longest_response(inputs, kept)]
        out = tuple(f"without the pinned knobs, {s}" for s in unpinned if s)
        if not out and first_fit(inputs, kept) is not None:
            out = ("without the pinned knobs it fits on this cluster: drop the --pin flags and let the search choose.",)
    return out or (_nothing_found(inputs, free),)


def _other_knobs(inputs: PlanInputs, failed: Assessment, pins: Mapping[str, Any]) -> str | None:
    """When a frugal configuration fits this cluster at these lengths (the request's own knobs do not), the knobs
    it changes from the failed configuration — so no "nothing found" is said of a job other knobs fit."""
    a = first_fit(inputs, pins)
    if a is None:
        return None
    before, after = failed.knobs.model_dump(), a.knobs.model_dump()
    changed = [f"{k}={after[k]}" for k in after if after[k] != before.get(k)]
    if not changed:
        return None
    peak, usable = a.memory.peak_gpu_bytes / GiB, inputs.usable_gpu_bytes / GiB
    return (
        f"other knobs fit on {inputs.cluster.label()}: the most memory-frugal ones peak at {peak:.1f} of "
        f"{usable:.1f} GiB usable ({', '.join(changed)}); a search picks the fastest that fits."
    )


def _nothing_found(inputs: PlanInputs, pins: Mapping[str, Any]) -> str:
    """What the searches above established when none of them found a fit — only what was checked."""
    checked = []
    bigger = any(_cluster_sizes(inputs.cluster))  # none past MAX_NODES nodes: no larger cluster was checked
    if inputs.cluster.device.offload_meaningful and bigger and first_fit(inputs, pins) is None:
        checked.append(f"no cluster of up to {MAX_NODES} nodes of {inputs.cluster.gpu.name} whose GPU count divides "
                       "the batch fits")  # fmt: skip
    w = inputs.workload
    shortest = inputs.model_copy(update={"workload": capped_response(w, 1)})
    if w.response_len_tokens > 1 and first_fit(shortest, pins) is None:
        checked.append("not even 1-token responses fit")
    if not checked:
        return "no change of offloads, host RAM, GPU count or response length found to fit; see the violations."
    return "; ".join(checked) + ": use a GPU with more memory or a smaller model."
