"""What a reward scorer receives (`ScoreBatch`) and what the reward model returns (`RewardResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pydantic import Field, model_validator

from grpo_pilot.engine.data.records import PromptRecord
from grpo_pilot.engine.finite import FLOAT32_HINT, NonFiniteError, fits_float32
from grpo_pilot.errors import InputError, RunError
from grpo_pilot.models import Frozen


@dataclass(frozen=True)
class ScoreBatch:
    """One scoring call: completion i answers records[i]; `num_tokens[i]` is its length in tokens if known."""

    completions: Sequence[str]
    records: Sequence[PromptRecord]
    num_tokens: Sequence[int] | None = None
    tokenizer: Any = None

    def lengths(self, unit: str, reward: str) -> list[int]:
        """Completion lengths in 'chars' or 'tokens' (token counts from the engine, else the tokenizer)."""
        if unit == "chars":
            return [len(c) for c in self.completions]
        if self.num_tokens is not None:
            return [int(n) for n in self.num_tokens]
        if self.tokenizer is not None:
            return [len(self.tokenizer.encode(c, add_special_tokens=False)) for c in self.completions]
        raise InputError(
            f"The '{reward}' reward counts tokens but has neither token counts nor a tokenizer.",
            f"Use {reward}:unit=chars, or pass num_tokens= to score() / tokenizer= to build_reward().",
        )


Scorer = Callable[[ScoreBatch], list[float]]
"""A reward part: one float per completion of the batch."""


def _digits(item: Any) -> int:
    try:
        return int(int(abs(item)).bit_length() * math.log10(2)) + 1
    except (TypeError, ValueError, OverflowError):
        return 0


def checked_scores(values: object, count: int, label: str) -> tuple[float, ...]:
    """`values` as floats after checking there is one real number per completion, finite in float32 (the
    precision of the advantages: engine/finite.py). A mapping or a set is refused, not read by its keys."""
    if isinstance(values, (str, bytes, dict, set, frozenset)) or not hasattr(values, "__len__"):
        raise RunError(
            f"The reward '{label}' returned {type(values).__name__}, not a list of numbers.",
            "Return one float per completion, as a list (or tuple) in the order of the completions.",
        )
    items = list(values)  # type: ignore[call-overload]
    if len(items) != count:
        raise RunError(
            f"The reward '{label}' returned {len(items)} scores for {count} completions.",
            "Return one float per completion.",
        )
    out: list[float] = []
    for i, item in enumerate(items):
        if isinstance(item, (str, bytes)) or item is None:
            raise RunError(
                f"The reward '{label}' returned {item!r} for completion {i}; a number is needed.", "Return floats."
            )
        try:
            value = float(item)
        except OverflowError:  # an int beyond any float, e.g. 10**400
            raise NonFiniteError(
                f"The reward '{label}' returned a number of about {_digits(item)} digits for completion {i}, "
                "beyond float32.",
                FLOAT32_HINT,
                phase="reward",
            ) from None
        except (TypeError, ValueError) as exc:
            raise RunError(
                f"The reward '{label}' returned {type(item).__name__} for completion {i}; a number is needed.",
                "Return floats.",
            ) from exc
        if not math.isfinite(value):
            raise NonFiniteError(
                f"The reward '{label}' returned {value} for completion {i}.",
                "Rewards must be finite numbers.",
                phase="reward",
            )
        if not fits_float32(value):
            raise NonFiniteError(
                f"The reward '{label}' returned {value:g} for completion {i}, beyond float32.",
                FLOAT32_HINT,
                phase="reward",
            )
        out.append(value)
    return tuple(out)


class RewardResult(Frozen):
    """Rewards of one batch: `total[i]` = sum over parts k of weights[k] * parts[k][i]."""

    total: tuple[float, ...] = Field(description="Weighted sum per completion (what the advantages use).")
    parts: dict[str, tuple[float, ...]] = Field(description="Unweighted score of each part per completion, by label.")
    weights: dict[str, float] = Field(description="Weight of each part, by the same labels.")

    @model_validator(mode="after")
    def _consistent(self) -> "RewardResult":
        if set(self.parts) != set(self.weights):
            raise ValueError("parts and weights must have the same labels")
        for label, scores in self.parts.items():
            if len(scores) != len(self.total):
                raise ValueError(f"part '{label}' has {len(scores)} scores for {len(self.total)} completions")
        return self

    def mean(self, label: str | None = None) -> float:
        """Mean of the total (or of one part); 0.0 for an empty batch."""
        values = self.total if label is None else self.parts[label]
        return sum(values) / len(values) if values else 0.0
