"""The CUDA caching allocator's reserve beyond the live tensors, per phase (pure functions).

`torch.cuda.max_memory_allocated` (the plan's tensor items) is not what nvidia-smi shows: the caching
allocator holds segments from the driver (`memory_reserved`) and keeps freed blocks cached until
`torch.cuda.empty_cache()`. What it holds beyond the live tensors at a phase's peak, by PyTorch's rules
(pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp @001074d2; the same rules in torch 2.9–2.13, whose size
constants moved to c10/core/AllocatorConfig.h):

- default allocator (fixed cudaMalloc segments):
  * stranded: a request takes the smallest cached free block that fits (`get_free_block`) and splits it
    when more than `kSmallSize` (1 MiB) is left (`should_split`). Between two micro-batches the largest
    transient block — the micro-batch's logits in the compute dtype, or the fused kernel's float32 chunk —
    lies freed in the cache, and smaller requests that find no smaller free block carve it; the next
    micro-batch's logits then no longer fit the remainder and get a new segment (`alloc_block`). At the
    phase's peak one such block is held beside the live tensors.
  * inherited: blocks freed by the phases that ran since the last `empty_cache()` stay cached
    (`release_cached_blocks` runs only on `empty_cache()` or a failed cudaMalloc, and frees only segments
    that are entirely free). The following phase's smaller requests carve the largest of them the same way
    (best fit finds no smaller free block for them), so at its peak the carved block is still held: a
    log-prob pass's logits segment stays reserved through the update when nothing empties the cache
    between them. The other cached blocks are reused: requests of the following phase fit them.
- expandable segments (`expandable_segments:True`, Note [Expandable Segments]): one virtual range per pool
  whose physical pages (`kLargeBuffer` = 20 MiB in the large pool, `kSmallBuffer` = 2 MiB in the small one)
  are mapped on demand; a free block followed by unmapped room counts as that large (`get_free_block`'s
  `expandable_size`), so a carved block grows instead of being stranded, and freed neighbours merge across
  what were separate segments. What stays beyond the live tensors is the partly used last page of each pool.
- either way, the reserve only shrinks at a release: a phase that follows a larger one without a release in
  between still holds that one's segments (reserved bytes are a high-water mark between releases).

`release_cache` says after which phases the rollout machinery empties the cache (engine/device_memory.py puts the
same policies into effect in grpo-run): `verl` after the update (before the weight sync), after the weight sync and
after the rollout (volcengine/verl@b178a3cd5 fsdp_workers.py `rollout_mode`, `generate_sequences`; the FSDP sharding
manager since 58840419 #1081, the Megatron one since dc8b5076 #2678); `before_sync_after_rollout` before the weight
sync and after the rollout only (verl 3fc3e2b7 #575 to #1081, verl v0.3.0: sharding_manager/fsdp_vllm.py@3fc3e2b7
`__enter__` empties the cache before `state_dict()` and not after loading the weights, `__exit__` after `sleep`);
`each_phase` after every phase of the actor (verl before 51a5ff99, #556: every ActorRolloutRefWorker method ended
with `torch.cuda.empty_cache()`); `after_rollout`; `never` (TRL: transformers' `torch_empty_cache_steps` defaults to
None, "cache will not be emptied", transformers 5.19 training_args.py). Beside the policy, the executor's workers
empty the cache after more phases (`also_released`, memory/releases.py): verl's FSDP actor and critic under their
param offload, verl's Megatron workers after every method. A PPO critic shares the actor's process and allocator
(verl fuses the roles of a GPU into one worker: memory/releases.py), so its phases inherit the actor's cached blocks
and the actor's update inherits theirs.

The replay of recorded allocation sequences (verify/allocator_sim.py, benchmarks/allocator_replay.py) runs the
allocator's rules allocation by allocation over the engine's own steps; docs/validation.md ("Device
footprint") puts both beside the H200 measurements. Known gap: an update of many small micro-batches strands
blocks of its own interleaved weight casts, activations and gradients that these terms do not count (3B,
64 one-sequence micro-batches: 7.6 GiB in the replay with a release after every phase).
"""

from __future__ import annotations

from grpo_pilot.planner.config import AllocatorSetting, ReleasePolicy
from grpo_pilot.planner.memory.rollout_engines import ENGINE_ITEM_NAMES
from grpo_pilot.planner.reports import OVERHEAD_PREFIX

RESERVE_ITEM = "overhead_allocator_reserve"
TRAINER_STATE_ITEM = "actor_params"  # every phase a training GPU reports has it (estimate.resident, megatron)

# pytorch c10/cuda/CUDACachingAllocator.cpp (c10/core/AllocatorConfig.h since torch 2.8)
MIN_BLOCK_BYTES = 512  # kMinBlockSize: every request is rounded up to a multiple of it
SMALL_SIZE_BYTES = 1 << 20  # kSmallSize: the largest small-pool request; a larger rest is split off
SMALL_BUFFER_BYTES = 2 << 20  # kSmallBuffer: small-pool segment, and the small pool's expandable page
MIN_LARGE_ALLOC_BYTES = 10 << 20  # kMinLargeAlloc: below it a large request gets a kLargeBuffer segment
LARGE_BUFFER_BYTES = 20 << 20  # kLargeBuffer: that segment, and the large pool's expandable page
ROUND_LARGE_BYTES = 2 << 20  # kRoundLarge: larger requests get their own segment rounded up to it

