"""The `Check` a rule yields and the helpers that build one (constraints.py, family_constraints.py)."""

from __future__ import annotations

from grpo_pilot.models import Frozen

BROKEN = 1.0  # excess of a broken divisibility rule


class Check(Frozen):
    """One rule evaluated for one configuration."""

    rule: str
    excess: float
    binding: str
    message: str

    @property
    def ok(self) -> bool:
        return self.excess <= 0.0


def check(rule: str, excess: float, binding: str, message: str) -> Check:
    # built thousands of times per search from values computed here: no validation in the loop
    return Check.model_construct(rule=rule, excess=float(excess), binding=binding, message=message)


def rule(rule: str, ok: bool, message: str) -> Check:
    return check(rule, 0.0 if ok else BROKEN, rule, "" if ok else message)
