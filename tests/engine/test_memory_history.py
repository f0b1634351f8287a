"""The allocator history's reading (engine/memory_history.py) on a trace in PyTorch's snapshot format."""

from __future__ import annotations

from grpo_pilot.engine.memory_history import start_history, summarize

MiB = 1 << 20


def _event(action: str, addr: int, size: int, name: str = "f") -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0,
            "frames": [{"filename": f"/x/{name}.py", "line": 7, "name": name}]}  # fmt: skip


def test_the_peak_and_the_segments_held_there() -> None:
    trace = [
        _event("segment_alloc", 0x1000, 20 * MiB, "small"),
        _event("alloc", 0x1000, 10 * MiB),
        _event("segment_alloc", 0x9000, 100 * MiB, "logits"),
        _event("alloc", 0x9000, 90 * MiB),
        _event("free_requested", 0x9000, 90 * MiB),
        _event("free_completed", 0x9000, 90 * MiB),
        _event("segment_free", 0x9000, 100 * MiB, "logits"),
        _event("segment_alloc", 0x20000, 50 * MiB, "later"),
    ]
    summary = summarize({"device_traces": [trace]})
    assert summary["peak_event_index"] == 2  # the segment that took the reserve to 120 MiB
    assert summary["reserved_growth_at_peak_bytes"] == 120 * MiB
    assert summary["live_growth_at_peak_bytes"] == 10 * MiB  # before the request that segment serves
    assert [s["size_bytes"] for s in summary["largest_segments"]] == [100 * MiB, 20 * MiB]
    assert summary["largest_segments"][0]["frames"] == ["logits.py:7 logits"]
    assert summary["largest_segments"][0]["made_at_event"] == 2
    assert not summary["trace_may_miss_the_start"]


def test_expandable_pages_count_like_segments_and_an_empty_trace_says_so() -> None:
    trace = [
        _event("segment_map", 0x0, 2 * MiB),
        _event("segment_map", 0x200000, 2 * MiB),
        _event("segment_unmap", 0x0, 2 * MiB),
    ]
    assert summarize({"device_traces": [trace]})["reserved_growth_at_peak_bytes"] == 4 * MiB
    assert summarize({"device_traces": []})["events"] == 0


def test_nothing_is_recorded_on_cpu() -> None:
    import torch

    assert start_history(torch.device("cpu")) is False
