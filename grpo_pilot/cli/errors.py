"""The one error handler of the console commands.

The commands live in `cli/plan.py`, `cli/run.py` and `cli/tune.py`; this module turns our exceptions into
one short paragraph on stderr and an exit status (2 bad input, 3 does not fit, 4 fits only conditionally,
1 run failure, 130 interrupted) — never a traceback. Anything else that escapes a command is a bug of ours:
it is reported as one paragraph too (exit 1), naming the exception; `GRPO_PILOT_TRACEBACK=1` shows the
traceback instead.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, TypeVar

import click
import typer

from grpo_pilot.errors import GrpoPilotError

F = TypeVar("F", bound=Callable[..., Any])
TRACEBACK_ENV = "GRPO_PILOT_TRACEBACK"


def report_error(exc: GrpoPilotError) -> None:
    """Print the error paragraph to stderr (plain text: safe for pipes and logs)."""
    label = {2: "error", 3: "does not fit", 4: "fits only conditionally"}.get(exc.exit_code, "failed")
    print(f"{label}: {exc.paragraph()}", file=sys.stderr)


def unexpected_paragraph(exc: BaseException) -> str:
    """One paragraph for an exception no command expected (its first line, shortened)."""
    text = " ".join(str(exc).split())
    shown = text if len(text) <= 300 else text[:300] + "…"
    return (
        f"failed: stopped on an unexpected {type(exc).__name__}{': ' + shown if shown else ''}. This is a bug in "
        f"grpo-pilot: please report it with the command line ({TRACEBACK_ENV}=1 prints the traceback)."
    )


def handle_errors(fn: F) -> F:
    """Decorator for typer commands: GrpoPilotError -> message + exit code; Ctrl-C or SIGTERM -> exit 130; any
    other exception -> one paragraph and exit 1."""

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
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise  # typer's own exits and usage errors
        except Exception as exc:
            if os.environ.get(TRACEBACK_ENV):
                raise
            print(unexpected_paragraph(exc), file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]
