"""What a run reports while it goes: the events protocol between the engine and whoever shows progress.

`engine.loop.run(..., events=...)` calls `begin` once the start step is known (0, or the checkpoint a
`--resume` continues from), `step_finished` after each step's record is in metrics.jsonl, and `note` for
what the user should read (e.g. how `--resume` repaired a log). The engine never prints: `grpo-run` renders
these (`cli/run_display.py`: a live display on a terminal, one plain line per step otherwise), and
`NoEvents` (the default) drops them — what tests and benchmarks want. The tuner's `SweepEvents`
(tuner/sweep.py) is the same pattern one level up.
"""

from __future__ import annotations

from typing import Any, Protocol


class RunEvents(Protocol):
    """What the progress display hears from a run."""

    def begin(self, start_step: int, total_steps: int) -> None: ...

    def step_finished(self, record: dict[str, Any]) -> None: ...

    def note(self, text: str) -> None: ...


class NoEvents:
    """`RunEvents` that shows nothing."""

    def begin(self, start_step: int, total_steps: int) -> None:
        """Nothing to show."""

    def step_finished(self, record: dict[str, Any]) -> None:
        """Nothing to show."""

    def note(self, text: str) -> None:
        """Nothing to show."""
