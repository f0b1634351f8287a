"""Finite numbers in the precision the maths uses: rewards, advantages and gradients are float32.

A reward of 1e39 is finite in Python (float64) and infinite in float32, where the advantages, losses and
gradients are computed; one such value turns the whole update into NaN, and a NaN update written into a
checkpoint poisons every later step. These checks stop the run first, with a `NonFiniteError` (a run
failure: exit 1, failure.json kind "crash" with the phase and step) that names the number and where it
came from, before anything is applied or saved.
"""

from __future__ import annotations

import math

from grpo_pilot.engine.failures import CrashError

# The largest finite float32, (2 − 2^−23) · 2^127 (IEEE 754 binary32; torch.finfo(torch.float32).max).
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_HINT = (
    "Rewards, advantages and gradients are computed in float32 (finite up to ±3.4e38): scale the reward "
    "or its weight down (rewards of order 1 are what GRPO expects), or lower lr if the gradients diverged."
)


class NonFiniteError(CrashError):
    """A number the update needs is NaN or beyond float32; raised before any update is applied or saved."""


def fits_float32(value: float) -> bool:
    """Whether `value` is a finite float32 number (what rounding it to float32 keeps finite)."""
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX
