"""The sweep's console view: a progress bar and a table of the latest trials on a terminal; one plain
line per trial otherwise (logs and pipes stay readable)."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from grpo_pilot.tuner.records import TrialRecord

RECENT_ROWS = 8
MIB = float(1 << 20)
GIB = float(1 << 30)


def size(n: int | float | None) -> str:
    if n is None:
        return "—"
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def knobs_text(params: dict[str, Any]) -> str:
    short = {
        "update_batch": "batch",
        "gradient_checkpointing": "ckpt",
        "fused_logprob": "fused",
        "gpu_memory_utilization": "util",
        "log_prob_max_token_len_per_gpu": "logprob_tokens",
    }
    parts = []
    for k, v in params.items():
        name = short.get(k, k.replace("_per_gpu", "").replace("_max_token_len", ""))
        parts.append(f"{name}={'on' if v is True else 'off' if v is False else v}")
    return " ".join(parts)


def outcome_text(r: TrialRecord) -> str:
    if r.status == "ok":
        return "ok"
    if r.status == "pruned":
        return f"pruned: {r.prune_reason}"
    where = ", ".join(x for x in (r.failure_phase and f"phase {r.failure_phase}",) if x)
    return f"{r.status}{f' ({where})' if where else ''}: {r.failure_message or ''}".strip()


class SweepDisplay:
    """`SweepEvents` on a rich console (stderr)."""

    def __init__(self, console: Console | None = None, quiet: bool = False) -> None:
        self.console = console or Console(stderr=True)
        self.live_view = self.console.is_terminal and not quiet
        self.quiet = quiet
        self.progress = Progress(
            TextColumn("[bold]grpo-tune"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
        )
        self.task = self.progress.add_task("", total=1)
        self.recent: list[TrialRecord] = []
        self.best: TrialRecord | None = None
        self._live: Live | None = None

    def __enter__(self) -> "SweepDisplay":
        if self.live_view:
            self._live = Live(self._view(), console=self.console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def _view(self) -> Group:
        table = Table(box=None, padding=(0, 1), show_edge=False)
        for col, justify in (("trial", "right"), ("from", "left"), ("knobs", "left"), ("tokens/s", "right")):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for col in ("plan tok/s", "peak", "plan peak", "outcome"):
            table.add_column(col, justify="left" if col == "outcome" else "right", overflow="ellipsis")
        for r in self.recent[-RECENT_ROWS:]:
            table.add_row(
                str(r.number),
                r.source,
                knobs_text(r.params),
                rate(r.measured_tokens_per_s),
                rate(r.predicted_tokens_per_s),
                size(r.measured_peak_bytes),
                size(r.predicted_peak_tensor_bytes),
                outcome_text(r),
            )
        return Group(self.progress, table)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._view())

    # ---- SweepEvents ---------------------------------------------------------------------------

    def begin(self, done: int, total: int) -> None:
        self.progress.update(self.task, completed=min(done, total), total=total)
        if not self.live_view and not self.quiet:
            left = max(0, total - done)
            self.console.print(f"grpo-tune: {done} trial(s) in the study, {left} to run (of {total})", markup=False)
        self._refresh()

    def trial_started(self, number: int, params: dict[str, Any], source: str) -> None:
        self.progress.update(self.task, description=f"trial {number}: {knobs_text(params)}")
        self._refresh()

    def trial_finished(self, record: TrialRecord) -> None:
        self.recent.append(record)
        if record.status == "ok" and (
            self.best is None or (record.measured_tokens_per_s or 0) > (self.best.measured_tokens_per_s or 0)
        ):
            self.best = record
        best = f"best: trial {self.best.number}, {rate(self.best.measured_tokens_per_s)} tok/s" if self.best else ""
        self.progress.update(self.task, advance=1, description=best)
        if not self.live_view and not self.quiet:
            self.console.print(
                f"trial {record.number} [{record.source}] {knobs_text(record.params)}: "
                f"{rate(record.measured_tokens_per_s)} tok/s (plan {rate(record.predicted_tokens_per_s)}), "
                f"peak {size(record.measured_peak_bytes)} (plan {size(record.predicted_peak_tensor_bytes)}) — "
                f"{outcome_text(record)}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        self._refresh()

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(f"note: {text}", highlight=False, markup=False, soft_wrap=True)
