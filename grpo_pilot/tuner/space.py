"""The tuner's search space: which knobs a sweep of *real* runs varies, and over which values.

A real trial costs seconds to minutes, so this grid is coarser than the planner's analytic one
(`planner.search`, which evaluates thousands of candidates a second): utilisation in steps of 0.1,
powers of two for batches and token budgets. Only knobs that mean something on the plan's hardware
and layout are dimensions; every other knob keeps the input plan's value:

- `rollout_tp` (colocated placement only): powers of two up to the GPUs of one node that divide the
  world size, the attention heads and the kv heads (vLLM rules). `ulysses_sp` is not a dimension: every
  trial runs on grpo-run, which has no Ulysses sequence parallelism (`ExecutorTraits.missing_knobs`), so
  such a point could only crash;
- `gpu_memory_utilization`, `enforce_eager` (CUDA graphs): vLLM rollout only, the latter on a GPU;
- `update_batch`: a fixed micro-batch ("micro:4", dividing the per-GPU mini-batch) or a token budget
  ("tokens:6144" = verl's dynamic batching, whole sequences of prompt + response);
- `log_prob_max_token_len_per_gpu`: whole sequences; only when the step runs a log-prob pass (a KL
  reference, or old log-probs because the batch is split into several updates);
- offloads: on a GPU only (on the `cpu` pseudo-device host RAM *is* device memory).

Dimensions hold Optuna-storable values (str, int, float, bool); `knobs_at` turns a point into `Knobs`.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Mapping

from pydantic import Field

from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.knob_space import TRIAL_GRID, UPDATE_BATCH, knob_choices, knobs_at_point, update_batch_value
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.traits import traits_for

Value = str | int | float | bool
# Every trial runs on grpo-run, whatever executor the plan was made for.
TRIAL_EXECUTOR = traits_for("grpo-pilot")


class TuneSpace(Frozen):
    """Free dimensions (name → ordered choices) over the input plan's knobs (`base`)."""

    choices: dict[str, tuple[Value, ...]] = Field(description="Dimension -> choices; knob names and 'update_batch'.")
    base: Knobs = Field(description="Knob values for everything that is not a dimension (the input plan's).")

    @property
    def size(self) -> int:
        n = 1
        for values in self.choices.values():
            n *= len(values)
        return n

    def restrict(self, names: tuple[str, ...] | list[str]) -> "TuneSpace":
        """The same space with only `names` left as dimensions (the others keep the base values)."""
        return TuneSpace(choices={k: v for k, v in self.choices.items() if k in names}, base=self.base)


def build_space(plan: Plan) -> TuneSpace:
    """The real-run space around `plan` (its knobs are the base and always a point of the space): the shared
    builder (`knob_space.knob_choices`) on the trial grid for our engine; with split placement the rollout
    TP stays the plan's (the split layout's replicas are fixed by the plan's pools)."""
    knobs = plan.knobs
    fixed = frozenset({"rollout_tp"}) if knobs.placement == "split" else frozenset()
    choices = knob_choices(
        plan.model.spec,
        plan.cluster,
        plan.workload,
        include=knobs,
        executor=TRIAL_EXECUTOR,
        grid=TRIAL_GRID,
        fixed=fixed,
    )
    return TuneSpace(choices=choices, base=knobs)


def knobs_at(space: TuneSpace, params: Mapping[str, Any]) -> Knobs:
    """Knobs of one point (dimensions not in `params` keep the base values)."""
    return knobs_at_point(space.base.model_dump(), params)


def params_of(space: TuneSpace, knobs: Knobs) -> dict[str, Value] | None:
    """The point of the space matching `knobs`, or None when some knob is off the space."""
    out: dict[str, Value] = {}
    for name, options in space.choices.items():
        value = update_batch_value(knobs) if name == UPDATE_BATCH else getattr(knobs, name)
        if value not in options:
            return None
        out[name] = value
    if knobs_at(space, out) != knobs:
        return None  # a knob that is not a dimension differs from the base
    return out


def grid(space: TuneSpace) -> Iterator[dict[str, Value]]:
    """Every point of the space in a fixed order."""
    names = list(space.choices)
    for combo in itertools.product(*(space.choices[n] for n in names)):
        yield dict(zip(names, combo))


def point_key(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A hashable identity of a point (for de-duplication)."""
    return tuple(sorted(params.items()))
