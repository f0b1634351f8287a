"""User reward functions: `module:function` or `path/to/file.py:function`.

Two shapes are accepted:
- per completion: `fn(completion: str, record: PromptRecord) -> float`
- batched:        `fn(completions: list[str], records: list[PromptRecord]) -> list[float]`

Which one a function is: its `batched` attribute when it has one (set by the `@batched_reward`
decorator, or by hand: `fn.batched = True`); otherwise batched when its first parameter is named
`completions` (or `texts`, `responses`) or annotated as a list/sequence; otherwise per completion.
The function runs in its own worker process (`callables.UserFunction`) with a per-call timeout:
exceptions (SystemExit and KeyboardInterrupt included), hangs, crashes and non-numeric results become
a `RunError` naming the function and the prompt line; a bad reference or signature is an `InputError`
raised when the reward is built.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

from grpo_pilot.engine.data.callables import (
    DEFAULT_USER_CODE_TIMEOUT_S,
    UserCodeError,
    UserFunction,
    user_code_hint,
)
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


def describe(fn: Callable[..., Any], ref: str) -> dict[str, bool]:
    """Runs in the worker process (`UserFunction(describe=...)`): check the signature, detect the shape."""
    _check_signature(fn, ref)
    return {"batched": is_batched(fn)}


def _run(worker: UserFunction, ref: str, calls: list[tuple[Any, ...]], lines: list[int | None]) -> list[Any]:
    """The function's value for each call; a failure is a `RunError` naming the function and the prompt line."""
    values: list[Any] = []
    try:
        for value in worker.map(calls):
            values.append(value)
    except UserCodeError as exc:
        line = lines[len(values)] if len(values) < len(lines) else None
        where = f" on the completion for prompt line {line}" if line is not None else ""
        raise RunError(
            f"The reward function '{ref}' {exc.text}{where}.",
            user_code_hint(exc, worker.timeout_s, "return a number for every completion"),
        ) from None
    return values


def make_user_scorer(ref: str, *, timeout_s: float = DEFAULT_USER_CODE_TIMEOUT_S) -> Scorer:
    """A scorer calling the user's function in its own worker process, `timeout_s` per call."""
    worker = UserFunction(ref, role="reward function", timeout_s=timeout_s, describe=f"{__name__}:describe")
    batched = bool(worker.info["batched"])

    def score(batch: ScoreBatch) -> list[float]:
        if batched:
            (values,) = _run(worker, ref, [(list(batch.completions), list(batch.records))], [None])
            return list(checked_scores(values, len(batch.completions), ref))
        calls = [(completion, record) for completion, record in zip(batch.completions, batch.records)]
        values = _run(worker, ref, calls, [record.line for record in batch.records])
        return [checked_scores([value], 1, ref)[0] for value in values]

    score.close = worker.close  # type: ignore[attr-defined]  # RewardModel.close stops the worker and its tree
    return score
