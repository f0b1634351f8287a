"""A replay of PyTorch's CUDA caching allocator: what it reserves for a recorded sequence of allocations.

Pure Python, no torch (the constants come from planner/memory/allocator.py): `replay(events, expandable=...)`
runs the allocator's rules over a sequence of
allocations, frees, cache releases and phase marks (recorded on CPU by `verify/alloc_record.py` from the
engine's own step on fake tensors, or written by hand in tests) and returns, per phase and overall, the
peak of the bytes handed out (`torch.cuda.max_memory_allocated`) and of the bytes held from the driver
(`torch.cuda.max_memory_reserved`).

The rules (pytorch c10/cuda/CUDACachingAllocator.cpp @001074d2, the same logic in torch 2.9–2.13;
notes/mechanisms.md §5 has the walk-through):
- every request is rounded up to 512 B (`kMinBlockSize`); requests of at most 1 MiB (`kSmallSize`) go
  to the small pool, larger ones to the large pool; one stream;
- a request takes the smallest cached free block of its pool that fits (`get_free_block`: blocks
  ordered by (size, address));
- none fits: a new segment (`alloc_block`: cudaMalloc) of 2 MiB (small pool), 20 MiB (requests under
  10 MiB) or the request rounded up to 2 MiB — the reserve grows by the segment;
- the block handed out is split when the rest is worth keeping (`should_split`: small pool or
  expandable segments: rest >= 512 B; large pool: rest > 1 MiB), else handed out whole and counted
  whole in the allocated bytes;
- a freed block merges with free neighbours of its segment (`free_block` / `try_merge_blocks`);
  nothing returns to the driver until `empty_cache()` (`release_cached_blocks`: every segment that is
  entirely free) or a failed cudaMalloc (the same release, then one retry; past it: out of memory);
- expandable segments (`expandable_segments:True`, Note [Expandable Segments]): one virtual range per
  pool of 1 1/8 x the device memory, physical pages of 2 MiB (small pool) or 20 MiB (large pool)
  mapped on demand at the lowest address with enough free and unmapped room
  (`find_expandable_block`, `map_block`), best fit reading a free block followed by unmapped room as
  that large (`get_free_block`'s `expandable_size`), a cache release unmapping every whole free page
  (`unmap_block`). Turning the setting off at run time (verl's `set_expandable_segments(False)`)
  keeps existing expandable blocks out of new requests.
`max_split_size_mb`, `roundup_power2_divisions` and the garbage-collection threshold keep their
defaults (unset); CUDA-graph private pools are not modelled.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

# the allocator's size constants and `get_allocation_size` have one home, the planner's reserve model
from grpo_pilot.planner.memory.allocator import (
    LARGE_BUFFER_BYTES,
    MIN_BLOCK_BYTES,
    ROUND_LARGE_BYTES,
    SMALL_BUFFER_BYTES,
    SMALL_SIZE_BYTES,
    segment_bytes,
)


def round_size(nbytes: int) -> int:
    """`round_size`: up to a multiple of 512 B (at least 512)."""
    return max(MIN_BLOCK_BYTES, -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


class OutOfMemory(Exception):
    """A request that no cached block, new segment or cache release could satisfy."""


class _Segment:
    __slots__ = ("base", "page", "expandable")

    def __init__(self, base: int, page: int, expandable: bool) -> None:
        self.base, self.page, self.expandable = base, page, expandable


class _Block:
    __slots__ = ("addr", "size", "allocated", "mapped", "prev", "next", "small", "seg")

    def __init__(self, addr: int, size: int, small: bool, seg: _Segment, *, mapped: bool = True) -> None:
        self.addr, self.size, self.small, self.seg, self.mapped = addr, size, small, seg, mapped
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int]:
        return (self.size, self.addr)


class _Pool:
    """Cached free blocks ordered by (size, address); unmapped expandable room ordered by address."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[int, _Block] = {}  # address -> free mapped block
        self.unmapped: list[int] = []  # addresses of unmapped blocks
        self.unmapped_blocks: dict[int, _Block] = {}

    def insert(self, b: _Block) -> None:
        insort(self.keys, b.key())
        self.blocks[b.addr] = b

    def remove(self, b: _Block) -> None:
        i = bisect_left(self.keys, b.key())
        del self.keys[i]
        del self.blocks[b.addr]

    def insert_unmapped(self, b: _Block) -> None:
        insort(self.unmapped, b.addr)
        self.unmapped_blocks[b.addr] = b

    def remove_unmapped(self, b: _Block) -> None:
        del self.unmapped[bisect_left(self.unmapped, b.addr)]
        del self.unmapped_blocks[b.addr]


