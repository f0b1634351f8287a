"""What the console commands share: flags declared once, flag rules from one table, consoles that fit the output.

- Flags: each command declares its flags as the fields of one frozen dataclass (`flag(...)`, `argument(...)`:
  the field's default and its typer option in one place); `command(app, Args)` turns a function of an `Args`
  into the typer command, so a new flag is one field. `flag_name(Args, "field")` is the flag as typed.
- Rules: conflicts and requirements between flags are rows of a table (`Rule`, built with `exclusive`,
  `requires`, `choice`); `check_rules` refuses the first broken one with a one-paragraph `InputError`.
- Consoles: on a terminal rich fits its width; off one (a pipe, a file, a cluster's log) `console()` is
  `PIPE_COLUMNS` wide so that no table cell is cut, and `--help` is `HELP_COLUMNS` wide (rich would cut
  both at 80 columns).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import typer
from rich.console import Console
from typer import rich_utils

from grpo_pilot.cli.errors import handle_errors
from grpo_pilot.errors import InputError

PIPE_COLUMNS = 200  # off a terminal: the widest table (grpo-plan's knobs, grpo-run's summary) fits whole
HELP_COLUMNS = 120  # off a terminal: every option name of every command fits beside its help
TYPER = "typer"  # dataclass field metadata key: the field's typer.Option / typer.Argument


def flag(default: Any, *decls: str, **kwargs: Any) -> Any:
    """A dataclass field that is a command-line option: `x: int = flag(3, "--x", help=...)`."""
    info = typer.Option(default, *decls, **kwargs)
    if isinstance(default, list):
        return dataclasses.field(default_factory=list, metadata={TYPER: info})
    return dataclasses.field(default=default, metadata={TYPER: info})


def argument(**kwargs: Any) -> Any:
    """A dataclass field that is a required positional argument (declare it before the flags)."""
    return dataclasses.field(metadata={TYPER: typer.Argument(..., **kwargs)})


def flag_name(args_type: type, name: str) -> str:
    """The flag of field `name` as a user types it (`--kl/--no-kl`, `--out`)."""
    info = next(f for f in dataclasses.fields(args_type) if f.name == name).metadata[TYPER]
    decls = [d for d in (info.param_decls or ()) if d.startswith("--")]
    return decls[0] if decls else name.upper()


def command(app: typer.Typer, args_type: type) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Decorator: `fn(args: args_type)` becomes `app`'s command, its parameters the dataclass fields, wrapped in
    the one error handler. The function itself is returned unchanged (tests may call it with an `args_type`)."""
    hints = typing.get_type_hints(args_type)
    params = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.metadata[TYPER], annotation=hints[f.name])
        for f in dataclasses.fields(args_type)
    ]

    def register(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        def main(**values: Any) -> None:
            fn(args_type(**values))

        main.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        main.__annotations__ = {p.name: p.annotation for p in params}
        main.__name__, main.__doc__ = fn.__name__, fn.__doc__
        app.command()(handle_errors(main))
        return fn

    return register


def given(value: Any) -> bool:
    """Whether a flag was given: set to anything but its 'absent' default (None, False, an empty list)."""
    return value is not None and value is not False and value != []


@dataclass(frozen=True)
class Rule:
    """One row of a command's flag table: when `broken(args)`, the command is refused with `message(args)`."""

    broken: Callable[[Any], bool]
    message: Callable[[Any], str]
    hint: str


def exclusive(args_type: type, a: str, b: str, *, why: str, hint: str = "Use one of them.") -> Rule:
    """`a` and `b` cannot be given together."""
    names = f"{flag_name(args_type, a)} and {flag_name(args_type, b)}"
    return Rule(lambda x: given(getattr(x, a)) and given(getattr(x, b)), lambda x: f"{names} {why}.", hint)


def requires(args_type: type, name: str, needs: Iterable[str], *, why: str, hint: str) -> Rule:
    """`name` only applies when one of `needs` is given."""
    needed = tuple(needs)
    return Rule(
        lambda x: given(getattr(x, name)) and not any(given(getattr(x, n)) for n in needed),
        lambda x: f"{flag_name(args_type, name)} {why}.",
        hint,
    )


def choice(args_type: type, name: str, choices: Iterable[str]) -> Rule:
    """`name`, when given, is one of `choices`."""
    allowed = tuple(choices)
    return Rule(
        lambda x: getattr(x, name) is not None and getattr(x, name) not in allowed,
        lambda x: f"Unknown {flag_name(args_type, name)} '{getattr(x, name)}'.",
        f"Choose one of: {', '.join(allowed)}.",
    )


def check_rules(args: Any, rules: Iterable[Rule]) -> None:
    """The first broken rule, as an `InputError` (exit 2)."""
    for rule in rules:
        if rule.broken(args):
            raise InputError(rule.message(args), rule.hint)


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr): the terminal's width, or `PIPE_COLUMNS` off a terminal."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=PIPE_COLUMNS)


def fit_help_to_output() -> None:
    """`--help` off a terminal at `HELP_COLUMNS` (typer's rich help reads this width; `TERMINAL_WIDTH` still
    wins when set)."""
    if rich_utils.MAX_WIDTH is None and not sys.stdout.isatty():
        rich_utils.MAX_WIDTH = HELP_COLUMNS


fit_help_to_output()
