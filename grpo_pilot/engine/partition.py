"""How a step's work is split over workers: pure functions of counts and lengths.

    balance_by_tokens(lengths, k) -> [[index, ...] × k]    training ranks: equal tokens, not equal counts
    contiguous_chunks(count, k) -> [(start, stop) × k]      rollout replicas: equal rows, order kept
    replica_seed(seed, replica) -> int                      each replica samples with its own seed

Balancing (the longest-processing-time rule, as verl's `get_seqlen_balanced_partitions` aims for):
sequences in decreasing length (ties by index) each go to the rank holding the fewest tokens so far
(ties to the lowest rank); each rank's indices are returned in increasing order. A rank's time and
memory follow its tokens, so the slowest rank is at most one sequence above the average.
"""

from __future__ import annotations

from collections.abc import Sequence


def balance_by_tokens(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Indices of `lengths` in `k` groups of near-equal token sums (module docstring)."""
    if k < 1:
        raise ValueError(f"need at least one group, got {k}")
    groups: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        r = min(range(k), key=lambda g: (load[g], g))
        groups[r].append(i)
        load[r] += lengths[i]
    return [sorted(g) for g in groups]


def contiguous_chunks(count: int, k: int) -> list[tuple[int, int]]:
    """`k` consecutive [start, stop) ranges covering `count` items; sizes differ by at most one (first ones larger)."""
    if k < 1:
        raise ValueError(f"need at least one chunk, got {k}")
    base, extra = divmod(count, k)
    out, start = [], 0
    for r in range(k):
        stop = start + base + (1 if r < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def replica_seed(seed: int, replica: int) -> int:
    """Sampling seed of rollout replica `replica` for a step seed `seed` (replica 0 keeps it: N = 1 is unchanged)."""
    return (seed + 7_919 * replica) % (2**31 - 1)
