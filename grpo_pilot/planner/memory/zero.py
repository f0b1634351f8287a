"""Model states of a TRL policy under DeepSpeed ZeRO-1 / ZeRO-2 or plain DDP (`Knobs.state_sharding`), per GPU.

FSDP full sharding and ZeRO-3 (`state_sharding="full"`) shard everything over the N data-parallel ranks
(memory/model_states.py). The other modes keep the parameters replicated, so nothing is gathered for a pass:
the policy runs in place, like one unsharded rank. With Ψ parameters, c = 2 (bf16), N training ranks:

- ZeRO-1 / ZeRO-2 under `bf16` (TRL's default, GRPOConfig.bf16 True). DeepSpeed 0.19.6 (deepspeedai/DeepSpeed
  @edaa7221) engine.py `_do_optimizer_sanity_check`: bf16 with ZeRO gets `DeepSpeedZeroOptimizer`
  (runtime/zero/stage_1_and_2.py); only stage 1 with `data_types.grad_accum_dtype: fp32` gets BF16_Optimizer,
  and accelerate's generated configs set no data_types. `_configure_distributed_model` casts the module's
  parameters to bf16. The optimizer then holds (stage_1_and_2.py `__init__`):
    parameters   c·Ψ replicated (`bit16_groups_flat`, the model's weights are views into it)
                 + 4·Ψ/N fp32 master partition (`single_partition_of_fp32_groups`);
    Adam         8·Ψ/N (torch AdamW over the fp32 partition: exp_avg, exp_avg_sq);
    gradients    stage 2 (`partition_gradients`): the bf16 gradients of the rank's partition, c·Ψ/N
                 (`grads_in_partition`, contiguous_gradients True by default); stage 1: every parameter's bf16
                 gradient accumulates in `param.grad` until the accumulation boundary (`reduce_ready_partitions
                 _and_remove_grads` reduces only there), c·Ψ, plus the same c·Ψ/N partition copy;
    the IPG bucket during every backward: `setup_buckets` allocates `reduce_bucket_size` elements of bf16
                 (runtime/zero/config.py default 5e8; a second one only with overlap_comm, default False for
                 stages 1-2), freed by `_release_ipg_buffers` at the end of the backward;
    the step:    `step` converts the bf16 gradient partition to an fp32 `single_grad_partition`, 4·Ψ/N, for
                 Adam, then all-gathers the updated bf16 partitions (`all_gather_dp_groups`).
  With `zero_optimization.offload_optimizer.device: cpu` (`Knobs.optimizer_offload`; deepspeedai/DeepSpeed@edaa7221
  runtime/zero/stage_1_and_2.py, the `cpu_offload` paths) the optimizer's side moves to pinned host memory:
    host         the fp32 master partition 4·Ψ/N (`single_partition_of_fp32_groups`, created on `self.device`, which
                 is 'cpu' under offload: L238, L490-L509, pinned L495-L497), its fp32 gradient partition 4·Ψ/N
                 (`initialize_optimizer_states` L837-L844, kept between steps), a bf16 copy of the partition c·Ψ/N
                 (`param_buffer_of_bit16_for_cpu_offload_groups` L498-L507) and a c·(largest parameter) staging
                 buffer (`temp_grad_buffer_for_cpu_offload` L585-L590); Adam's moments 8·Ψ/N in DeepSpeedCPUAdam
                 (ops/adam/cpu_adam.py L148-L154: fp32 states, `fp32_optimizer_states=True` by default);
    GPU          the replicated bf16 parameters c·Ψ, the IPG bucket, and c·(largest parameter) for
                 `temp_grad_buffer_for_gpu_offload` (L591-L593, allocated once, kept). No gradient partition:
                 `copy_grads_in_partition` (L1650-L1668) copies each reduced partition gradient, cast to fp32 on
                 the GPU, into the host buffer and frees it (`async_inplace_copy_grad_to_fp32_buffer_from_gpu`
                 L1590-L1605, `clear_grad_attribute` "offload only"); no fp32 step partition (`step` L2323-L2342
                 runs the CPU Adam on the host buffers, copies the partition to bf16 on the host and sends it to
                 the GPU, then all-gathers as without offload). Stage 1 still holds every bf16 `param.grad` until
                 the boundary (c·Ψ). Approximate: with gradient accumulation DeepSpeed also keeps a c-byte host
                 copy of every partition parameter's gradient between micro-batches (`accumulated_grads_in_cpu`,
                 `async_accumulate_grad_in_cpu_via_gpu` L1516-L1559), not counted here.
  The reference model: TRL's `prepare_deepspeed` (trl 1.16 trl/models/utils.py L246-L290) gives it a stage-0
  config unless the policy runs stage 3, so DeepSpeed casts it to bf16 and every GPU holds it whole: c·Ψ.
  This is the ZeRO paper's accounting (Rajbhandari et al. 2020, arXiv 1910.02054 §5: P_os 2Ψ + 2Ψ + KΨ/N_d,
  P_os+g 2Ψ + (2+K)Ψ/N_d with K = 12) plus the bucket and the fp32 gradient partition the code adds.
- DDP (`accelerate launch` without a config file, or ZeRO stage 0): the policy keeps its load dtype (TRL: fp32
  unless `dtype` is set; `Knobs.model_dtype`, memory/precision.py) — fp32 under bf16 autocast, or bf16 throughout —
  every state replicated: parameters p·Ψ, `param.grad` p·Ψ, Adam 2p·Ψ (torch AdamW's moments take the
  parameter's dtype) with p = 4 (fp32) or 2 (bf16) — and the reducer's buckets: accelerate's
  DistributedDataParallelKwargs passes gradient_as_bucket_view=False (accelerate/utils/dataclasses.py), so the
  reducer allocates a flat gradient tensor per bucket (25 MiB caps, `bucket_cap_mb`; the gradients' dtype) covering
  every trainable parameter at construction and keeps it (torch/csrc/distributed/c10d/reducer.cpp
  `initialize_buckets`: `bucket.gradients = at::empty(...)`), copying each gradient in and the reduced result
  back: another p·Ψ, held in every phase. One process is not wrapped in DDP (no buckets). The reference stays in
  its load dtype, replicated (`prepare_model(evaluation_mode)`).
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.planner.memory.model_states import shard_elements

REPLICATED_MODES: frozenset[str] = frozenset({"zero2", "zero1", "ddp"})
ZERO_MODES: frozenset[str] = frozenset({"zero2", "zero1"})
# deepspeed/runtime/zero/config.py (v0.19.6) `reduce_bucket_size: int = Field(pp_int(5e8))`: elements of the IPG
# bucket; accelerate's generated ZeRO configs (open-r1's zero2.yaml) leave it at the default
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000


class ReplicatedStates(NamedTuple):
    """One rank's bytes under a replicating mode (module docstring)."""

    params_bytes: int  # replicated working parameters + the fp32 master partition (ZeRO)
    grad_bytes: int  # gradients held through the update (resident)
    adam_bytes: int
    ref_bytes: int
    backward_buffer_bytes: int  # ZeRO's IPG bucket, live during each backward
    step_grad_bytes: int  # ZeRO's fp32 gradient partition, live during the optimizer step
    ddp_bucket_bytes: int  # DDP's reducer buckets, held from the wrap on (every phase)
    host_bytes: int = 0  # ZeRO offload_optimizer: fp32 master + fp32 grad + bf16 partitions, staging (not Adam)


