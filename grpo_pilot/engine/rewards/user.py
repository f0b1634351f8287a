"""User reward functions: `module:function` or `path/to/file.py:function`.

Two shapes are accepted:
- per completion: `fn(completion: str, record: PromptRecord) -> float`
- batched:        `fn(completions: list[str], records: list[PromptRecord]) -> list[float]`

Which one a function is: its `batched` attribute when it has one (set by the `@batched_reward`
decorator, or by hand: `fn.batched = True`); otherwise batched when its first parameter is named
`completions` (or `texts`, `responses`) or annotated as a list/sequence; otherwise per completion.
Exceptions and non-numeric results become a `RunError` naming the function and the prompt line.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

from grpo_pilot.engine.data.callables import load_callable
from grpo_pilot.engine.rewards.result import ScoreBatch, Scorer, checked_scores
from grpo_pilot.errors import InputError, RunError

BATCHED_NAMES = frozenset({"completions", "texts", "responses"})
_SEQUENCE_HINTS = ("list", "List", "Sequence", "tuple", "Tuple", "Iterable")

F = TypeVar("F", bound=Callable[..., Any])


def batched_reward(fn: F) -> F:
    """Mark `fn(completions, records) -> list[float]` as batched."""
    fn.batched = True  # type: ignore[attr-defined]
    return fn


def is_batched(fn: Callable[..., Any]) -> bool:
    flag = getattr(fn, "batched", None)
    if isinstance(flag, bool):
        return flag
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if not params:
        return False
    first = params[0]
    if first.name in BATCHED_NAMES:
        return True
    annotation = first.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None) or str(annotation)
    text = text.strip("'\"").removeprefix("typing.").removeprefix("collections.abc.")
    return any(text.startswith(hint) for hint in _SEQUENCE_HINTS)


def _check_signature(fn: Callable[..., Any], ref: str) -> None:
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError as exc:
        raise InputError(
            f"The reward function '{ref}' cannot be called with two arguments ({exc}).",
            "Define fn(completion, record) -> float or fn(completions, records) -> list[float].",
        ) from exc
    except ValueError:  # builtins without a signature: trust the user
        return


def _call(fn: Callable[..., Any], ref: str, args: tuple[Any, ...], line: int | None) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # user code: report which function and which prompt
        where = f" on the completion for prompt line {line}" if line is not None else ""
        raise RunError(
            f"The reward function '{ref}' raised {type(exc).__name__}: {exc}{where}.",
            "Fix the function; it must return a number for every completion.",
        ) from exc


def make_user_scorer(ref: str) -> Scorer:
    fn = load_callable(ref, role="reward function")
    _check_signature(fn, ref)
    batched = is_batched(fn)

    def score(batch: ScoreBatch) -> list[float]:
        if batched:
            values = _call(fn, ref, (list(batch.completions), list(batch.records)), None)
            return list(checked_scores(values, len(batch.completions), ref))
        out = []
        for completion, record in zip(batch.completions, batch.records):
            value = _call(fn, ref, (completion, record), record.line)
            out.extend(checked_scores([value], 1, ref))
        return out

    return score
