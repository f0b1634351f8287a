"""The knob space: which knobs a search may vary for given inputs, and over which values.

One builder for both searches: the planner's analytic search (`search.py`, thousands of candidates a
second: `ANALYTIC_GRID`) and the tuner's sweep of real runs (`tuner/space.py`, seconds to minutes a
trial: the coarser `TRIAL_GRID`). Dimensions:

- `rollout_tp` (vLLM): powers of two up to the GPUs of one node that divide the rollout GPUs and the
  heads (`rules.heads_divisible`); HF rollout generates on the policy itself, so TP is 1 (a one-value
  dimension when the included configuration says otherwise);
- `gpu_memory_utilization`, `enforce_eager`: vLLM only; CUDA graphs exist only on a GPU
  (`DeviceTraits.cuda_graphs`);
- `update_batch`: a fixed micro-batch ("micro:4") dividing the per-GPU mini-batch, or a token budget
  ("tokens:6144" = verl's dynamic batching) of whole longest sequences; the knobs of a pinned side stay;
- `log_prob_max_token_len_per_gpu`: whole sequences, only when the step runs a log-prob pass (a KL
  reference, or old log-probs: `config.old_logprob_pass_needed`);
- offloads: only where moving a state to the host frees device memory (`DeviceTraits.offload_meaningful`),
  the reference's only with a reference (KL loss) and not for verl's FSDP reference, which verl offloads
  whatever the key since #121 (planner/ref_offload.py `forced_ref_offload`: the key would move nothing);
- `gradient_checkpointing`, `fused_logprob`;
- `ulysses_sp`: powers of two that divide the training GPUs and the heads.
Launch families (`family_choices`; verl only — the other executors miss these knobs):
- the strategy is the user's (or the launch's) choice, never searched; under `strategy=megatron` the search
  moves `megatron_tp` (powers of two within a node dividing the heads and kv heads), `megatron_pp` (powers of
  two dividing the layers), `megatron_vpp` (1, 2), `megatron_cp` (1, 2) and `megatron_recompute` (none,
  selective, full); the FSDP-only knobs (gradient_checkpointing, ulysses_sp, activation_offload) are not
  dimensions there;
- `activation_offload` under FSDP; `layered_summon` with LoRA (the adapter sync's gather); the critic's
  offloads with PPO. LoRA's rank, targets and base quantization are the user's (Workload.adapter).
A knob the executor has no setting for (`ExecutorTraits.missing_knobs`) is never a dimension, nor is a
knob in `fixed` (the user's pins). `include` is a configuration the space must contain (verl's defaults
plus the pins for the planner, the input plan's knobs for the tuner): its values are added to the grid.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.planner.config import Knobs, Workload, old_logprob_pass_needed
from grpo_pilot.planner.ref_offload import forced_ref_offload
from grpo_pilot.planner.roofline import pools
from grpo_pilot.planner.rules import heads_divisible
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec

UPDATE_BATCH = "update_batch"
BOOL_KNOBS: tuple[str, ...] = (
    "param_offload",
    "optimizer_offload",
    "ref_param_offload",
    "gradient_checkpointing",
    "fused_logprob",
    "enforce_eager",
    "activation_offload",
    "layered_summon",
    "critic_param_offload",
    "critic_optimizer_offload",
)
OFFLOAD_KNOBS: tuple[str, ...] = (
    "param_offload",
    "optimizer_offload",
    "ref_param_offload",
    "activation_offload",
    "critic_param_offload",
    "critic_optimizer_offload",
)
FSDP_ONLY_KNOBS: tuple[str, ...] = ("gradient_checkpointing", "ulysses_sp", "activation_offload", "fsdp_size")
MEGATRON_PP = (1, 2, 4, 8)
MEGATRON_VPP = (1, 2)
MEGATRON_CP = (1, 2)
MEGATRON_RECOMPUTE = ("none", "selective", "full")


class KnobGrid(NamedTuple):
    """The values a search tries (before the rules prune them)."""

    utilizations: tuple[float, ...]
    micro_batches: tuple[int, ...]  # sequences per micro-batch
    budget_sequences: tuple[int, ...]  # token budgets in whole longest sequences
    parallel_degrees: tuple[int, ...]  # rollout TP and Ulysses SP


# Utilisation 0.30-0.90: verl's tuning guide works in 0.5-0.7, vLLM's own default is 0.9. Batches and budgets
# in powers of two.
ANALYTIC_GRID = KnobGrid(
    utilizations=tuple(round(0.30 + 0.05 * i, 2) for i in range(13)),
    micro_batches=(1, 2, 4, 8, 16, 32),
    budget_sequences=(1, 2, 4, 8, 16, 32),
    parallel_degrees=(1, 2, 4, 8),
)
TRIAL_GRID = ANALYTIC_GRID._replace(utilizations=(0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9))


# dimension -> the knob fields a point of it sets (`knobs_at_point`; the search leaves log-prob micro-batches to the
# token budget: a point's log_prob_micro_batch_size_per_gpu is the default None)
DIMENSION_FIELDS: dict[str, tuple[str, ...]] = {
    UPDATE_BATCH: ("micro_batch_size_per_gpu", "max_token_len_per_gpu"),
    "log_prob_max_token_len_per_gpu": ("log_prob_max_token_len_per_gpu", "log_prob_micro_batch_size_per_gpu"),
}


def searched_fields(dimensions: Iterable[str]) -> frozenset[str]:
    """The knob fields a search over these dimensions sets (the others keep their values)."""
    return frozenset(f for d in dimensions for f in DIMENSION_FIELDS.get(d, (d,)))


def update_batch_value(knobs: Knobs) -> str:
    """The `update_batch` label of knobs: 'tokens:N' with dynamic batching, else 'micro:N'."""
    if knobs.dynamic_batching:
        return f"tokens:{knobs.max_token_len_per_gpu}"
    return f"micro:{knobs.micro_batch_size_per_gpu}"


def knobs_at_point(values: dict[str, Any], params: dict[str, Any]) -> Knobs:
    """Knobs from `values` with a point's `params` set (its `update_batch` label decoded)."""
    out = dict(values)
    for name, value in params.items():
        if name == UPDATE_BATCH:
            kind, _, number = str(value).partition(":")
            if kind == "micro":
                out["micro_batch_size_per_gpu"], out["max_token_len_per_gpu"] = int(number), None
            else:
                out["max_token_len_per_gpu"] = int(number)
        else:
            out[name] = value
    return Knobs(**out)


