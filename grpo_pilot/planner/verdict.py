"""The verdict a plan reads as: fits, tight, fits below a length boundary, or does not fit.

`Plan.fits` is the strict check (every rule, usable memory = device − headroom, at the lengths the plan
judges). A user needs more than that boolean:

- **tight** — every rule holds except memory, and every memory excess lies inside the safety headroom:
  the peak is under the device's memory but over `device − headroom`. verl's own minimum-resource
  configurations land there with the default 5 % headroom (their peaks are real, the headroom is ours).
- **lengths unknown** — a launch that publishes no length statistics is judged with every sequence at its
  maximum (the worst case). When that does not fit and memory alone binds, the verdict says which lengths it
  rests on and where the boundary lies (spreads unknown and bounded as everywhere, see `lengths.py`):
  1. the largest mean response length with prompts kept at their maximum, by bisection on the mean response —
     "fits while the mean response stays under N tokens with prompts at their maximum (P)";
  2. only where no mean response fits so (prompts at their maximum can bind alone: verl scores every packed
     position, and a launch's max_prompt_length of 512–1024 often holds GSM8K prompts of 100–200 tokens), the
     largest point of a joint scale on which both means shrink together, step k of K = max(Pmax, Rmax) putting
     them at Pmax·k/K and Rmax·k/K (at least 1 token each) — "fits only with short prompts too: at a mean prompt
     of up to P and a mean response of up to N tokens". One scale, not a bisection on the prompt mean at
     1-token responses: it names both lengths the verdict rests on, neither at a corner no run reaches (a
     "fits with prompts under P" that holds only for 1-token responses), in one bounded bisection
     (1 + log2 K assessments, run only when step 1 found nothing); memory grows with either mean, so the
     boundary point, rounded down, fits, and the next step (one more token on the longer maximum's mean) does not;
  3. else "does not fit even at the shortest prompts and responses" (computed: 1-token means do not fit).
  A verl launch without remove-padding (`Knobs.remove_padding` False) pads every row to the maxima whatever the
  lengths: no boundary.
- **does not fit** — a rule other than memory is broken, or no length makes it fit.

Exit statuses of `grpo-plan` (errors.py): fits 0; tight and fits-below-a-boundary 4 (a conditional fit:
the plan is printed, not written); does not fit 3.
"""

from __future__ import annotations

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.constraints import violations
from grpo_pilot.planner.evaluate import Assessment, PlanInputs, assess, cheap_checks, largest_fitting
from grpo_pilot.planner.plan import Verdict
from grpo_pilot.units import GiB

MEMORY_RULES = ("memory.", "host_ram", "rollout.kv_cache")
GIVE_LENGTHS = (
    "the lengths are unknown: give --prompt-len-mean and --response-len-mean (or --lengths FILE) "
    "for a verdict on the data"
)


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


def _at_means(workload: Workload, *, prompt_tokens: float | None, response_tokens: float) -> Workload:
    """The workload with these means (a None prompt mean: prompts at their maximum)."""
    return workload.model_copy(
        update={"prompt_len_mean_tokens": prompt_tokens, "response_len_mean_tokens": float(response_tokens)}
    )


def mean_response_boundary(inputs: PlanInputs, knobs: Knobs) -> int | None:
    """The largest mean response length (tokens) at which `knobs` fit `inputs` (lengths unknown: prompts at
    their maximum, spreads bounded), by bisection; None when even a 1-token mean does not fit."""
    structural = cheap_checks(inputs, knobs)
    if violations(structural):
        return None
    w = inputs.workload

    def fits(mean: int) -> bool:
        at = _at_means(w, prompt_tokens=None, response_tokens=mean)
        return assess(inputs.model_copy(update={"workload": at}), knobs, structural).fits

    if not fits(1):
        return None
    return largest_fitting(fits, 1, w.response_len_tokens - 1)  # 1 fits; the maximum does not


def scale_steps(workload: Workload) -> int:
    """Steps of the joint length scale: the larger maximum, so that one step adds one token to its mean."""
    return max(workload.prompt_len_tokens, workload.response_len_tokens)


def scaled_means(workload: Workload, step: int) -> tuple[float, float]:
    """(mean prompt, mean response) tokens at `step` of the joint scale (module docstring): both maxima times
    step / `scale_steps`, at least 1 token each; step 1 is (1, 1), the last step the maxima."""
    share = step / scale_steps(workload)
    return max(1.0, workload.prompt_len_tokens * share), max(1.0, workload.response_len_tokens * share)


def mean_lengths_boundary(inputs: PlanInputs, knobs: Knobs) -> tuple[int, int] | None:
    """The largest (mean prompt, mean response) tokens on the joint scale at which `knobs` fit `inputs` (both
    rounded down, which fits as well: memory grows with either mean), by bisection on the step; None when even
    1-token means do not fit. At most 1 + log2(`scale_steps`) assessments."""
    structural = cheap_checks(inputs, knobs)
    if violations(structural):
        return None
    w = inputs.workload

    def fits(step: int) -> bool:
        prompt, response = scaled_means(w, step)
        at = _at_means(w, prompt_tokens=prompt, response_tokens=response)
        return assess(inputs.model_copy(update={"workload": at}), knobs, structural).fits

    if not fits(1):
        return None
    prompt, response = scaled_means(w, largest_fitting(fits, 1, scale_steps(w) - 1))
    return int(prompt), int(response)


def _boundary_verdict(inputs: PlanInputs, a: Assessment, over: int) -> Verdict | None:
    """Lengths unknown, memory alone binds: the boundary on the mean response with prompts at their maximum,
    else on both means together (module docstring); None when not even the shortest lengths fit."""
    w, give = inputs.workload, GIVE_LENGTHS
    boundary = mean_response_boundary(inputs, a.knobs) if w.response_len_tokens > 1 else None
    if boundary is not None:
        return Verdict(
            kind="fits_below_mean_response",
            lengths_known=False,
            boundary_mean_response_tokens=boundary,
            peak_over_device_bytes=over,
            message=f"fits while the mean response stays under {boundary + 1} tokens with prompts at their maximum "
            f"({w.prompt_len_tokens}); the maximum response, {w.response_len_tokens}, does not; {give}",
        )
    both = mean_lengths_boundary(inputs, a.knobs) if scale_steps(w) > 1 else None
    if both is None:
        return None
    prompt, response = both
    return Verdict(
        kind="fits_below_mean_lengths",
        lengths_known=False,
        boundary_mean_prompt_tokens=prompt,
        boundary_mean_response_tokens=response,
        peak_over_device_bytes=over,
        message=f"fits only with short prompts too: at a mean prompt of up to {prompt} and a mean response of up to "
        f"{response} tokens (both scaled down together from their maxima, {w.prompt_len_tokens}/"
        f"{w.response_len_tokens}; with prompts at their maximum no mean response fits); {give}",
    )


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
    if not known and not padded and _memory_only(a):
        boundary = _boundary_verdict(inputs, a, over)
        if boundary is not None:
            return boundary
    # "even at the shortest ..." only where that was computed: memory alone binds, and no lengths fit
    short = " even at the shortest prompts and responses" if not known and _memory_only(a) else ""
    if padded:
        short = " (use_remove_padding=False: every row is padded to the maxima, whatever the lengths)"
    return Verdict(
        kind="does_not_fit",
        lengths_known=known,
        peak_over_device_bytes=over,
        message=f"does not fit{short}",
    )
