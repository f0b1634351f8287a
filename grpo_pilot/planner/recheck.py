"""Re-check a plan.json before it runs: the planner's verdict recomputed from the plan's own inputs.

A plan file is user input: it may be marked `"fits": false`, hand-edited (100,000 completions per
prompt, a knob the cluster cannot take), or written by an older planner. `recheck(plan)` evaluates
the plan's knobs for its model, cluster and workload with the current estimator (`evaluate.assess`)
and returns what a run must know: whether the file says it fits, whether the estimate says so, the
violated rules (worst first), and whether the file's own predicted peak memory — and each phase's tensor
items — is what its inputs give.
A plan whose workload was edited by hand (say to 100,000 completions) keeps the old numbers, and this
is how it shows (the step time is only reported: knobs the engine refuses change it, and the engine
says why). `grpo-run` refuses a plan that does not fit either way unless `--force` (exit 3), and one
whose peak or any phase's tensors differ by more than `TOLERANCE` (exit 2: re-plan, or `--force`), before any model is
built. Pure: no I/O, no engine imports.
"""

from __future__ import annotations

from typing import Mapping

from pydantic import Field

from grpo_pilot.models import Frozen
from grpo_pilot.planner.constraints import violations
from grpo_pilot.planner.evaluate import Assessment, PlanInputs, assess
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.rules import phases_present

# The estimate is deterministic: an untouched plan of this version reproduces its numbers exactly. 10%
# leaves room for small model changes between versions; a hand edit of the workload moves them far more.
TOLERANCE = 0.10


def plan_inputs(plan: Plan) -> PlanInputs:
    """The planner inputs a plan was made from, with the analytic constants: trial plans predict with them
    (and say so: no calibration in their provenance), and a calibration fit starts from them."""
    # What the plan kept free of one device (older plans: device memory minus usable); on `Nxcpu` a device is
    # RAM / N, not the catalog's memory_bytes.
    kept = plan.headroom_bytes
    if kept is None:
        kept = plan.cluster.device_memory_bytes - plan.usable_gpu_bytes
    return PlanInputs(
        model=plan.model,
        cluster=plan.cluster,
        workload=plan.workload,
        target=plan.target,
        headroom_bytes=max(kept, 0),
    )


class Recheck(Frozen):
    """The verdict on a plan file before it runs."""

    file_fits: bool = Field(description="What the plan file says ('fits').")
    fits: bool = Field(description="Whether the plan's knobs fit its inputs by the current estimate.")
    violations: tuple[str, ...] = Field(default=(), description="Messages of the broken rules, worst first.")
    binding: str | None = Field(default=None, description="The worst broken rule's name.")
    mismatch: str | None = Field(
        default=None, description="How the file's own predictions differ from its inputs' (None: they agree)."
    )

    def reason(self) -> str:
        """Why the plan may not run, in one sentence."""
        why = (self.violations[0] if self.violations else "see grpo-plan's table for this plan").rstrip(".")
        if not self.file_fits:
            return f"the plan file is marked as not fitting ({why})"
        return f"re-checked with this planner, the plan does not fit: {self.binding}: {why}"


def _differs(recorded: int, now: int) -> bool:
    return abs(now - recorded) > TOLERANCE * max(recorded, 1)


def _size(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def tensor_bytes(items: Mapping[str, int]) -> int:
    """A phase's tensor items (every item but the `overhead_*` ones, which constants and calibrations set)."""
    return sum(v for k, v in items.items() if not k.startswith("overhead_"))


def _mismatch(plan: Plan, a: Assessment) -> str | None:
    """How the file's predictions differ from its inputs': the peak, or any phase's tensor items — on the cpu
    pseudo-device the process baseline dwarfs the tensors, so a knob edit moves the peak by less than
    `TOLERANCE` but the edited phase's tensors by far more."""
    recorded, now = plan.peak_gpu_bytes, a.memory.peak_gpu_bytes
    if _differs(recorded, now):
        return (
            f"peak memory {_size(recorded)} in the file, {_size(now)} from its inputs; step time "
            f"{plan.predicted_step_s:.3g} s in the file, {a.time.step_s:.3g} s from its inputs"
        )
    for phase in phases_present(set(plan.phases) | set(a.memory.phases)):  # a PPO plan adds the critic's
        file_tensors = tensor_bytes(plan.phases[phase].items) if phase in plan.phases else 0
        input_tensors = tensor_bytes(a.memory.phases[phase].items) if phase in a.memory.phases else 0
        if _differs(file_tensors, input_tensors):
            return f"{phase} tensors {_size(file_tensors)} in the file, {_size(input_tensors)} from its inputs"
    return None


def recheck(plan: Plan, inputs: PlanInputs | None = None) -> Recheck:
    """Evaluate the plan's knobs on its own inputs (module docstring). `inputs`: the plan's inputs with the
    calibration it was made with (`planner.calibration.inputs_of_plan`); default: the analytic constants."""
    a = assess(inputs or plan_inputs(plan), plan.knobs)
    broken = sorted(violations(a.checks), key=lambda c: -c.excess)
    return Recheck(
        mismatch=_mismatch(plan, a),
        file_fits=plan.fits,
        fits=a.fits,
        violations=tuple(c.message for c in broken) or plan.violations,
        binding=broken[0].rule if broken else plan.binding_constraint,
    )