def _with(values: tuple[Any, ...], extra: Any) -> tuple[Any, ...]:
    """Choices plus the value the space must include, in ascending order."""
    return tuple(sorted(set(values) | {extra}))


def _update_batch_key(label: str) -> tuple[str, int]:
    kind, _, number = label.partition(":")
    return kind, int(number)


def _update_batches(
    grid: KnobGrid, include: Knobs, fixed: frozenset[str], *, seq_tokens: int, per_gpu_mini: int
) -> tuple[str, ...] | None:
    """The joint micro-batch / token-budget dimension (None: both sides pinned)."""
    if "micro_batch_size_per_gpu" in fixed:
        return None
    micro = {f"micro:{m}" for m in grid.micro_batches if per_gpu_mini <= 0 or per_gpu_mini % m == 0}
    if "max_token_len_per_gpu" in fixed:
        if include.max_token_len_per_gpu is not None:
            return None  # a pinned token budget decides the micro-batches
        budgets: set[str] = set()  # dynamic batching pinned off: only fixed micro-batches
    else:
        budgets = {f"tokens:{k * seq_tokens}" for k in grid.budget_sequences}
    return tuple(sorted(micro | budgets | {update_batch_value(include)}, key=_update_batch_key))


def _parallel(grid: KnobGrid, spec: ModelSpec, *, per_node: int, pool_gpus: int) -> tuple[int, ...]:
    heads, kv = spec.num_attention_heads, spec.num_kv_heads
    ok = tuple(
        k for k in grid.parallel_degrees if k <= per_node and pool_gpus % k == 0 and heads_divisible(heads, kv, k)
    )
    return ok or (1,)


