"""Parse a reward spec string into terms: which reward, with which options, at which weight.

Grammar (whitespace around separators is ignored):

    spec     := term ("," term)*
    term     := builtin ["=" weight] [":" options]
              | builtin ":" options
              | callable ["=" weight]
    options  := key "=" value (";" key "=" value)*         the key `weight` sets the weight
    callable := dotted.module ":" function | path/to/file.py ":" function
    weight   := a finite number (negative allowed); default 1.0

Examples: `exact_match`, `format=0.5`, `overlong=0.5:max_len=512;cache_len=128`,
`format:pattern=^<think>;weight=0.5`, `mypkg.rewards:score=2`, `./my_reward.py:score`.

A value ends at the next top-level ";" or ",". Commas and semicolons inside balanced (), [], {}
or inside quotes do not split, so `format:pattern=\\d{1,3}` needs no quoting; otherwise quote the
value with '...' or "..." (inside quotes only a backslash before the quote character is an escape;
every other backslash is kept, as regexes need). A backslash outside quotes also protects the
next character from splitting and bracket counting. A builtin name wins over a module of the same
name ("format:x" is the format reward with option x, not function x of a module named format).
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Iterable

from pydantic import Field

from grpo_pilot.engine.data.callables import is_callable_ref
from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen

_OPEN, _CLOSE = "([{", ")]}"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RewardTerm(Frozen):
    """One term of a reward spec."""

    kind: str = Field(pattern="^(builtin|callable)$", description="'builtin' or 'callable' (a user function).")
    name: str = Field(min_length=1, description="Built-in name, or the callable reference as written.")
    weight: float = Field(default=1.0, description="Multiplier of this term in the weighted sum.")
    options: dict[str, str] = Field(default_factory=dict, description="Raw option values (builtins only).")


def split_top_level(text: str, sep: str) -> list[str]:
    """Split at `sep` outside quotes and balanced brackets; a backslash protects the next character."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote, i = 0, "", 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"" and (not current or "".join(current).endswith("=")):
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE and depth > 0:
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
            i += 1
            continue
        current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def unquote(value: str) -> str:
    """Strip matching outer quotes; inside them `\\<quote>` becomes the quote, other text is kept."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        q = value[0]
        return value[1:-1].replace("\\" + q, q)
    return value


def parse_weight(text: str, term: str) -> float:
    try:
        weight = float(text.strip())
    except ValueError:
        weight = math.nan
    if not math.isfinite(weight):
        raise InputError(
            f"Reward term '{term}': weight '{text.strip()}' is not a finite number.",
            "A weight follows '=' (format=0.5); options follow ':' (char_fraction:char=a).",
        )
    return weight


def parse_options(text: str, term: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in split_top_level(text, ";"):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not _NAME.fullmatch(key):
            raise InputError(
                f"Reward term '{term}': option '{item.strip()}' is not of the form key=value.",
                "Separate options with ';', e.g. overlong:max_len=512;cache_len=128.",
            )
        if key in options:
            raise InputError(f"Reward term '{term}': option '{key}' is given twice.", "Give each option once.")
        options[key] = unquote(value)
    return options


def _unknown(term: str, builtins: Iterable[str]) -> InputError:
    names = sorted(builtins)
    head = _NAME.match(term)
    close = difflib.get_close_matches(head.group(0) if head else term, names, n=1)
    maybe = f" Did you mean '{close[0]}'?" if close else ""
    return InputError(
        f"Unknown reward '{term}'.{maybe}",
        f"Built-ins: {', '.join(names)}; or a user function as module:function or path/to/file.py:function.",
    )


def _builtin_term(term: str, name: str, rest: str) -> RewardTerm:
    weight_text, options_text = "", ""
    if rest.startswith("="):
        weight_text, _, options_text = rest[1:].partition(":")
    elif rest.startswith(":"):
        options_text = rest[1:]
    options = parse_options(options_text, term) if options_text.strip() else {}
    weight = parse_weight(weight_text, term) if weight_text else 1.0
    if "weight" in options:
        if weight_text:
            raise InputError(
                f"Reward term '{term}' gives its weight twice.", "Use either name=WEIGHT or the weight= option."
            )
        weight = parse_weight(options.pop("weight"), term)
    return RewardTerm(kind="builtin", name=name, weight=weight, options=options)


def _callable_term(term: str) -> RewardTerm | None:
    ref, eq, weight_text = term.rpartition("=")
    if eq and is_callable_ref(ref.strip()):
        return RewardTerm(kind="callable", name=ref.strip(), weight=parse_weight(weight_text, term))
    if is_callable_ref(term):
        return RewardTerm(kind="callable", name=term)
    return None


def parse_spec(spec: str, builtins: Iterable[str]) -> tuple[RewardTerm, ...]:
    """The terms of `spec`, in order; `builtins` are the names that are built-in rewards."""
    names = set(builtins)
    if not spec or not spec.strip():
        raise InputError(
            "The reward spec is empty.", f"Name a reward, e.g. exact_match; built-ins: {', '.join(sorted(names))}."
        )
    terms: list[RewardTerm] = []
    for raw in split_top_level(spec, ","):
        term = raw.strip()
        if not term:
            raise InputError(f"The reward spec '{spec}' has an empty term.", "Separate terms with single commas.")
        head = _NAME.match(term)
        rest = term[head.end() :].lstrip() if head else term
        if head and head.group(0) in names and (not rest or rest[0] in "=:"):
            terms.append(_builtin_term(term, head.group(0), rest))
            continue
        parsed = _callable_term(term)
        if parsed is None:
            raise _unknown(term, names)
        terms.append(parsed)
    return tuple(terms)
