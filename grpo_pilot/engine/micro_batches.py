"""Which sequences go into which micro-batch: token budgets, fixed sizes, and padding-aware cuts.

    plan_micro_batches(lengths, max_tokens=, max_seqs=, padded=, split_padding=) -> [[index, ...], ...]
    split_by_padding(indices, lengths) -> [[index, ...], ...]

Pure functions of sequence lengths (tokens); the actor (engine/actor.py) decides the layout —
"packed" rows (flash-attention varlen) or "padded" rows (SDPA) — and feeds each group to one
forward/backward.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_micro_batches(
    lengths: Sequence[int],
    *,
    max_tokens: int | None = None,
    max_seqs: int | None = None,
    padded: bool = False,
    split_padding: bool = False,
) -> list[list[int]]:
    """Indices of `lengths` grouped into micro-batches.

    Packed (`padded=False`): with `max_tokens`, first-fit decreasing by length (ties by index), each
    bin ≤ `max_tokens` tokens, bins in creation order (longest first); else `max_seqs` consecutive
    indices per bin (all of them when None).
    Padded (`padded=True`): indices sorted by length, longest first (ties by index); with
    `max_tokens` a bin takes the next sequence while (sequences + 1) × its first (longest) length ≤
    `max_tokens`, so the padded rectangle fits the budget; else `max_seqs` per bin. With
    `split_padding` each bin is then cut further by `split_by_padding` (never a larger bin).
    A sequence longer than `max_tokens` raises ValueError.
    """
    if max_tokens is not None:
        too_long = [n for n in lengths if n > max_tokens]
        if too_long:
            raise ValueError(f"sequence of {too_long[0]} tokens exceeds the micro-batch token budget {max_tokens}")
    if padded:
        order = sorted(range(len(lengths)), key=lambda k: (-lengths[k], k))
        padded_bins: list[list[int]] = []
        if max_tokens is None:
            step = max_seqs or max(1, len(order))
            padded_bins = [order[i : i + step] for i in range(0, len(order), step)]
        else:
            for i in order:
                if padded_bins and (len(padded_bins[-1]) + 1) * lengths[padded_bins[-1][0]] <= max_tokens:
                    padded_bins[-1].append(i)
                else:
                    padded_bins.append([i])
        if not split_padding:
            return padded_bins
        return [part for b in padded_bins for part in split_by_padding(b, lengths)]
    if max_tokens is None:
        step = max_seqs or max(1, len(lengths))
        return [list(range(i, min(i + step, len(lengths)))) for i in range(0, len(lengths), step)]
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(max_tokens - lengths[i])
    return bins


MAX_SPLIT_POINTS = 256  # candidate cut points of `split_by_padding` (bounds its O(points²) search)
# Fixed cost of one more forward/backward, in average rows: measured on benchmarks/engine_cpu.py's
# model (32 rows of 42 tokens: one call 46 ms, two 47 ms, four 54 ms, eight 70 ms, i.e. 1–3 ms or
# ~1–2.5 rows of 1.5 ms per extra call); 2 rows also keeps GPU micro-batches from being cut for
# marginal padding savings.
SPLIT_CHARGE_ROWS = 2.0


def split_by_padding(indices: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
    """Cut a padded micro-batch (indices sorted longest first) into consecutive parts of least cost.

    Cost of a part = its padded size (rows × its first length) + one fixed charge per part,
    SPLIT_CHARGE_ROWS × the bin's mean length: a forward/backward of its own pays off only when it
    saves more padded positions than that (a heuristic for the per-call cost, device dependent).
    Exact dynamic programming over the cut points — where the length changes (cutting inside a run
    of equal lengths never helps), thinned evenly to at most MAX_SPLIT_POINTS.
    """
    k = len(indices)
    lens = [lengths[i] for i in indices]
    points = [0] + [r for r in range(1, k) if lens[r] != lens[r - 1]]
    if len(points) > MAX_SPLIT_POINTS:
        stride = -(-len(points) // MAX_SPLIT_POINTS)
        points = points[::stride]
    points.append(k)
    charge = SPLIT_CHARGE_ROWS * sum(lens) / max(1, k)
    best = [0.0] + [float("inf")] * (len(points) - 1)  # best[b]: least cost of the rows before points[b]
    cut = [0] * len(points)
    for b in range(1, len(points)):
        for a in range(b):
            cost = best[a] + (points[b] - points[a]) * lens[points[a]] + charge
            if cost < best[b]:
                best[b], cut[b] = cost, a
    parts: list[list[int]] = []
    b = len(points) - 1
    while b > 0:
        parts.append(list(indices[points[cut[b]] : points[b]]))
        b = cut[b]
    return parts[::-1]


def equalise_bins(bins: Sequence[Sequence[int]], count: int, lengths: Sequence[int]) -> list[list[int]]:
    """`bins` grown to exactly `count` micro-batches (count ≥ len(bins)): the bin of the largest padded size
    (rows × its longest length) with more than one sequence is halved (first half longer, order kept)
    until there are `count` bins or none can be split; then empty bins are appended (a rank runs a
    zero-weight dummy for each). Every rank of an FSDP2 group must run the same number of forwards.
    """
    out = [list(b) for b in bins]
    if count < len(out):
        raise ValueError(f"cannot shrink {len(out)} micro-batches to {count}")
    while len(out) < count:
        splittable = [i for i, b in enumerate(out) if len(b) > 1]
        if not splittable:
            break
        i = max(splittable, key=lambda k: (len(out[k]) * max(lengths[j] for j in out[k]), -k))
        b = out.pop(i)
        half = (len(b) + 1) // 2
        out[i:i] = [b[:half], b[half:]]
    return out + [[] for _ in range(count - len(out))]
