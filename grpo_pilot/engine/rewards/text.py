"""Text built-ins: `exact_match`, `format`, `char_fraction`, `length`, `overlong`.

Each built-in is an options model (validated from the spec's key=value strings) and a `make`
function returning a scorer `ScoreBatch -> list[float]`.

- exact_match: 1.0 when the completion's final answer equals the record's answer (see answers.py).
- format: 1.0 when the regex matches the completion (full or partial match), else 0.0. Compiled with
  re.DOTALL so `.` spans lines. Default: a `<think>...</think>` block followed by a non-empty answer
  (the DeepSeek-R1 output format, arXiv 2501.12948 §2.2.1).
- char_fraction: count(char) / len(completion) (0.0 for an empty completion): the learnable toy
  reward for a random-init model (reference/grpo.md, "Tasks that show learning on CPU").
- length: plain penalty -min(L, max_len) / max_len in [-1, 0]; a negative weight makes it a bonus.
- overlong: DAPO soft overlong punishment (arXiv 2503.14476, eq. 13): 0 for L <= max_len - cache_len,
  ((max_len - cache_len) - L) / cache_len up to max_len, -1 beyond. L counts `unit`: tokens (as in
  the paper; the engine passes exact counts) or chars.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from grpo_pilot.engine.rewards.answers import answers_match, completion_answer
from grpo_pilot.engine.rewards.result import ScoreBatch, Scorer
from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen

DEFAULT_FORMAT_PATTERN = r"\s*<think>.*?</think>\s*\S.*"

LengthUnit = Literal["tokens", "chars"]


class ExactMatchOptions(Frozen):
    rel_tol: float = Field(default=1e-6, ge=0.0, le=1.0, description="Relative tolerance of numeric comparison.")


def make_exact_match(opts: ExactMatchOptions) -> Scorer:
    def score(batch: ScoreBatch) -> list[float]:
        out = []
        for completion, record in zip(batch.completions, batch.records):
            ok = answers_match(completion_answer(completion), str(record.answer), rel_tol=opts.rel_tol)
            out.append(1.0 if ok else 0.0)
        return out

    return score


class FormatOptions(Frozen):
    pattern: str = Field(default=DEFAULT_FORMAT_PATTERN, min_length=1, description="Python regex (re.DOTALL).")
    match: Literal["full", "partial"] = Field(default="full", description="full: re.fullmatch; partial: re.search.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value, re.DOTALL)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc})") from exc
        return value


def make_format(opts: FormatOptions) -> Scorer:
    regex = re.compile(opts.pattern, re.DOTALL)
    test = regex.fullmatch if opts.match == "full" else regex.search

    def score(batch: ScoreBatch) -> list[float]:
        return [1.0 if test(c) else 0.0 for c in batch.completions]

    return score


class CharFractionOptions(Frozen):
    char: str = Field(default="a", min_length=1, max_length=1, description="The target character.")


def char_fraction(text: str, char: str) -> float:
    return text.count(char) / len(text) if text else 0.0


def make_char_fraction(opts: CharFractionOptions) -> Scorer:
    def score(batch: ScoreBatch) -> list[float]:
        return [char_fraction(c, opts.char) for c in batch.completions]

    return score


class LengthOptions(Frozen):
    max_len: int = Field(gt=0, description="Length at which the penalty reaches -1.")
    unit: LengthUnit = Field(default="tokens", description="Count tokens or chars.")


def length_penalty(length: int, max_len: int) -> float:
    return -min(length, max_len) / max_len


def make_length(opts: LengthOptions) -> Scorer:
    def score(batch: ScoreBatch) -> list[float]:
        return [length_penalty(n, opts.max_len) for n in batch.lengths(opts.unit, "length")]

    return score


class OverlongOptions(Frozen):
    max_len: int = Field(gt=0, description="L_max: the longest allowed response.")
    cache_len: int = Field(gt=0, description="L_cache: the soft-penalty interval before L_max.")
    unit: LengthUnit = Field(default="tokens", description="Count tokens (DAPO) or chars.")

    @model_validator(mode="after")
    def _cache_within_max(self) -> "OverlongOptions":
        if self.cache_len > self.max_len:
            raise ValueError(f"cache_len ({self.cache_len}) must not exceed max_len ({self.max_len})")
        return self


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    """DAPO eq. 13: 0, then a linear ramp to -1 over the last cache_len units, -1 past max_len."""
    expected = max_len - cache_len
    if length <= expected:
        return 0.0
    if length <= max_len:
        return (expected - length) / cache_len
    return -1.0


def make_overlong(opts: OverlongOptions) -> Scorer:
    def score(batch: ScoreBatch) -> list[float]:
        return [overlong_penalty(n, opts.max_len, opts.cache_len) for n in batch.lengths(opts.unit, "overlong")]

    return score


def require_field(batch: ScoreBatch, field: str, reward: str) -> None:
    """Raise `InputError` naming the lines whose record lacks `field` (answer or tests)."""
    missing = sorted({r.line for r in batch.records if not getattr(r, field)})
    if missing:
        lines = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise InputError(
            f"The '{reward}' reward needs a reference {field}, but the records of line(s) {lines} have none.",
            f'Add "{field}" to those lines of the prompt file, or choose another reward.',
        )
