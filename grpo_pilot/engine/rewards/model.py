"""`build_reward(spec)` -> `RewardModel`: a weighted sum of built-in and user reward parts.

`RewardModel.score(completions, records, num_tokens=None)` returns a `RewardResult` whose
`total[i] = sum_k weight_k * part_k[i]`; `parts` holds each part's unweighted scores under its
label (the built-in name or the callable reference; a repeated label gets "#2", "#3", ...).
`check_records(records)` raises an `InputError` naming the lines that lack a field a part needs
(`answer` for exact_match, `tests` for code) — call it once after loading, before training;
`score` checks the same fields on each batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from grpo_pilot.engine.data.records import PromptRecord
from grpo_pilot.engine.finite import FLOAT32_HINT, FLOAT32_MAX, NonFiniteError, fits_float32
from grpo_pilot.engine.rewards.registry import BUILTINS, SCORE_BOUND, build_options
from grpo_pilot.engine.rewards.result import RewardResult, ScoreBatch, Scorer, checked_scores
from grpo_pilot.engine.rewards.settings import RewardSettings
from grpo_pilot.engine.rewards.spec import RewardTerm, parse_spec
from grpo_pilot.engine.rewards.text import require_field
from grpo_pilot.engine.rewards.user import make_user_scorer
from grpo_pilot.errors import InputError


@dataclass(frozen=True)
class RewardPart:
    """One weighted part of a reward model."""

    label: str
    weight: float
    scorer: Scorer
    requires: tuple[str, ...]
    term: RewardTerm
    check: Callable[[Sequence[PromptRecord]], None] | None = None


class RewardModel:
    """Scores completions with a weighted sum of parts; build it with `build_reward`."""

    def __init__(self, parts: Sequence[RewardPart], *, spec: str, tokenizer: Any = None) -> None:
        if not parts:
            raise ValueError("a RewardModel needs at least one part")
        self.parts = tuple(parts)
        self.spec = spec
        self.tokenizer = tokenizer

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(p.label for p in self.parts)

    @property
    def required_fields(self) -> frozenset[str]:
        return frozenset(f for p in self.parts for f in p.requires)

    def describe(self) -> str:
        """Human-readable sum, e.g. '1 x exact_match + 0.5 x format'."""
        return " + ".join(f"{p.weight:g} x {p.label}" for p in self.parts)

    def close(self) -> None:
        """Stop the worker processes of user reward functions (and every process they started)."""
        for part in self.parts:
            close = getattr(part.scorer, "close", None)
            if callable(close):
                close()

    def check_records(self, records: Sequence[PromptRecord]) -> None:
        """Raise `InputError` if some record lacks a field one of the parts reads, or holds what a part
        cannot score (e.g. a code test the sandbox's reports cannot decide)."""
        batch = ScoreBatch(completions=[""] * len(records), records=records)
        for part in self.parts:
            for field in part.requires:
                require_field(batch, field, part.label)
            if part.check is not None:
                part.check(records)

    def score(
        self,
        completions: Sequence[str],
        records: Sequence[PromptRecord],
        *,
        num_tokens: Sequence[int] | None = None,
    ) -> RewardResult:
        """Rewards for completion i answering records[i]; `num_tokens[i]` is its token count if known."""
        if len(completions) != len(records):
            raise ValueError(f"{len(completions)} completions but {len(records)} records")
        if num_tokens is not None and len(num_tokens) != len(completions):
            raise ValueError(f"{len(num_tokens)} token counts for {len(completions)} completions")
        batch = ScoreBatch(completions=completions, records=records, num_tokens=num_tokens, tokenizer=self.tokenizer)
        parts: dict[str, tuple[float, ...]] = {}
        for part in self.parts:
            for field in part.requires:
                require_field(batch, field, part.label)
            parts[part.label] = checked_scores(part.scorer(batch), len(completions), part.label)
        total = tuple(sum(p.weight * parts[p.label][i] for p in self.parts) for i in range(len(completions)))
        for i, value in enumerate(total):
            if not fits_float32(value):
                raise NonFiniteError(
                    f"The weighted reward {self.describe()} is {value:g} for completion {i}, beyond float32.",
                    FLOAT32_HINT,
                    phase="reward",
                )
        return RewardResult(total=total, parts=parts, weights={p.label: p.weight for p in self.parts})


def _unique(label: str, taken: set[str]) -> str:
    if label not in taken:
        return label
    k = 2
    while f"{label}#{k}" in taken:
        k += 1
    return f"{label}#{k}"


def build_reward(spec: str, *, tokenizer: Any = None, settings: RewardSettings | None = None) -> RewardModel:
    """Parse `spec` (grammar in rewards/spec.py) and build every part; bad specs raise `InputError`.

    `tokenizer` is used only by length-type parts counting tokens when `score` gets no `num_tokens`;
    `settings` (default `RewardSettings()`) holds the user-code timeout and whether code may run unsandboxed.
    """
    settings = settings or RewardSettings()
    parts: list[RewardPart] = []
    taken: set[str] = set()
    for term in parse_spec(spec, BUILTINS):
        if term.kind == "builtin":
            builtin = BUILTINS[term.name]
            options = build_options(builtin, term.options)
            scorer = builtin.make(options, settings) if builtin.uses_settings else builtin.make(options)
            requires, check = builtin.requires, builtin.check_records
        else:
            scorer = make_user_scorer(term.name, timeout_s=settings.user_code_timeout_s)
            requires, check = (), None
        label = _unique(term.name, taken)
        taken.add(label)
        parts.append(
            RewardPart(label=label, weight=term.weight, scorer=scorer, requires=requires, term=term, check=check)
        )
    _check_weights(parts)
    return RewardModel(parts, spec=spec, tokenizer=tokenizer)


def _check_weights(parts: Sequence[RewardPart]) -> None:
    """Weights whose products with the scores cannot overflow float32 (engine/finite.py): each weight fits,
    and the built-ins, whose scores lie in [-SCORE_BOUND, SCORE_BOUND], cannot sum past float32's range."""
    for part in parts:
        if not fits_float32(part.weight):
            raise InputError(
                f"The weight {part.weight:g} of reward '{part.label}' is beyond float32 (±3.4e38), the precision "
                "rewards are trained in.",
                "Use weights of order 1.",
            )
    builtin_sum = sum(abs(p.weight) * SCORE_BOUND for p in parts if p.term.kind == "builtin")
    if builtin_sum > FLOAT32_MAX:
        raise InputError(
            f"The reward weights of {' + '.join(f'{p.weight:g} x {p.label}' for p in parts)} can sum to "
            f"{builtin_sum:g}, beyond float32 (±3.4e38), the precision rewards are trained in.",
            "Use weights of order 1.",
        )