# one GRPO / PPO step in program order (cyclic: the next step's weight sync follows the update)
STEP_ORDER: tuple[str, ...] = ("weight_sync", "rollout", "log_prob", "values", "critic_update", "update")
# the phases after which each release policy empties the cache (module docstring); the critic's phases are released
# by the executor's workers only (memory/releases.py): verl's compute_values never ended with empty_cache()
ACTOR_PHASES = frozenset({"weight_sync", "rollout", "log_prob", "update"})
RELEASED_AFTER: dict[str, frozenset[str]] = {
    "verl": frozenset({"update", "weight_sync", "rollout"}),
    "before_sync_after_rollout": frozenset({"update", "rollout"}),
    "each_phase": ACTOR_PHASES,
    "after_rollout": frozenset({"rollout"}),
    "never": frozenset(),
}


def segment_bytes(nbytes: int) -> int:
    """`get_allocation_size`: the cudaMalloc a request of `nbytes` needs when no cached block fits."""
    size = max(MIN_BLOCK_BYTES, -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)
    if size <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if size < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def since_last_release(
    phase: str, present: tuple[str, ...], release_cache: ReleasePolicy, also_released: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """The phases (of `present`, in step order) that ran after the last cache release before `phase`;
    `also_released`: phases after which the executor empties the cache beside the policy."""
    order = [p for p in STEP_ORDER if p in present]
    if phase not in order:
        return ()
    released = RELEASED_AFTER[release_cache] | also_released
    i, out = order.index(phase), []
    for k in range(1, len(order)):
        before = order[(i - k) % len(order)]
        if before in released:
            break
        out.append(before)
    return tuple(reversed(out))


def stranded_bytes(allocator: AllocatorSetting, largest_block_bytes: int) -> int:
    """The carved copy of the phase's largest repeated transient block (module docstring)."""
    if allocator == "expandable" or largest_block_bytes <= 0:
        return 0
    return segment_bytes(largest_block_bytes)


def reserve_bytes(
    *,
    allocator: AllocatorSetting,
    release_cache: ReleasePolicy,
    transients: dict[str, int],
    largest_blocks: dict[str, int],
    also_released: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Bytes the caching allocator holds beyond the live tensors at each phase's peak (module docstring).

    `transients`: phase -> its transient tensor bytes at the peak (tensor items above the states resident
    throughout): a phase whose transients are smaller than its largest block did not run its passes;
    `largest_blocks`: phase -> its largest repeated transient block; `also_released`: see `since_last_release`."""
    present = tuple(transients)

    def since(phase: str) -> tuple[str, ...]:
        return since_last_release(phase, present, release_cache, also_released)

    def block(phase: str) -> int:
        size = largest_blocks.get(phase, 0)
        return stranded_bytes(allocator, size) if 0 < size <= transients[phase] else 0

    own = {}
    for phase in present:
        if allocator == "expandable":  # the partly used last page of each pool
            own[phase] = LARGE_BUFFER_BYTES + SMALL_BUFFER_BYTES
            continue
        inherited = max((block(p) for p in since(phase)), default=0)
        own[phase] = block(phase) + inherited
    # the reserve never shrinks between releases: a phase after a larger one still holds that one's segments
    return {
        phase: max([own[phase]] + [transients[p] + own[p] - transients[phase] for p in since(phase)])
        for phase in present
    }


def with_reserve(
    phases: dict[str, dict[str, int]],
    *,
    allocator: AllocatorSetting,
    release_cache: ReleasePolicy,
    largest_blocks: dict[str, int],
    also_released: frozenset[str] = frozenset(),
) -> dict[str, dict[str, int]]:
    """Every phase's items with `RESERVE_ITEM` added. A phase's transient bytes are its trainer tensor items
    (not the rollout engine's, which live in the engine's own pool) above what every phase holds — the
    states resident throughout; gradients freed by `zero_grad(set_to_none=True)` and states loaded back
    from the host are transient by that measure, as they are to the allocator."""
    trainer = {  # the phases a training GPU reports (split placement: the rollout GPU's phases are not)
        phase: sum(v for k, v in items.items() if not k.startswith(OVERHEAD_PREFIX) and k not in ENGINE_ITEM_NAMES)
        for phase, items in phases.items()
        if TRAINER_STATE_ITEM in items
    }
    floor = min(trainer.values(), default=0)
    transients = {phase: bytes_ - floor for phase, bytes_ in trainer.items()}
    reserve = reserve_bytes(
        allocator=allocator,
        release_cache=release_cache,
        transients=transients,
        largest_blocks=largest_blocks,
        also_released=also_released,
    )
    return {
        phase: {**items, RESERVE_ITEM: reserve[phase]} if phase in reserve else items for phase, items in phases.items()
    }
