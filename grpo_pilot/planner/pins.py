"""Pinned knobs that can never pass a structural rule on these inputs: a bad pin, not "nothing fits".

`pin_conflicts(inputs, pins)` looks at the search's memory-frugal corners (`search.frugal_candidates`)
with and without the pins. A divisibility or size rule (`constraints.structural_checks`) that every
pinned corner breaks while some unpinned corner keeps is the pins' doing: `grpo-plan` reports it as
bad input (exit 2) naming the rule, instead of a memory verdict (exit 3). Rules that no corner can keep
even without pins (e.g. prompts × n not divisible by the GPUs) are the workload's, and stay a verdict.
Pure: no I/O, no engine imports.
"""

from __future__ import annotations

from typing import Any, Mapping

from grpo_pilot.planner.constraints import Check, violations
from grpo_pilot.planner.evaluate import PlanInputs, cheap_checks
from grpo_pilot.planner.search import build_space, frugal_candidates


def _broken(inputs: PlanInputs, pins: Mapping[str, Any]) -> list[dict[str, Check]]:
    """For every frugal corner of the space under `pins`: the structural rules it breaks, by name."""
    return [
        {c.rule: c for c in violations(cheap_checks(inputs, knobs))}
        for knobs in frugal_candidates(build_space(inputs, pins))
    ]


def pin_conflicts(inputs: PlanInputs, pins: Mapping[str, Any]) -> tuple[Check, ...]:
    """The structural rules the pins alone make impossible (empty when the pins are not the problem)."""
    if not pins:
        return ()
    pinned = _broken(inputs, pins)
    if not pinned:
        return ()
    always = set(pinned[0]).intersection(*pinned[1:])
    if not always:
        return ()
    free = _broken(inputs, {})
    keepable = {rule for rule in always if any(rule not in corner for corner in free)}
    return tuple(pinned[0][rule] for rule in sorted(keepable))
