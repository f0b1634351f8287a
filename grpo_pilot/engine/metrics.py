"""Step metrics: `metrics.jsonl` (one JSON object per step).

metrics.jsonl: each step is appended as one complete line with a single `os.write` on an
`O_APPEND` descriptor, then fsynced, so a reader never sees a partial record from a live run. A
process killed mid-write can leave at most one partial last line; on `--resume` the file is cut back
to its length at the checkpoint (`truncate`), which also drops the steps that will be redone.

Showing the records is not the engine's business: the loop reports each one through its events
(engine/events.py) and `grpo-run` renders them (cli/run_display.py).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become None (strict JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class MetricsLog:
    """Append-only JSONL file of step records."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict[str, Any]) -> int:
        """Write one record as one line; returns the file size afterwards (bytes)."""
        return self.append_many([record])

    def append_many(self, records: list[dict[str, Any]]) -> int:
        """Write records as lines with one `os.write` (all or, if killed, a cut last line); returns the size."""
        data = "".join(json.dumps(_clean(r), sort_keys=True, allow_nan=False) + "\n" for r in records).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if data:
                os.write(fd, data)
                os.fsync(fd)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def size(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def truncate(self, size: int) -> None:
        """Cut the file back to `size` bytes (the length recorded with a checkpoint); never lengthens it
        (a shorter file is not padded: `run_dir.RunDirectory.rewind` decides what to keep)."""
        if self.path.exists():
            with open(self.path, "r+b") as handle:
                handle.truncate(min(size, os.fstat(handle.fileno()).st_size))
                handle.flush()
                os.fsync(handle.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