@dataclass
class CachingAllocator:
    """One device's caching allocator on one stream (module docstring)."""

    expandable: bool = False
    device_bytes: int = 1 << 50  # the memory the driver can still hand out (allocator reserve included)
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    _next_addr: int = 1 << 40
    _pools: tuple[_Pool, _Pool] = field(default_factory=lambda: (_Pool(False), _Pool(True)))

    # -- the allocator's public operations ---------------------------------------------------------
    def malloc(self, nbytes: int) -> _Block:
        size = round_size(nbytes)
        pool = self._pools[1] if size <= SMALL_SIZE_BYTES else self._pools[0]
        block = self._free_block(pool, size)
        if block is None:
            block = self._alloc_block(pool, size)
        if block is None:
            self.empty_cache()
            block = self._alloc_block(pool, size)
        if block is None:
            raise OutOfMemory(
                f"{size} bytes: {self.allocated} allocated, {self.reserved} reserved of {self.device_bytes}"
            )
        return self._hand_out(pool, block, size)

    def free(self, block: _Block) -> None:
        pool = self._pools[1] if block.small else self._pools[0]
        block.allocated = False
        self.allocated -= block.size
        for other in (block.prev, block.next):
            self._merge(pool, block, other)
        pool.insert(block)

    def empty_cache(self) -> None:
        """`release_cached_blocks`: free every entirely free segment, unmap every whole free page."""
        for pool in self._pools:
            to_unmap = []
            for b in list(pool.blocks.values()):
                if b.seg.expandable:
                    to_unmap.append(b)
                elif not b.is_split():
                    pool.remove(b)
                    self.reserved -= b.size
            for b in to_unmap:
                self._unmap(pool, b)

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    # -- internals -------------------------------------------------------------------------------
    def _grow(self, reserved: int) -> None:
        self.reserved += reserved
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _free_block(self, pool: _Pool, size: int) -> _Block | None:
        """`get_free_block`: best fit (with the expandable-size rule and the expandable-off skip)."""
        keys = pool.keys
        i = bisect_left(keys, (size, -1))
        if i == len(keys):
            return None
        b = pool.blocks[keys[i][1]]
        if b.seg.expandable:
            if self.expandable:

                def room(x: _Block) -> int:
                    return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)

                while i + 1 < len(keys) and b.seg.expandable:
                    nxt = pool.blocks[keys[i + 1][1]]
                    if room(nxt) >= room(b):
                        break
                    i, b = i + 1, nxt
            else:
                while b.seg.expandable:
                    i += 1
                    if i == len(keys):
                        return None
                    b = pool.blocks[keys[i][1]]
        pool.remove(b)
        return b

    def _alloc_block(self, pool: _Pool, size: int) -> _Block | None:
        if self.expandable:
            return self._expandable_block(pool, size)
        seg_size = segment_bytes(size)
        if self.reserved + seg_size > self.device_bytes:
            return None
        seg = _Segment(self._next_addr, seg_size, expandable=False)
        block = _Block(self._next_addr, seg_size, pool.small, seg)
        self._next_addr += seg_size + ROUND_LARGE_BYTES
        self._grow(seg_size)
        return block

    def _hand_out(self, pool: _Pool, block: _Block, size: int) -> _Block:
        rest = block.size - size
        split = rest >= MIN_BLOCK_BYTES if (pool.small or self.expandable) else rest > SMALL_SIZE_BYTES
        if split:
            remaining = _Block(block.addr + size, rest, block.small, block.seg)
            remaining.prev, remaining.next = block, block.next
            if block.next is not None:
                block.next.prev = remaining
            block.next = remaining
            block.size = size
            pool.insert(remaining)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def _merge(self, pool: _Pool, dst: _Block, src: _Block | None) -> None:
        """`try_merge_blocks`: absorb a free neighbour of the same mapping state."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.addr, dst.prev = src.addr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # -- expandable segments -----------------------------------------------------------------------
    def _expandable_block(self, pool: _Pool, size: int) -> _Block | None:
        """`try_allocate_expandable_block`: map pages at the lowest address with room for `size`."""
        candidate = self._find_expandable(pool, size)
        if not candidate.mapped:
            candidate = self._map(pool, candidate, min(candidate.size, size))
            if candidate is None:
                return None
        while candidate.size < size:
            nxt = candidate.next
            assert nxt is not None and not nxt.mapped
            mapped = self._map(pool, nxt, min(size - candidate.size, nxt.size))
            if mapped is None:
                return None
            candidate = mapped
        pool.remove(candidate)
        return candidate

    def _find_expandable(self, pool: _Pool, size: int) -> _Block:
        for addr in pool.unmapped:
            c = pool.unmapped_blocks[addr]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            room, cursor = 0, c
            while room < size and cursor is not None and not cursor.allocated:
                room += cursor.size
                cursor = cursor.next
            if room >= size:
                return c
        page = SMALL_BUFFER_BYTES if pool.small else LARGE_BUFFER_BYTES
        span = -(-(self.device_bytes + self.device_bytes // 8) // page) * page
        seg = _Segment(self._next_addr, page, expandable=True)
        self._next_addr += span + page
        c = _Block(seg.base, span, pool.small, seg, mapped=False)
        pool.insert_unmapped(c)
        return c

    def _map(self, pool: _Pool, to_map: _Block, size: int) -> _Block | None:
        """`map_block`: back the first `size` bytes of an unmapped block (whole pages) and merge."""
        page = to_map.seg.page
        mapped = -(-size // page) * page
        if self.reserved + mapped > self.device_bytes:
            return None
        pool.remove_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = _Block(to_map.addr + mapped, to_map.size - mapped, to_map.small, to_map.seg, mapped=False)
            rest.prev, rest.next = to_map, to_map.next
            if to_map.next is not None:
                to_map.next.prev = rest
            to_map.next = rest
            to_map.size = mapped
            pool.insert_unmapped(rest)
        self._merge(pool, to_map, to_map.prev)
        self._merge(pool, to_map, to_map.next)
        pool.insert(to_map)
        self._grow(mapped)
        return to_map

    def _unmap(self, pool: _Pool, block: _Block) -> None:
        """`unmap_block`: return every whole page inside a free expandable block to the driver."""
        seg, page = block.seg, block.seg.page
        begin = seg.base + -(-(block.addr - seg.base) // page) * page
        end = seg.base + ((block.addr + block.size - seg.base) // page) * page
        if begin >= end:
            return
        pool.remove(block)
        if begin > block.addr:
            before = _Block(block.addr, begin - block.addr, block.small, seg)
            before.prev, before.next = block.prev, block
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            pool.insert(before)
        if block.addr + block.size > end:
            after = _Block(end, block.addr + block.size - end, block.small, seg)
            after.prev, after.next = block, block.next
            if block.next is not None:
                block.next.prev = after
            block.next = after
            pool.insert(after)
        block.addr, block.size, block.mapped = begin, end - begin, False
        self.reserved -= block.size
        self._merge(pool, block, block.prev)
        self._merge(pool, block, block.next)
        pool.insert_unmapped(block)
        if not block.is_split():  # `release_expandable_segment`: the whole range is unmapped
            pool.remove_unmapped(block)


# -- replaying a recorded sequence ------------------------------------------------------------------
# Events: ("a", id, nbytes) allocate, ("f", id) free, ("p", name) a phase starts (peaks reset, as the
# engine's profiler does), ("e",) torch.cuda.empty_cache(), ("x", on) expandable segments on/off,
# ("r", point) a place where a release policy may empty the cache (`release_points` says which do),
# ("c", text) a comment (ignored).


class PhasePeaks(NamedTuple):
    allocated_bytes: int
    reserved_bytes: int


class Replay(NamedTuple):
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    phases: dict[str, PhasePeaks]  # phase name -> its largest peaks over every time it ran
    final_allocated_bytes: int
    final_reserved_bytes: int


def replay(
    events: Iterable[tuple],
    *,
    expandable: bool = False,
    release_points: Iterable[str] = (),
    device_bytes: int = 1 << 50,
) -> Replay:
    """Run the allocator over `events` (above) and return the peaks (module docstring)."""
    releases = frozenset(release_points)
    alloc = CachingAllocator(expandable=expandable, device_bytes=device_bytes)
    live: dict[int, _Block] = {}
    phases: dict[str, PhasePeaks] = {}
    phase: str | None = None
    top_allocated = top_reserved = 0

    def close() -> None:
        if phase is not None:
            old = phases.get(phase, PhasePeaks(0, 0))
            phases[phase] = PhasePeaks(
                max(old.allocated_bytes, alloc.peak_allocated), max(old.reserved_bytes, alloc.peak_reserved)
            )

    for event in events:
        kind = event[0]
        if kind == "a":
            live[event[1]] = alloc.malloc(event[2])
        elif kind == "f":
            alloc.free(live.pop(event[1]))
        elif kind == "p":
            close()
            top_allocated = max(top_allocated, alloc.peak_allocated)
            top_reserved = max(top_reserved, alloc.peak_reserved)
            phase = event[1]
            alloc.reset_peaks()
        elif kind == "e" or (kind == "r" and event[1] in releases):
            alloc.empty_cache()
        elif kind in ("r", "c"):  # a release point this policy skips, or a comment: no allocator action
            continue
        elif kind == "x":
            alloc.expandable = bool(event[1])
        else:
            raise ValueError(f"unknown allocator event {event!r}")
    close()
    return Replay(
        peak_allocated_bytes=max(top_allocated, alloc.peak_allocated),
        peak_reserved_bytes=max(top_reserved, alloc.peak_reserved),
        phases=phases,
        final_allocated_bytes=alloc.allocated,
        final_reserved_bytes=alloc.reserved,
    )
