"""Step metrics: `metrics.jsonl` (one JSON object per step) and the rich live display.

metrics.jsonl: each step is appended as one complete line with a single `os.write` on an
`O_APPEND` descriptor, then fsynced, so a reader never sees a partial record from a live run. A
process killed mid-write can leave at most one partial last line; on `--resume` the file is cut back
to its length at the checkpoint (`truncate`), which also drops the steps that will be redone.

The live display (step, reward mean/std, loss, KL, entropy, response length, tokens/s, phase
times, and a progress bar) only runs when the console is a terminal; otherwise nothing is printed
per step (logs stay clean) and the end-of-run summary table is the only output.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

GIB = float(1 << 30)
MIB = float(1 << 20)


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


def _fmt(value: Any, spec: str = ".4f") -> str:
    return "—" if value is None else format(value, spec)


def step_table(record: dict[str, Any]) -> Group:
    """The latest step's numbers (live display): one row of metrics, one line of phase times."""
    table = Table(box=None, padding=(0, 1), show_edge=False)
    cells = {
        "step": str(record.get("step")),
        "reward": f"{_fmt(record.get('reward_mean'), '.3f')} ± {_fmt(record.get('reward_std'), '.3f')}",
        "loss": _fmt(record.get("loss")),
        "kl": _fmt(record.get("kl")),
        "entropy": _fmt(record.get("entropy"), ".3f"),
        "resp len": _fmt(record.get("response_len_mean"), ".1f"),
        "tokens/s": _fmt(record.get("tokens_per_s"), ".0f"),
        "step s": _fmt(record.get("step_s"), ".2f"),
    }
    for name in cells:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_row(*cells.values())
    phases = "  ".join(f"{k} {v:.2f}s" for k, v in record.get("phase_s", {}).items())
    return Group(table, Text(f"phases: {phases}", overflow="fold"))


class LiveDisplay:
    """Context manager: progress bar + latest step table when `console.is_terminal` and not `quiet`."""

    def __init__(
        self, total_steps: int, *, start_step: int = 0, console: Console | None = None, quiet: bool = False
    ) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = self.console.is_terminal and not quiet
        self._progress = Progress(
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self._task = self._progress.add_task("steps", total=total_steps, completed=start_step)
        self._live: Live | None = None
        self._table: Table = Table()

    def __enter__(self) -> "LiveDisplay":
        if self.enabled:
            self._live = Live(Group(self._progress), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def update(self, record: dict[str, Any]) -> None:
        if self._live is None:
            return
        self._progress.update(self._task, completed=record["step"])
        self._live.update(Group(self._progress, step_table(record)))

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.0f}%"


def _bytes(value: int | None) -> str:
    if value is None:
        return "—"
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / MIB:.1f} MiB"


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}s"


def summary_table(profile: Any) -> Table:
    """End-of-run table: measured vs predicted time and peak memory per phase (from a `RunProfile`).

    Memory is compared like with like — tracked tensor bytes with the plan's tensor items, or process RSS
    with the plan's phase total — and not at all when the plan describes another setup (`memory_compared`
    False: e.g. another rollout backend): the plan and error columns then stay empty and the caption says
    why (a LoRA run on a plan that does not model adapters keeps the plan's full-fine-tune figures, no error).
    On CPU with the tensor tracker, the process's peak RSS is shown beside it (allocated tensor bytes
    can exceed what is resident: an engine may reserve memory it never touches)."""
    tensors = any(row.measured_peak_bytes is not None for row in profile.phases.values())
    compared = getattr(profile, "memory_compared", True)
    with_rss = tensors and any(row.measured_rss_peak_bytes is not None for row in profile.phases.values())
    memory = (
        f"{profile.memory_source} vs the plan's tensor items"
        if tensors
        else f"{profile.rss_source} vs the plan's phase total"
    )
    if not compared:
        memory = (
            f"{profile.memory_source if tensors else profile.rss_source}, not compared: {profile.memory_not_compared}"
        )
    if with_rss:
        memory += f"; rss: {profile.rss_source}"
    table = Table(
        title=f"measured vs predicted on {profile.device}",
        caption=f"time: median of steps {_steps(profile.steps_measured)}; memory: {memory}",
    )
    # CUDA: the device footprint (allocator reserve + context etc.) beside the plan's phase total
    device = any(row.measured_device_peak_bytes is not None for row in profile.phases.values())
    table.add_column("phase", no_wrap=True)
    device_cols = ("device", "plan total", "err") if device else ()
    for col in ("time", "plan", "err", "peak mem", "plan", "err", *(("rss",) if with_rss else ()), *device_cols):
        table.add_column(col, justify="right", no_wrap=True)
    for name, row in profile.phases.items():
        mem = (
            (row.measured_peak_bytes, row.predicted_tensor_bytes, row.memory_rel_error)
            if tensors
            else (row.measured_rss_peak_bytes, row.predicted_total_bytes, row.rss_rel_error)
        )
        planned = (_bytes(mem[1]), _pct(mem[2])) if compared else ("—", "—")
        if getattr(profile, "plan_memory_full_ft", False):  # a LoRA run: the full fine-tune figure, not an error
            planned = (_bytes(mem[1]), "—")
        extra = (_bytes(row.measured_rss_peak_bytes),) if with_rss else ()
        dev = (
            (_bytes(row.measured_device_peak_bytes), _bytes(row.predicted_total_bytes), _pct(row.device_rel_error))
            if device
            else ()
        )
        table.add_row(
            name,
            _secs(row.measured_wall_s),
            _secs(row.predicted_wall_s),
            _pct(row.time_rel_error),
            _bytes(mem[0]),
            *planned,
            *extra,
            *dev,
        )
    s = profile.step
    blank = ("",) * (3 + (1 if with_rss else 0) + len(device_cols))
    table.add_row("step", _secs(s.measured_wall_s), _secs(s.predicted_wall_s), _pct(s.time_rel_error), *blank)
    return table


def _steps(steps: tuple[int, ...]) -> str:
    if not steps:
        return "—"
    return f"{steps[0]}–{steps[-1]}" if len(steps) > 1 else str(steps[0])