def knob_choices(
    spec: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    *,
    include: Knobs,
    executor: ExecutorTraits,
    grid: KnobGrid,
    fixed: frozenset[str] = frozenset(),
) -> dict[str, tuple[Any, ...]]:
    """Dimension name → ordered choices (module docstring)."""
    device = cluster.device
    rollout_gpus, train_gpus = pools(cluster, include)
    vllm = include.rollout_backend != "hf"  # an engine (vLLM or SGLang) with its own TP and utilisation
    free = {name for name in Knobs.model_fields if name not in fixed and executor.has_knob(name)}
    choices: dict[str, tuple[Any, ...]] = {}
    if "rollout_tp" in free and vllm:
        choices["rollout_tp"] = _parallel(grid, spec, per_node=cluster.gpus_per_node, pool_gpus=rollout_gpus)
    elif "rollout_tp" in free and include.rollout_tp != 1:
        choices["rollout_tp"] = (1,)  # HF rollout generates on the policy itself: no rollout TP
    if vllm and "gpu_memory_utilization" in free:
        choices["gpu_memory_utilization"] = _with(grid.utilizations, include.gpu_memory_utilization)
    dp = train_gpus // include.ulysses_sp if include.ulysses_sp <= train_gpus else 0
    per_gpu_mini = workload.mini_batch_prompts * workload.n // dp if dp else 0
    batches = _update_batches(
        grid, include, frozenset(fixed), seq_tokens=workload.seq_len_tokens, per_gpu_mini=per_gpu_mini
    )
    if batches is not None:
        choices[UPDATE_BATCH] = batches
    log_prob_runs = workload.use_kl_loss or old_logprob_pass_needed(workload, executor)
    if log_prob_runs and "log_prob_max_token_len_per_gpu" in free:
        budgets = tuple(k * workload.seq_len_tokens for k in grid.budget_sequences)
        choices["log_prob_max_token_len_per_gpu"] = _with(budgets, include.log_prob_max_token_len_per_gpu)
    megatron = include.strategy == "megatron"
    if megatron:
        free -= set(FSDP_ONLY_KNOBS)
        choices.update(_megatron_choices(spec, cluster, free, train_gpus=train_gpus, include=include))
    for name in BOOL_KNOBS:
        if name not in free or not _family_applies(name, workload):
            continue
        if name == "ref_param_offload" and not workload.use_kl_loss:
            continue  # no reference model without the KL loss
        if name == "ref_param_offload" and forced_ref_offload(include, executor):
            continue  # verl's FSDP reference is under CPUOffload whatever the key (#121): never unoffloaded
        if name == "enforce_eager" and not (vllm and device.cuda_graphs):
            continue  # CUDA graphs exist only for vLLM on a GPU
        if name in OFFLOAD_KNOBS and not device.offload_meaningful:
            continue  # on the cpu pseudo-device host RAM *is* device memory: offloading moves nothing
        choices[name] = (False, True)
    if "ulysses_sp" in free:
        choices["ulysses_sp"] = _parallel(grid, spec, per_node=cluster.gpus_per_node, pool_gpus=train_gpus)
    return choices


def _family_applies(name: str, workload: Workload) -> bool:
    """The launch families' knobs are dimensions only where their family is: the LoRA sync with adapters,
    the critic's offloads with a critic."""
    if name == "layered_summon":
        return workload.adapter is not None
    if name.startswith("critic_"):
        return workload.has_critic
    return True


def _megatron_choices(
    spec: ModelSpec, cluster: Cluster, free: set[str], *, train_gpus: int, include: Knobs
) -> dict[str, tuple[Any, ...]]:
    """Megatron's layout dimensions (module docstring), each with the included configuration's value."""
    out: dict[str, tuple[Any, ...]] = {}
    heads, kv, layers = spec.num_attention_heads, spec.num_kv_heads, spec.num_layers
    tps = tuple(t for t in (1, 2, 4, 8) if t <= cluster.gpus_per_node and heads % t == 0 and kv % t == 0)
    dims: dict[str, tuple[Any, ...]] = {
        "megatron_tp": tuple(t for t in tps if train_gpus % t == 0) or (1,),
        "megatron_pp": tuple(p for p in MEGATRON_PP if layers % p == 0 and train_gpus % p == 0) or (1,),
        "megatron_vpp": MEGATRON_VPP,
        "megatron_cp": tuple(c for c in MEGATRON_CP if train_gpus % c == 0),
        "megatron_recompute": MEGATRON_RECOMPUTE,
    }
    for name, values in dims.items():
        if name in free:
            out[name] = _with(values, getattr(include, name))
    return out
