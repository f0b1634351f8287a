"""`grpo-run`'s progress: the engine's `RunEvents` (engine/events.py) on the console.

On a terminal: a progress bar and the latest step's numbers (reward mean ± std, loss, KL, entropy,
response length, tokens/s, step and phase times), redrawn in place. Off a terminal (stdout and stderr
redirected to a file, how clusters launch runs): one plain line per step, written as the step ends, so a
log shows progress while the run goes. `--quiet`: neither (notes are still printed).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text


def _fmt(value: Any, spec: str = ".4f") -> str:
    return "—" if value is None else format(value, spec)


def step_cells(record: dict[str, Any]) -> dict[str, str]:
    """The numbers of one step's metrics.jsonl record, formatted, by column name."""
    return {
        "reward": f"{_fmt(record.get('reward_mean'), '.3f')} ± {_fmt(record.get('reward_std'), '.3f')}",
        "loss": _fmt(record.get("loss")),
        "kl": _fmt(record.get("kl")),
        "entropy": _fmt(record.get("entropy"), ".3f"),
        "resp len": _fmt(record.get("response_len_mean"), ".1f"),
        "tokens/s": _fmt(record.get("tokens_per_s"), ".0f"),
        "step s": _fmt(record.get("step_s"), ".2f"),
    }


def phases_text(record: dict[str, Any]) -> str:
    return "  ".join(f"{k} {v:.2f}s" for k, v in record.get("phase_s", {}).items())


def step_line(record: dict[str, Any], total_steps: int) -> str:
    """One step as one plain line (the display off a terminal)."""
    cells = "  ".join(f"{name} {value}" for name, value in step_cells(record).items())
    return f"step {record.get('step')}/{total_steps}  {cells}  phases: {phases_text(record)}"


def step_table(record: dict[str, Any]) -> Group:
    """The latest step's numbers (live display): one row of metrics, one line of phase times."""
    table = Table(box=None, padding=(0, 1), show_edge=False)
    cells = {"step": str(record.get("step")), **step_cells(record)}
    for name in cells:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_row(*cells.values())
    return Group(table, Text(f"phases: {phases_text(record)}", overflow="fold"))


class RunDisplay:
    """`RunEvents` on a rich console (stderr); a context manager that stops the live view at the end."""

    def __init__(self, console: Console, *, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.live_view = console.is_terminal and not quiet
        self.total_steps = 0
        self._progress = Progress(
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self._task = self._progress.add_task("steps", total=None)
        self._live: Live | None = None

    def __enter__(self) -> "RunDisplay":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    # ---- RunEvents ---------------------------------------------------------------------------

    def begin(self, start_step: int, total_steps: int) -> None:
        self.total_steps = total_steps
        self._progress.update(self._task, total=total_steps, completed=start_step)
        if self.live_view:
            self._live = Live(Group(self._progress), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()

    def step_finished(self, record: dict[str, Any]) -> None:
        self._progress.update(self._task, completed=record["step"])
        if self._live is not None:
            self._live.update(Group(self._progress, step_table(record)))
        elif not self.quiet:
            self._say(step_line(record, self.total_steps))

    def note(self, text: str) -> None:
        self._say(f"note: {text}")

    def _say(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self.console.file.flush()
