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
- offloads: on a GPU only (on the `cpu` pseudo-device host RAM *is* device memory);
- with `sweep_adapter` (grpo-tune --sweep-adapter, a plan with workload.adapter): `lora_rank` over `LORA_RANKS` and
  `lora_targets` over `LORA_TARGET_SETS` (plus the plan's own), which are workload settings, not knobs:
  `inputs_at` puts a point's adapter into the trial plan's workload, keeping the plan's alpha / rank ratio (the
  adapter's scaling s = alpha / r) so that rank alone changes.

Dimensions hold Optuna-storable values (str, int, float, bool); `knobs_at` turns a point into `Knobs`.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Mapping

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.planner.adapters import AdapterSettings
from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.knob_space import TRIAL_GRID, UPDATE_BATCH, knob_choices, knobs_at_point, update_batch_value
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.traits import traits_for

Value = str | int | float | bool
# Every trial runs on grpo-run, whatever executor the plan was made for.
TRIAL_EXECUTOR = traits_for("grpo-pilot")
LORA_RANK, LORA_TARGETS = "lora_rank", "lora_targets"
ADAPTER_DIMS = (LORA_RANK, LORA_TARGETS)
LORA_RANKS = (8, 16, 32, 64)  # vLLM's max_lora_rank steps in this range (docs/families.md §2: 1, 8, 16, 32, 64, ...)
# every linear but the head (verl's target_modules default), attention only, and peft's llama/qwen default q and v
LORA_TARGET_SETS = ("all-linear", "q_proj,k_proj,v_proj,o_proj", "q_proj,v_proj")


class TuneSpace(Frozen):
    """Free dimensions (name → ordered choices) over the input plan's knobs (`base`)."""

    choices: dict[str, tuple[Value, ...]] = Field(description="Dimension -> choices; knob names and 'update_batch'.")
    base: Knobs = Field(description="Knob values for everything that is not a dimension (the input plan's).")
    base_adapter: AdapterSettings | None = Field(
        default=None, description="The input plan's adapter (the base of the lora_rank / lora_targets dimensions)."
    )

    @property
    def size(self) -> int:
        n = 1
        for values in self.choices.values():
            n *= len(values)
        return n

    def restrict(self, names: tuple[str, ...] | list[str]) -> "TuneSpace":
        """The same space with only `names` left as dimensions (the others keep the base values)."""
        kept = {k: v for k, v in self.choices.items() if k in names}
        return TuneSpace(choices=kept, base=self.base, base_adapter=self.base_adapter)


def build_space(plan: Plan, *, sweep_adapter: bool = False) -> TuneSpace:
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
    adapter = plan.workload.adapter
    if sweep_adapter:
        if adapter is None or adapter.method == "none":
            raise InputError(
                "--sweep-adapter varies the LoRA rank and target modules of a plan that trains adapters; this plan "
                "fine-tunes every parameter.",
                "Make the plan with grpo-plan --lora-rank R (and --lora-targets), then tune it.",
            )
        choices[LORA_RANK] = tuple(sorted({*LORA_RANKS, adapter_value(adapter, LORA_RANK)}))
        own = adapter_value(adapter, LORA_TARGETS)
        choices[LORA_TARGETS] = LORA_TARGET_SETS if own in LORA_TARGET_SETS else (*LORA_TARGET_SETS, own)
    return TuneSpace(choices=choices, base=knobs, base_adapter=adapter)


def adapter_value(adapter: AdapterSettings, dim: str) -> Value:
    """The value of adapter dimension `dim` for `adapter` (targets as one comma-separated string)."""
    if dim == LORA_RANK:
        return adapter.rank or 8  # peft LoraConfig.r default (engine/lora.py)
    return ",".join(adapter.target_modules or ("q_proj", "v_proj"))  # peft's default for llama / qwen2 / qwen3


def adapter_at(adapter: AdapterSettings | None, params: Mapping[str, Any]) -> AdapterSettings | None:
    """`adapter` with a point's lora_rank / lora_targets (alpha scaled with the rank: the same alpha / r)."""
    if adapter is None or not any(d in params for d in ADAPTER_DIMS):
        return adapter
    rank = int(params.get(LORA_RANK, adapter_value(adapter, LORA_RANK)))
    targets = str(params.get(LORA_TARGETS, adapter_value(adapter, LORA_TARGETS)))
    if (rank, targets) == (adapter_value(adapter, LORA_RANK), adapter_value(adapter, LORA_TARGETS)):
        return adapter
    alpha = None if adapter.alpha is None else adapter.alpha * rank / (adapter.rank or 8)
    keys = (*adapter.keys, f"grpo-tune {LORA_RANK}={rank}", f"grpo-tune {LORA_TARGETS}={targets}")
    update = {"rank": rank, "alpha": alpha, "target_modules": tuple(targets.split(",")), "keys": keys}
    return adapter.model_copy(update=update)


def inputs_at(space: TuneSpace, inputs: Any, params: Mapping[str, Any]) -> Any:
    """The planner inputs of one point: the base inputs, with the point's adapter in the workload."""
    adapter = adapter_at(space.base_adapter, params)
    if adapter == inputs.workload.adapter:
        return inputs
    return inputs.model_copy(update={"workload": inputs.workload.model_copy(update={"adapter": adapter})})


def knobs_at(space: TuneSpace, params: Mapping[str, Any]) -> Knobs:
    """Knobs of one point (dimensions not in `params` keep the base values; adapter dimensions are no knobs)."""
    return knobs_at_point(space.base.model_dump(), {k: v for k, v in params.items() if k not in ADAPTER_DIMS})


def params_of(space: TuneSpace, knobs: Knobs) -> dict[str, Value] | None:
    """The point of the space matching `knobs` (and the base adapter), or None when some knob is off the space."""
    out: dict[str, Value] = {}
    for name, options in space.choices.items():
        if name in ADAPTER_DIMS:
            value = adapter_value(space.base_adapter, name) if space.base_adapter is not None else None
        elif name == UPDATE_BATCH:
            value = update_batch_value(knobs)
        else:
            value = getattr(knobs, name)
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
