"""Exceptions the CLI turns into one short paragraph and an exit status (never a traceback).

Exit statuses: 2 = bad input or usage (fix the command or the file), 3 = the request cannot fit,
4 = it fits only conditionally (inside the safety headroom, or only below a mean response length when the
lengths are unknown: planner/verdict.py), 1 = a run failed for another reason.
"""

from __future__ import annotations


class GrpoPilotError(Exception):
    """Base class: `message` says what is wrong, `hint` what to do about it."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def paragraph(self) -> str:
        return f"{self.message} {self.hint}".strip()


class InputError(GrpoPilotError):
    """Bad user input: unknown model, malformed cluster string, corrupt plan.json, bad dataset line."""

    exit_code = 2


class InfeasibleError(GrpoPilotError):
    """Nothing fits (or a pinned configuration does not fit). `plan` holds the evaluated plan if any."""

    exit_code = 3

    def __init__(self, message: str, hint: str = "", plan: object | None = None) -> None:
        super().__init__(message, hint)
        self.plan = plan


class ConditionalFitError(InfeasibleError):
    """The plan fits only inside the safety headroom ('tight') or only while the mean response stays under a
    length the launch does not state (planner/verdict.py)."""

    exit_code = 4


class RunError(GrpoPilotError):
    """A run failed for a reason that is not the user's input (a backend crashed, a checkpoint is missing)."""

    exit_code = 1
