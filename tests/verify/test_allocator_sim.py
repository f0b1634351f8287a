"""The caching-allocator replay against sequences worked out by hand from the allocator's rules
(pytorch c10/cuda/CUDACachingAllocator.cpp; grpo_pilot/verify/allocator_sim.py)."""

from __future__ import annotations

import pytest

from grpo_pilot.verify.allocator_sim import CachingAllocator, OutOfMemory, replay, round_size, segment_bytes

MiB = 1 << 20


def test_rounding_and_segment_sizes() -> None:
    assert round_size(1) == 512 and round_size(513) == 1024 and round_size(4096) == 4096
    assert segment_bytes(MiB) == 2 * MiB  # small pool
    assert segment_bytes(MiB + 512) == 20 * MiB and segment_bytes(10 * MiB - 512) == 20 * MiB
    assert segment_bytes(10 * MiB) == 10 * MiB and segment_bytes(11 * MiB + 1) == 12 * MiB


def test_small_requests_share_a_2_mib_segment() -> None:
    a = CachingAllocator()
    blocks = [a.malloc(100) for _ in range(3)]
    assert a.allocated == 3 * 512 and a.reserved == 2 * MiB
    for b in blocks:
        a.free(b)
    assert a.allocated == 0 and a.reserved == 2 * MiB  # cached, not returned


def test_mid_size_requests_split_one_20_mib_segment() -> None:
    a = CachingAllocator()
    first, second = a.malloc(5 * MiB), a.malloc(5 * MiB)
    assert a.reserved == 20 * MiB and a.allocated == 10 * MiB
    third = a.malloc(9 * MiB)  # 10 MiB left in the segment: it fits
    assert a.reserved == 20 * MiB and third.addr == second.addr + 5 * MiB and first.next is second


def test_a_rest_of_at_most_1_mib_is_not_split_off() -> None:
    a = CachingAllocator()
    block = a.malloc(11 * MiB + 1)  # segment 12 MiB; the rest (< 1 MiB) stays in the block
    assert a.reserved == 12 * MiB and block.size == 12 * MiB and a.allocated == 12 * MiB


def test_best_fit_takes_the_smallest_free_block_that_fits() -> None:
    a = CachingAllocator()
    big, small = a.malloc(50 * MiB), a.malloc(30 * MiB)
    a.free(big)
    a.free(small)
    got = a.malloc(25 * MiB)
    assert got.addr == small.addr and a.reserved == 80 * MiB


def test_a_freed_block_carved_by_a_smaller_tensor_forces_a_new_segment() -> None:
    """The fragmentation the memory model rests on: a 100 MiB transient, freed, then a 40 MiB tensor that lives
    on takes the front of its segment; the next 100 MiB request fits nowhere and gets a new segment."""
    a = CachingAllocator()
    a.free(a.malloc(100 * MiB))
    keeper = a.malloc(40 * MiB)
    a.malloc(100 * MiB)
    assert a.reserved == 200 * MiB and a.allocated == 140 * MiB
    a.empty_cache()  # the carved segment holds a live block: it stays
    assert a.reserved == 200 * MiB
    a.free(keeper)
    a.empty_cache()
    assert a.reserved == 100 * MiB


def test_freed_neighbours_merge() -> None:
    a = CachingAllocator()
    x, y, z = a.malloc(4 * MiB), a.malloc(4 * MiB), a.malloc(4 * MiB)
    a.free(x)
    a.free(z)
    a.free(y)  # merges with both neighbours (and the segment's free tail)
    a.malloc(20 * MiB)
    assert a.reserved == 20 * MiB


def test_expandable_segments_map_20_mib_pages_and_tile_the_carved_case() -> None:
    a = CachingAllocator(expandable=True)
    a.free(a.malloc(100 * MiB))  # 5 pages mapped
    assert a.reserved == 100 * MiB
    keeper = a.malloc(40 * MiB)
    a.malloc(100 * MiB)  # the 60 MiB left after the keeper plus 2 new pages
    assert a.reserved == 140 * MiB and a.allocated == 140 * MiB
    a.free(keeper)
    a.empty_cache()  # the keeper's 2 whole pages go back
    assert a.reserved == 100 * MiB
    a.malloc(1)  # the small pool maps 2 MiB pages
    assert a.reserved == 102 * MiB


def test_expandable_release_unmaps_whole_pages_only() -> None:
    a = CachingAllocator(expandable=True)
    first = a.malloc(30 * MiB)  # pages 0-1 (40 MiB)
    a.malloc(5 * MiB)  # in page 1, after the first block
    a.free(first)  # 0-30 MiB free: only page 0 is whole
    a.empty_cache()
    assert a.reserved == 20 * MiB


def test_turning_expandable_off_keeps_its_blocks_out_of_new_requests() -> None:
    a = CachingAllocator(expandable=True)
    a.free(a.malloc(100 * MiB))
    a.expandable = False
    a.malloc(50 * MiB)
    assert a.reserved == 150 * MiB  # a cudaMalloc segment beside the mapped pages


def test_a_failed_cudamalloc_releases_the_cache_and_retries_then_runs_out() -> None:
    a = CachingAllocator(device_bytes=150 * MiB)
    a.free(a.malloc(100 * MiB))
    a.malloc(120 * MiB)  # 100 cached + 120 > 150: the cached segment is released first
    assert a.reserved == 120 * MiB
    with pytest.raises(OutOfMemory):
        a.malloc(40 * MiB)


def test_replay_reports_phase_peaks_and_cache_releases() -> None:
    events = [
        ("p", "rollout"),
        ("a", 1, 300 * MiB),
        ("f", 1),
        ("e",),
        ("p", "update"),
        ("a", 2, 200 * MiB),
        ("a", 3, 50 * MiB),
        ("f", 2),
        ("a", 4, 60 * MiB),
    ]
    r = replay(events)
    assert r.phases["rollout"] == (300 * MiB, 300 * MiB)
    # update: 200 + 50 live = 250; the 60 MiB request takes the freed 200 MiB block (best fit)
    assert r.phases["update"] == (250 * MiB, 250 * MiB)
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == (300 * MiB, 300 * MiB)
    assert (r.final_allocated_bytes, r.final_reserved_bytes) == (110 * MiB, 250 * MiB)
    without_release = replay([e for e in events if e[0] != "e"])
    assert without_release.phases["update"].reserved_bytes == 300 * MiB  # the rollout's block served the update
    with pytest.raises(ValueError, match="unknown allocator event"):
        replay([("z",)])
