"""The tuner's search space: which knobs a sweep of *real* runs varies, and over which values.

A real trial costs seconds to minutes, so this grid is coarser than the planner's analytic one
(`planner.search`, which evaluates thousands of candidates a second): utilisation in steps of 0.1,
powers of two for batches and token budgets. Only knobs that mean something on the plan's hardware
and layout are dimensions; every other knob keeps the input plan's value:

- `rollout_tp` (colocated placement only): powers of two up to the GPUs of one node that divide the
  world size, the attention heads and the kv heads (vLLM rules). `ulysses_sp` is not a dimension: every
  trial runs on grpo-run, which refuses Ulysses sequence parallelism (`engine/assemble.py`), so such a
  point could only crash;
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
from grpo_pilot.planner.config import Knobs, old_logprob_pass_needed
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.search import UPDATE_BATCH, knobs_at_point, update_batch_value

UTILIZATION_CHOICES: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
BATCH_POWERS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
PARALLEL_CHOICES: tuple[int, ...] = (1, 2, 4, 8)
OFFLOAD_KNOBS: tuple[str, ...] = ("param_offload", "optimizer_offload", "ref_param_offload")

Value = str | int | float | bool


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


def _divides_heads(heads: int, kv_heads: int, k: int) -> bool:
    return heads % k == 0 and (kv_heads % k == 0 or k % kv_heads == 0)


def _with(values: tuple[Value, ...], extra: Value) -> tuple[Value, ...]:
    """Choices plus the input plan's own value (so the plan itself is a point of the space)."""
    return tuple(sorted(set(values) | {extra}, key=lambda v: (str(type(v)), v)))


def _update_batch_sort_key(label: str) -> tuple[str, int]:
    kind, _, number = label.partition(":")
    return kind, int(number)


def build_space(plan: Plan) -> TuneSpace:
    """The real-run space around `plan` (its knobs are the base and always a point of the space)."""
    knobs, spec, cluster, workload = plan.knobs, plan.model.spec, plan.cluster, plan.workload
    on_gpu = not cluster.gpu.is_cpu
    vllm = knobs.rollout_backend == "vllm"
    colocated = knobs.placement == "colocated"
    heads, kv = spec.num_attention_heads, spec.num_kv_heads
    world, per_node = cluster.world_size, cluster.gpus_per_node
    seq = workload.seq_len_tokens
    choices: dict[str, tuple[Value, ...]] = {}

    def parallel() -> tuple[int, ...]:
        return tuple(k for k in PARALLEL_CHOICES if k <= per_node and world % k == 0 and _divides_heads(heads, kv, k))

    if vllm and colocated:
        choices["rollout_tp"] = _with(parallel(), knobs.rollout_tp)
    if vllm:
        choices["gpu_memory_utilization"] = _with(UTILIZATION_CHOICES, knobs.gpu_memory_utilization)
    # per-GPU mini-batch in sequences (colocated: every GPU trains); a micro-batch must divide it
    data_parallel = max(1, world // knobs.ulysses_sp) if colocated else None
    per_gpu_mini = workload.mini_batch_prompts * workload.n // data_parallel if data_parallel else None
    micro = tuple(
        f"micro:{m}" for m in BATCH_POWERS if per_gpu_mini is None or (m <= per_gpu_mini and per_gpu_mini % m == 0)
    )
    budgets = tuple(f"tokens:{k * seq}" for k in BATCH_POWERS)
    choices[UPDATE_BATCH] = tuple(
        sorted(set(micro + budgets) | {update_batch_value(knobs)}, key=_update_batch_sort_key)
    )
    if workload.use_kl_loss or old_logprob_pass_needed(workload, plan.target):
        choices["log_prob_max_token_len_per_gpu"] = _with(
            tuple(k * seq for k in BATCH_POWERS), knobs.log_prob_max_token_len_per_gpu
        )
    choices["gradient_checkpointing"] = (False, True)
    choices["fused_logprob"] = (False, True)
    if on_gpu:
        for name in OFFLOAD_KNOBS:
            if name == "ref_param_offload" and not workload.use_kl_loss:
                continue  # no reference model without the KL loss
            choices[name] = (False, True)
        if vllm:
            choices["enforce_eager"] = (False, True)
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
