"""The one error handler of the console commands.

The commands live in `cli/plan.py`, `cli/run.py` and `cli/tune.py`; this module turns our exceptions into
one short paragraph on stderr and an exit status (2 bad input, 3 does not fit,
4 fits only conditionally, 1 run failure) — never a traceback for a user mistake.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

import typer

from grpo_pilot.errors import GrpoPilotError

F = TypeVar("F", bound=Callable[..., Any])


def report_error(exc: GrpoPilotError) -> None:
    """Print the error paragraph to stderr (plain text: safe for pipes and logs)."""
    label = {2: "error", 3: "does not fit", 4: "fits only conditionally"}.get(exc.exit_code, "failed")
    print(f"{label}: {exc.paragraph()}", file=sys.stderr)


def handle_errors(fn: F) -> F:
    """Decorator for typer commands: GrpoPilotError -> message + exit code; Ctrl-C or SIGTERM -> exit 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GrpoPilotError as exc:
            report_error(exc)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where a command turns it into this (grpo-run, -tune)
            why = str(exc)
            print(f"interrupted: {why}" if why else "interrupted", file=sys.stderr)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]
