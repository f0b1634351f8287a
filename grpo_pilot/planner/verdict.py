"""The verdict a plan reads as: fits, tight, fits below a length boundary, or does not fit.

`Plan.fits` is the strict check (every rule, usable memory = device − headroom, at the lengths the plan
judges). A user needs more than that boolean:

- **tight** — every rule holds except memory, and every memory excess lies inside the safety headroom:
  the peak is under the device's memory but over `device − headroom`. verl's own minimum-resource
  configurations land there with the default 5 % headroom (their peaks are real, the headroom is ours).
- **lengths unknown** — a launch that publishes no length statistics is judged with every sequence at its
  maximum (the worst case). When that does not fit, the verdict says where the boundary lies: the largest
  mean response length (prompts kept at their maximum, spreads unknown and bounded as everywhere, see
  `lengths.py`) at which the same configuration fits — "fits while the mean response stays under N
  tokens" — or that it does not fit even at the shortest responses. A verl launch without remove-padding
  (`Knobs.remove_padding` False) pads every row to the maxima whatever the lengths: no boundary.
- **does not fit** — a rule other than memory is broken, or no length makes it fit.

Exit statuses of `grpo-plan` (errors.py): fits 0; tight and fits-below-a-boundary 4 (a conditional fit:
the plan is printed, not written); does not fit 3.
"""

from __future__ import annotations

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.constraints import violations
from grpo_pilot.planner.evaluate import Assessment, PlanInputs, assess, cheap_checks
from grpo_pilot.planner.plan import Verdict
from grpo_pilot.units import GiB

MEMORY_RULES = ("memory.", "host_ram", "rollout.kv_cache")


def lengths_unknown(workload: Workload) -> bool:
    """No length statistics given: the plan judges every sequence at its maximum."""
    return (
        workload.prompt_len_mean_tokens is None
        and workload.response_len_mean_tokens is None
        and workload.lengths_source is None
    )


def _memory_only(a: Assessment) -> bool:
    return all(c.rule.startswith(MEMORY_RULES) for c in violations(a.checks))


def _tight(inputs: PlanInputs, a: Assessment) -> bool:
    """Only GPU memory binds, and under the device: the excess lies inside the headroom."""
    broken = violations(a.checks)
    return (
        bool(broken)
        and all(c.rule.startswith("memory.") for c in broken)
        and a.memory.peak_gpu_bytes <= inputs.device_bytes
    )


def _at_mean(workload: Workload, mean_response_tokens: int) -> Workload:
    return workload.model_copy(update={"response_len_mean_tokens": float(mean_response_tokens)})


def mean_response_boundary(inputs: PlanInputs, knobs: Knobs) -> int | None:
    """The largest mean response length (tokens) at which `knobs` fit `inputs` (lengths unknown: prompts at
    their maximum, spreads bounded), by bisection; None when even a 1-token mean does not fit."""
    structural = cheap_checks(inputs, knobs)
    if violations(structural):
        return None
    w = inputs.workload

    def fits(mean: int) -> bool:
        return assess(inputs.model_copy(update={"workload": _at_mean(w, mean)}), knobs, structural).fits

    if not fits(1):
        return None
    lo, hi = 1, w.response_len_tokens - 1  # lo fits; the maximum does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def verdict_of(inputs: PlanInputs, a: Assessment) -> Verdict:
    """The verdict of an assessment of `inputs` (module docstring)."""
    known = not lengths_unknown(inputs.workload)
    over = a.memory.peak_gpu_bytes - inputs.device_bytes
    usable = inputs.usable_gpu_bytes / GiB
    if a.fits:
        return Verdict(kind="fits", lengths_known=known, peak_over_device_bytes=over, message="fits")
    if _tight(inputs, a):
        return Verdict(
            kind="tight",
            lengths_known=known,
            peak_over_device_bytes=over,
            message=f"tight: the peak {a.memory.peak_gpu_bytes / GiB:.1f} GiB is under the device's "
            f"{inputs.device_bytes / GiB:.1f} GiB but inside the {inputs.reserved_bytes / GiB:.1f} GiB headroom "
            f"(usable {usable:.1f} GiB)",
        )
    padded = not a.knobs.remove_padding  # every row at the maxima: shorter responses change nothing
    if not known and not padded and _memory_only(a) and inputs.workload.response_len_tokens > 1:
        boundary = mean_response_boundary(inputs, a.knobs)
        if boundary is not None:
            return Verdict(
                kind="fits_below_mean_response",
                lengths_known=False,
                boundary_mean_response_tokens=boundary,
                peak_over_device_bytes=over,
                message=f"fits while the mean response stays under {boundary + 1} tokens (the maximum, "
                f"{inputs.workload.response_len_tokens}, does not); the lengths are unknown: give "
                "--response-len-mean (or --lengths FILE) for a verdict on the data",
            )
    # "even at the shortest responses" only where that was computed: memory alone binds, and no mean fits
    short = " even at the shortest responses" if not known and _memory_only(a) else ""
    if padded:
        short = " (use_remove_padding=False: every row is padded to the maxima, whatever the lengths)"
    return Verdict(
        kind="does_not_fit",
        lengths_known=known,
        peak_over_device_bytes=over,
        message=f"does not fit{short}",
    )
