"""The CUDA caching allocator's history of a run (run setting `memory_history`), and a compact reading of it.

    start_history(device) -> bool          record every allocation, free and segment of this process (CUDA only)
    dump_history(path)                     write the snapshot (pickle; open it at https://pytorch.org/memory_viz)
    summarize(snapshot) -> dict            the reserve's peak and the segments held there, with who made them

PyTorch's allocator can keep a trace of its events (`torch.cuda.memory._record_memory_history`, documented in
PyTorch's "Understanding CUDA Memory Usage" notes): `alloc`, `free_requested`/`free_completed` of blocks and
`segment_alloc`/`segment_free` (cudaMalloc/cudaFree of whole segments; `segment_map`/`segment_unmap` for the
pages of expandable segments), each with its size and the Python frames that asked for it. The first worker of
a run records it when `memory_history` is on, and writes `<workdir>/worker-0/memory_snapshot.pickle` at the end.

`summarize` replays the trace's segment events to find when the reserve (what nvidia-smi shows, less the CUDA
context) peaked and lists the segments alive at that moment, largest first, each with the allocation that made
it: the evidence for what the allocator stranded (docs/validation.md, "Device footprint"). The trace is a ring
of the last `MAX_ENTRIES` events: a summary says when it may have lost the run's beginning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

SNAPSHOT_FILE = "memory_snapshot.pickle"  # in the first worker's directory, <output_dir>/workers/worker-0
MAX_ENTRIES = 1_000_000  # events kept (a ring): a few GRPO steps of a small model's decode loop and update
FRAMES_KEPT = 6  # innermost frames kept per segment in a summary
SEGMENTS_KEPT = 40
_GROW = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_LIVE = {"alloc": 1, "free_completed": -1}


def start_history(device: Any) -> bool:
    """Start recording on a CUDA device (python stacks, every event); False on CPU, where nothing is recorded."""
    if getattr(device, "type", str(device)) != "cuda":
        return False
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=MAX_ENTRIES)
    return True


def dump_history(path: Path) -> Path:
    """Write the snapshot to `path` (temp file, then rename) and stop recording."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    try:
        torch.cuda.memory._dump_snapshot(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        torch.cuda.memory._record_memory_history(enabled=None)
    return path


def _frames(event: dict[str, Any]) -> list[str]:
    """`file:line name` of the innermost frames of an event."""
    frames = [f"{Path(f.get('filename', '?')).name}:{f.get('line', 0)} {f.get('name', '?')}" for f in event["frames"]]
    return frames[:FRAMES_KEPT]


def _peak_index(events: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(index of the segment event at which the reserve peaked, that reserve, the live bytes then — before the
    request the new segment serves), both counted from the trace's start."""
    reserved = live = 0
    best = (-1, 0, 0)
    for i, event in enumerate(events):
        reserved += _GROW.get(event["action"], 0) * event["size"]
        live += _LIVE.get(event["action"], 0) * event["size"]
        if reserved > best[1]:
            best = (i, reserved, live)
    return best


def _segments_at(events: Iterable[dict[str, Any]]) -> dict[int, tuple[int, dict[str, Any]]]:
    """The segments alive after `events`, by address: (index of the event that made it, that event)."""
    alive: dict[int, tuple[int, dict[str, Any]]] = {}
    for i, event in enumerate(events):
        if event["action"] in ("segment_alloc", "segment_map"):
            alive[event["addr"]] = (i, event)
        elif event["action"] in ("segment_free", "segment_unmap"):
            alive.pop(event["addr"], None)
    return alive


def summarize(snapshot: dict[str, Any], device: int = 0) -> dict[str, Any]:
    """The reserve's peak in a snapshot's trace and the segments held there (module docstring)."""
    traces = snapshot.get("device_traces") or []
    events = list(traces[device]) if device < len(traces) else []
    if not events:
        return {"events": 0, "note": "no trace: was the history recorded on this device?"}
    index, reserved, live = _peak_index(events)
    alive = _segments_at(events[: index + 1])
    segments = sorted(alive.values(), key=lambda made: made[1]["size"], reverse=True)
    return {
        "events": len(events),
        "trace_may_miss_the_start": len(events) >= MAX_ENTRIES,
        "peak_event_index": index,
        "reserved_growth_at_peak_bytes": reserved,
        "live_growth_at_peak_bytes": live,
        "segments_at_peak": len(segments),
        "segment_bytes_at_peak": sum(e["size"] for _, e in segments),
        "largest_segments": [
            {"size_bytes": e["size"], "made_at_event": i, "frames": _frames(e)} for i, e in segments[:SEGMENTS_KEPT]
        ],
    }
