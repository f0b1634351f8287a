"""Megatron-Core model states per rank (verl `actor_rollout_ref.actor.strategy=megatron`).

Parallel layout (`MegatronParallel`): world = TP × PP × CP × DP. Tensor parallelism (TP) splits every
attention/MLP matrix and the vocab-parallel embedding / output layer; norms (and MoE routers) are
replicated on each TP rank. Pipeline parallelism (PP) gives each stage ceil(L / PP) layers (VPP splits
a stage's layers into `vpp` model chunks, the same layers in total); the first stage also holds the
word embedding, the last the final norm and the output layer — with tied embeddings and PP > 1 the last
stage holds its own copy of the word embedding as the output weight (megatron/core/models/common/
language_module/language_module.py `setup_embeddings_and_output_layer`: the last stage's output weight
is allocated and kept equal to the first stage's by an all-reduce). Routed experts are split over
ETP × EP (expert tensor × expert model parallel; verl `expert_tensor_parallel_size: null` means ETP =
TP), their optimizer states over the expert data-parallel group world / (ETP·EP·PP).

Bytes per parameter (mixed precision bf16, Adam), as Megatron-LM's theoretical accounting has them
(megatron/training/theoretical_memory_usage.py, NVIDIA/Megatron-LM d98e8a64, L293–L296
`num_bytes_per_parameter`: 18 without, 6 + 12/DP with the distributed optimizer):
  params   2  (bf16 model weights, `DistributedDataParallel` param buffer)
  grads    4  (fp32 grad buffer: verl builds DDP with `grad_reduce_in_fp32: True`, verl/utils/
              megatron_utils.py `get_model`, b178a3cd L139–L143)
  master   4  (fp32 main params)     } sharded over the data-parallel group × CP with the distributed
  Adam     8  (fp32 exp_avg, exp_avg_sq) } optimizer (mcore shards over the dp-cp group), full otherwise
The grad buffer is persistent: DDP allocates it once and zeroes it each step, so without offload the
grads are resident in every phase (unlike FSDP, where grads are freed after the step).

verl's offload (verl/workers/megatron_workers.py and verl/utils/megatron_utils.py, b178a3cd):
- `actor.megatron.param_offload`: `offload_megatron_model_to_cpu` copies each DDP buffer's bf16
  `param_data` to a *pinned* host tensor and frees it, and frees the grad buffer outright (storage
  resized to 0, not copied). `load_megatron_model_to_gpu(load_grad=False)` brings the params back for
  `compute_log_prob` and `rollout_mode` (weight export), `load_grad=True` re-allocates (and zeroes) the
  grad buffer for `update_actor`.
- `actor.megatron.optimizer_offload`: `offload_megatron_optimizer` moves the fp32 main params
  (`shard_fp32_from_float16_groups`) and Adam's exp_avg / exp_avg_sq to the host (`.to("cpu")`, not
  pinned); loaded back for `update_actor` only.
- `actor.megatron.grad_offload` is read into `_is_offload_grad` but never used by the legacy worker, and
  the engine worker passes `grad=self._is_offload_param` (engine/megatron/transformer_impl.py L308–L310):
  grads follow param_offload. It changes nothing here.
- the reference model (`ref.megatron.*`, interpolated from the actor's parallel sizes) is built without
  DDP (`wrap_with_ddp=False`): bf16 params only, sharded like the actor; `ref.megatron.param_offload`
  moves them to host memory (`param.data.to("cpu")`, not pinned) between its passes. With LoRA
  (`model.lora.rank > 0` via Megatron-Bridge) there is no reference module: `compute_ref_log_prob` runs
  the actor with its adapters disabled (`peft_cls.disable_adapter`, megatron_workers.py L838–L870).
- micro-batches (workers/actor/megatron_actor.py b178a3cd L435–L460): with `use_dynamic_bsz` a mini-batch
  is packed into micro-batches of at most `ppo_max_token_len_per_gpu × context_parallel_size` tokens
  (`rearrange_micro_batches`; with VPP their number is made a multiple of
  `microbatch_group_size_per_vp_stage`), otherwise split into `ppo_micro_batch_size_per_gpu` sequences;
  all of a mini-batch's micro-batches go through one `forward_backward_func` call (the pipeline's m).
  Sequences are packed in THD format without padding (`megatron.use_remove_padding: True`).
- `use_fused_kernels` swaps the output layer + log-prob for verl's fused linear-cross-entropy kernel
  (models/mcore/model_forward_fused.py; memory in megatron_activations.py).
- `use_dist_checkpointing` only changes how weights are loaded (`load_mcore_dist_weights` instead of the
  HF bridge); it leaves the steady-state memory alone.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.planner.memory.shape import TransformerShape
from grpo_pilot.units import BF16_BYTES, FP32_BYTES

MEGATRON_PARAM_BYTES = BF16_BYTES  # bf16 model weights (verl actor.megatron.dtype: bfloat16)
MEGATRON_GRAD_BYTES = FP32_BYTES  # DDP grad buffer, grad_reduce_in_fp32=True in verl's get_model
MEGATRON_MASTER_BYTES = FP32_BYTES  # fp32 main params of the (distributed) optimizer
MEGATRON_ADAM_BYTES = 2 * FP32_BYTES  # exp_avg + exp_avg_sq
MEGATRON_PHASES = ("rollout", "log_prob", "ref_log_prob", "update", "weight_sync")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class MegatronParallel(NamedTuple):
    """Megatron parallel sizes of one training job (verl actor.megatron.*)."""

    tp: int = 1  # tensor_model_parallel_size
    pp: int = 1  # pipeline_model_parallel_size
    vpp: int = 1  # virtual_pipeline_model_parallel_size (verl null = 1: no interleaving)
    cp: int = 1  # context_parallel_size
    ep: int = 1  # expert_model_parallel_size
    etp: int = 0  # expert_tensor_parallel_size (0 = verl's null: same as tp)
    dp: int = 1  # data-parallel degree: world / (tp·pp·cp)
    sequence_parallel: bool = True  # verl default True (only meaningful with tp > 1)
    distributed_optimizer: bool = True  # verl default True

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def optimizer_shard(self) -> int:
        """Ranks the distributed optimizer shards dense states over (dp × cp), 1 without it."""
        return self.dp * self.cp if self.distributed_optimizer else 1

    @property
    def expert_optimizer_shard(self) -> int:
        """Expert data-parallel degree world / (ETP·EP·PP) with the distributed optimizer, 1 without."""
        if not self.distributed_optimizer:
            return 1
        return max(1, self.world // (self.expert_tp * self.ep * self.pp))


class StageParams(NamedTuple):
    """Parameters one rank of a pipeline stage holds (after TP / EP division)."""

    dense: int  # TP-sharded matrices, replicated norms, embedding / output shards
    expert: int  # routed-expert parameters (ETP × EP sharded)

    @property
    def total(self) -> int:
        return self.dense + self.expert


def layers_on_stage(num_layers: int, pp: int) -> int:
    """Layers of the most loaded stage: ceil(L / PP) (verl's num_layers_in_first/last_pipeline_stage
    overrides move layers between stages; the planner assumes the uniform split)."""
    return _ceil_div(num_layers, pp)


def stage_params(shape: TransformerShape, par: MegatronParallel, stage: int) -> StageParams:
    """Parameters on one rank of pipeline stage `stage` (0 = first, pp−1 = last)."""
    if not 0 <= stage < par.pp:
        raise ValueError(f"stage {stage} outside [0, {par.pp})")
    layers = layers_on_stage(shape.num_layers, par.pp)
    first, last = stage == 0, stage == par.pp - 1
    vocab_shard = _ceil_div(shape.embedding_params, par.tp)
    dense = _ceil_div(layers * shape.tp_sharded_params_per_layer, par.tp) + layers * shape.replicated_params_per_layer
    if first:
        dense += vocab_shard
    if last:
        dense += shape.final_norm_params
        if not shape.tied_embeddings or par.pp > 1:  # untied output layer, or the tied copy on the last stage
            dense += vocab_shard
    expert = _ceil_div(layers * shape.expert_params_per_layer, par.expert_tp * par.ep)
    return StageParams(dense, expert)


class MegatronStates(NamedTuple):
    """Model states of one rank (bytes)."""

    params_bytes: int
    grads_bytes: int
    master_bytes: int
    adam_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.master_bytes + self.adam_bytes


def megatron_state_bytes(params: StageParams, par: MegatronParallel, *, trainable: bool = True) -> MegatronStates:
    """bf16 params, fp32 grad buffer, fp32 main params and Adam states of one rank (module docstring).

    `trainable=False` (the reference model): bf16 params only."""
    p = params.total * MEGATRON_PARAM_BYTES
    if not trainable:
        return MegatronStates(p, 0, 0, 0)
    shard_dense = _ceil_div(params.dense, par.optimizer_shard)
    shard_expert = _ceil_div(params.expert, par.expert_optimizer_shard)
    shard = shard_dense + shard_expert
    return MegatronStates(
        p, params.total * MEGATRON_GRAD_BYTES, shard * MEGATRON_MASTER_BYTES, shard * MEGATRON_ADAM_BYTES
    )


def megatron_resident_items(
    states: MegatronStates,
    ref_params_bytes: int,
    phase: str,
    *,
    param_offload: bool,
    optimizer_offload: bool,
    ref_param_offload: bool,
) -> dict[str, int]:
    """What of the actor's (and reference's) states is on the GPU during `phase` under verl's
    load-use-offload (module docstring). `ref_params_bytes` is 0 when there is no reference module
    (no KL, or LoRA where the reference is the actor with its adapters disabled)."""
    if phase not in MEGATRON_PHASES:
        raise ValueError(f"phase must be one of {MEGATRON_PHASES}, got {phase!r}")
    params_on = not param_offload or phase in ("log_prob", "update", "weight_sync")
    grads_on = not param_offload or phase == "update"
    optimizer_on = not optimizer_offload or phase == "update"
    ref_on = not ref_param_offload or phase == "ref_log_prob"
    return {
        "actor_params": states.params_bytes if params_on else 0,
        "actor_grads": states.grads_bytes if grads_on else 0,
        "optimizer_master_params": states.master_bytes if optimizer_on else 0,
        "optimizer_states": states.adam_bytes if optimizer_on else 0,
        "ref_params": ref_params_bytes if ref_on else 0,
    }


def megatron_host_items(
    states: MegatronStates,
    ref_params_bytes: int,
    ranks_on_node: int,
    *,
    param_offload: bool,
    optimizer_offload: bool,
    ref_param_offload: bool,
) -> dict[str, int]:
    """Host RAM of one node's offloaded states: pinned bf16 params (the grad buffer is freed, not
    copied), fp32 main params + Adam (not pinned), the reference's bf16 params."""
    n = ranks_on_node
    return {
        "actor_params_offloaded_pinned": n * states.params_bytes if param_offload else 0,
        "optimizer_offloaded": n * (states.master_bytes + states.adam_bytes) if optimizer_offload else 0,
        "ref_params_offloaded": n * ref_params_bytes if ref_param_offload else 0,
    }


def megatron_weight_export_bytes(largest_param_elements: int, par: MegatronParallel, compute_bytes: int) -> int:
    """Transient of verl's per-tensor export to the rollout engine (megatron_utils.py `per_tensor_generator`,
    b178a3cd L928–L1071): a TP-sharded tensor is all-gathered into a list of TP shards (the full tensor)
    and concatenated (a second full copy); with PP > 1 a non-owner stage also receives the broadcast shard.
    Peak over tensors: the largest parameter."""
    c, n = compute_bytes, largest_param_elements
    gathered = 2 * c * n if par.tp > 1 else 0
    broadcast = c * _ceil_div(n, par.tp) if par.pp > 1 else 0
    return gathered + broadcast
