"""The built-in rewards: name -> options model, scorer factory, record fields it needs, summary.

Options arrive as strings from the spec and are validated (and converted) by each built-in's
frozen options model; a bad or unknown option is an `InputError` that lists the valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence, get_args, get_origin

from pydantic import ValidationError

from grpo_pilot.engine.data.records import PromptRecord
from grpo_pilot.engine.rewards.code import CodeOptions, check_code_tests, make_code
from grpo_pilot.engine.rewards.result import Scorer
from grpo_pilot.engine.rewards.text import (
    CharFractionOptions,
    ExactMatchOptions,
    FormatOptions,
    LengthOptions,
    OverlongOptions,
    make_char_fraction,
    make_exact_match,
    make_format,
    make_length,
    make_overlong,
)
from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen

SCORE_BOUND = 1.0  # every built-in scores within [-1, 1]: see each scorer in text.py and code.py


@dataclass(frozen=True)
class Builtin:
    """A built-in reward: `make(options)` builds its scorer (`make(options, settings)` when
    `uses_settings`); `requires` names record fields it reads; `check_records` refuses records it
    cannot score (an `InputError` before training)."""

    name: str
    summary: str
    options: type[Frozen]
    make: Callable[..., Scorer]
    requires: tuple[str, ...] = ()
    uses_settings: bool = False
    check_records: Callable[[Sequence[PromptRecord]], None] | None = None


BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in (
        Builtin(
            "exact_match",
            "1 if the final answer (boxed, ####, last number) equals the record's answer",
            ExactMatchOptions,
            make_exact_match,
            ("answer",),
        ),
        Builtin(
            "format",
            "1 if the completion matches a regex (default: <think>...</think> then an answer)",
            FormatOptions,
            make_format,
        ),
        Builtin(
            "code",
            "fraction of the record's assert tests the completion's code passes, sandboxed",
            CodeOptions,
            make_code,
            ("tests",),
            uses_settings=True,
            check_records=check_code_tests,
        ),
        Builtin("length", "-min(L, max_len)/max_len: a plain length penalty", LengthOptions, make_length),
        Builtin(
            "overlong",
            "DAPO soft overlong penalty over the last cache_len before max_len",
            OverlongOptions,
            make_overlong,
        ),
        Builtin(
            "char_fraction",
            "fraction of the completion's characters equal to `char` (toy task)",
            CharFractionOptions,
            make_char_fraction,
        ),
    )
}


def describe_options(options: type[Frozen]) -> str:
    """'key (type, default X): description; ...' for an options model."""
    parts = []
    for key, field in options.model_fields.items():
        if get_origin(field.annotation) is Literal:
            kind = "|".join(str(a) for a in get_args(field.annotation))
        else:
            kind = getattr(field.annotation, "__name__", None) or str(field.annotation).replace("typing.", "")
        if field.is_required():
            default = "required"
        elif field.default_factory is not None:
            default = "default: automatic"
        else:
            default = f"default {field.default!r}"
        parts.append(f"{key} ({kind}, {default}): {(field.description or '').rstrip('.')}")
    return "; ".join(parts) or "none"


def build_options(builtin: Builtin, raw: dict[str, str]) -> Frozen:
    unknown = sorted(set(raw) - set(builtin.options.model_fields))
    if unknown:
        raise InputError(
            f"The '{builtin.name}' reward has no option {', '.join(repr(k) for k in unknown)}.",
            f"Options of {builtin.name}: {describe_options(builtin.options)}.",
        )
    try:
        return builtin.options.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'options'}: {err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise InputError(
            f"Bad options for the '{builtin.name}' reward: {problems}.",
            f"Options of {builtin.name}: {describe_options(builtin.options)}.",
        ) from exc


def builtin_help() -> str:
    """One line per built-in, for error messages and `--help` texts."""
    return "\n".join(f"{b.name}: {b.summary}. Options: {describe_options(b.options)}" for b in BUILTINS.values())