def replicated_states(
    num_params: int,
    *,
    mode: str,
    ranks: int,
    compute_bytes: int,
    master_bytes: int,
    grad_bytes: int,
    adam_bytes: int,
    ref_bytes: int,
    has_ref: bool,
    bucket_elements: int = DEEPSPEED_REDUCE_BUCKET_ELEMENTS,
    optimizer_offload: bool = False,
    largest_param_elements: int = 0,
) -> ReplicatedStates:
    """Per-rank states of `num_params` parameters over `ranks` data-parallel ranks under `mode` (ZeRO-1, ZeRO-2
    or DDP); `master_bytes` / `grad_bytes` / `adam_bytes` / `ref_bytes` are the executor's element sizes of the
    master weights (DDP: the parameters as loaded), the gradients, both Adam moments and the reference as loaded
    (memory/precision.py; module docstring). `optimizer_offload`: DeepSpeed's offload_optimizer (ZeRO-1/2 only),
    whose GPU and host staging buffers hold `largest_param_elements` each; `adam_bytes` stays the Adam partition,
    which the caller places on the host (memory/host.py)."""
    part = shard_elements(num_params, ranks)
    if mode == "ddp":
        if optimizer_offload:
            raise ValueError("DDP has no optimizer offload")
        buckets = grad_bytes * num_params if ranks > 1 else 0
        return ReplicatedStates(
            params_bytes=master_bytes * num_params,
            grad_bytes=grad_bytes * num_params,
            adam_bytes=adam_bytes * num_params,
            ref_bytes=ref_bytes * num_params if has_ref else 0,
            backward_buffer_bytes=0,
            step_grad_bytes=0,
            ddp_bucket_bytes=buckets,
        )
    if mode not in ZERO_MODES:
        raise ValueError(f"state_sharding {mode!r} is not a replicating mode")
    full_grads = compute_bytes * num_params if mode == "zero1" else 0
    if optimizer_offload:
        staging = compute_bytes * largest_param_elements
        return ReplicatedStates(
            params_bytes=compute_bytes * num_params + staging,
            grad_bytes=full_grads,
            adam_bytes=adam_bytes * part,
            ref_bytes=compute_bytes * num_params if has_ref else 0,
            backward_buffer_bytes=compute_bytes * bucket_elements,
            step_grad_bytes=0,
            ddp_bucket_bytes=0,
            host_bytes=(2 * master_bytes + compute_bytes) * part + staging,
        )
    return ReplicatedStates(
        params_bytes=compute_bytes * num_params + master_bytes * part,
        grad_bytes=full_grads + compute_bytes * part,
        adam_bytes=adam_bytes * part,
        ref_bytes=compute_bytes * num_params if has_ref else 0,
        backward_buffer_bytes=compute_bytes * bucket_elements,
        step_grad_bytes=master_bytes * part,
        ddp_bucket_bytes=0,
    )
