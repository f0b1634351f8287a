"""Step time of one GRPO step (reference/memory-model.md §5), for ranking plans and predicting runs.

`T_step = T_rollout + T_log_prob (old + ref) + T_update + T_weight_sync`, phases run one after
another (synchronous, on-policy GRPO; with split placement the pools still wait for each other).
Time follows the expected lengths of the workload (`lengths.py`); the rollout is paced by its tail.

- rollout: `rollout_time.py` (prefill, KV-capacity-limited continuous decode paced by the tail, the
  sampler on every TP rank, TP collectives, engine overheads).
- log-prob passes (old policy; reference with the KL loss) and the update: per token, a roofline of
  three added terms (`roofline.py`): GEMM FLOPs at the GPU's achieved matmul rate (MAMF, device-aware),
  flash-attention FLOPs at its share of that rate, and the memory-bound traffic of norms, activations
  and logits at the achieved HBM bandwidth. The update is forward + backward (+ a recomputed forward
  with activation checkpointing) per epoch, plus the optimizer step.
- FSDP all-gathers / reduce-scatters overlap compute within a micro-batch: a micro-batch lasts
  max(compute, communication). Ulysses all-to-alls do not overlap. Offload traffic follows the
  executor (`ExecutorTraits.offload_streams`): verl loads and offloads whole shards once per phase
  (not overlapped); our engine and TRL stream shards in with every all-gather and step the optimizer
  on the host.
- weight sync: ≈ 2·P bytes over the intra-node link (cross-node for split placement).

Every efficiency and rate is a field of `TimeCoefficients` (analytic defaults with their sources, or a
calibration); the functions here take it as `coefficients`. Pure and fast: no torch, a few hundred
float operations.
"""

from __future__ import annotations

import math

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.planner.config import Knobs, Target, Workload, old_logprob_pass_needed
from grpo_pilot.planner.critic_time import critic_flops_per_step, critic_times
from grpo_pilot.planner.hf_decode_mode import plan_hf_rollout, plan_replica
from grpo_pilot.planner.lengths import lengths_of
from grpo_pilot.planner.lora_time import (
    LoraTime,
    activation_offload_micro_s,
    dequant_micro_s,
    lora_time_terms,
    lora_training_cost,
)
from grpo_pilot.planner.megatron_time import megatron_times
from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token_per_gpu
from grpo_pilot.planner.memory.precision import precision_for, rollout_element_bytes
from grpo_pilot.planner.memory.zero import ZERO_MODES
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads
from grpo_pilot.planner.ref_offload import ref_offload_mode
from grpo_pilot.planner.reports import TimeReport
from grpo_pilot.planner.rollout_time import RolloutBreakdown, rollout_breakdown, rollout_time_s
from grpo_pilot.planner.roofline import (
    allreduce_s,
    attention_flops_per_token,
    collective_bytes_per_s,
    forward_cost,
    forward_flops_per_token,
    host_link_bytes_per_s,
    logits_traffic_bytes,
    param_counts,
    pools,
    ring_time_s,
    token_seconds,
    training_cost,
)
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS, TimeCoefficients
from grpo_pilot.planner.train_side import (
    ADAM_BYTES_PER_PARAM,
    TrainSide,
    attention_seq,
    cpu_adam_s,
    micro_loop_s,
    seqs_per_token_budget,
    train_dispatch_s,
    train_side,
)
from grpo_pilot.planner.traits import ExecutorTraits, traits_for
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import BF16_BYTES, FP32_BYTES

__all__ = [
    "ADAM_BYTES_PER_PARAM",
    "RolloutBreakdown",
    "allreduce_s",
    "attention_flops_per_token",
    "collective_bytes_per_s",
    "cpu_adam_s",
    "estimate_time",
    "forward_flops_per_token",
    "host_link_bytes_per_s",
    "kv_bytes_per_token_per_gpu",
    "log_prob_time_s",
    "model_flops_per_step",
    "param_counts",
    "pools",
    "rollout_breakdown",
    "rollout_time_s",
    "train_dispatch_s",
    "trained_tokens_per_step",
    "update_time_s",
    "weight_sync_time_s",
]


def _ulysses_s(spec: ModelSpec, *, tokens_per_rank: float, sp: int, bw: float, passes: int) -> float:
    """All-to-all before and after attention (q, k, v in; output back), per layer, per pass."""
    if sp <= 1:
        return 0.0
    bytes_per_token = (2 * spec.q_dim + 2 * spec.kv_dim) * BF16_BYTES
    return passes * spec.num_layers * tokens_per_rank * bytes_per_token * (sp - 1) / sp / bw


def log_prob_time_s(
    spec: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    coefficients: TimeCoefficients = DEFAULT_TIME_COEFFICIENTS,
) -> float:
    """Old-policy pass (+ reference pass with the KL loss), sharded over the training pool."""
    coef = coefficients
    ts = train_side(spec, cluster, workload, knobs, executor=executor, coef=coef)
    gpu, sp, seq = ts.gpu, ts.sp, ts.seq
    seqs_per_rank = math.ceil(workload.responses_per_step / ts.dp)
    if knobs.log_prob_micro_batch_size_per_gpu is not None:
        per_micro = knobs.log_prob_micro_batch_size_per_gpu
    else:
        per_micro = seqs_per_token_budget(knobs.log_prob_max_token_len_per_gpu, sp, seq, executor)
    c = ts.prec.compute_bytes
    logits = logits_traffic_bytes(spec.vocab_size, c, executor, training=False)
    compute_per_token = token_seconds(forward_cost(spec, ts.attention_context, c, logits), gpu, coef)
    # ZeRO-1/2 and DDP run the replicated module: nothing to gather (memory/zero.py)
    gathers = knobs.state_sharding == "full"
    gather_s = ring_time_s(BF16_BYTES * param_counts(spec)[0], ts.shards, ts.bw) if gathers else 0.0
    a2a_per_token = _ulysses_s(spec, tokens_per_rank=1, sp=sp, bw=ts.bw, passes=1)
    device = cluster.device
    streams = executor.offload_streams and device.offload_meaningful
    lora = lora_time_terms(spec, workload)
    dequant = dequant_micro_s(lora, 1, gpu.hbm_bytes_per_s)
    dispatch = {"dispatch_s_per_micro": train_dispatch_s(spec, 1, coef) + dequant}

    def one_pass(offloaded: bool, bytes_per_param: int, *, streams: bool = streams) -> float:
        h2d = bytes_per_param * ts.shard_params / ts.host if offloaded and device.offload_meaningful else 0.0
        comm = gather_s + h2d if streams else gather_s  # streaming: every micro-batch brings its shard in
        loop = micro_loop_s(
            seqs=seqs_per_rank,
            per_micro=per_micro,
            tokens_per_seq=seq / sp,
            compute_s_per_token=compute_per_token,
            comm_s_per_micro=comm,
            serial_s_per_token=a2a_per_token,
            **dispatch,
        )
        return loop if streams else loop + h2d  # verl: once per pass

    total = 0.0
    if old_logprob_pass_needed(workload, executor):
        total += one_pass(knobs.param_offload, ts.prec.master_bytes)
    if workload.use_kl_loss and lora is not None:  # LoRA: the actor with its adapters disabled
        total += one_pass(knobs.param_offload, ts.prec.master_bytes)
    elif workload.use_kl_loss:  # the reference's own mode: verl's FSDP one streams since #121 (ref_offload.py)
        mode = ref_offload_mode(knobs, executor)
        ref_streams = mode == "streamed" and device.offload_meaningful
        total += one_pass(mode != "resident", ts.prec.ref_bytes, streams=ref_streams)
    return total


def _family_micro_s(
    spec: ModelSpec, knobs: Knobs, ts: TrainSide, *, lora: LoraTime | None, tokens: float, coef: TimeCoefficients
) -> float:
    """Per-micro-batch time the launch families add to the update: QLoRA's dequantization in every pass and
    verl's activation offload's exposed transfers (lora_time.py)."""
    extra = dequant_micro_s(lora, 3 if knobs.gradient_checkpointing else 2, ts.gpu.hbm_bytes_per_s)
    if knobs.activation_offload and ts.host != ts.gpu.hbm_bytes_per_s:  # not on the cpu pseudo-device
        forward = forward_cost(spec, ts.attention_context, ts.prec.compute_bytes, 0.0)
        layer_s = tokens * token_seconds(forward, ts.gpu, coef) / spec.num_layers
        extra += activation_offload_micro_s(
            spec, tokens, checkpointing=knobs.gradient_checkpointing, host_bytes_per_s=ts.host, layer_forward_s=layer_s
        )
    return extra


def update_time_s(
    spec: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    coefficients: TimeCoefficients = DEFAULT_TIME_COEFFICIENTS,
) -> float:
    """ppo_epochs × mini-batches × micro-batches of forward+backward, one optimizer step per mini-batch.
    Under LoRA the base is frozen: no weight gradients for it, gradients and Adam over the adapters."""
    coef = coefficients
    ts = train_side(spec, cluster, workload, knobs, executor=executor, coef=coef)
    gpu, prec, sp, seq, shard_params, host = ts.gpu, ts.prec, ts.sp, ts.seq, ts.shard_params, ts.host
    num_minis = math.ceil(workload.prompts_per_step / workload.mini_batch_prompts)
    seqs_per_rank_mini = max(1, math.ceil(workload.mini_batch_prompts * workload.n / ts.dp))
    if knobs.dynamic_batching:
        per_micro = seqs_per_token_budget(knobs.max_token_len_per_gpu or ts.lengths.seq_max, sp, seq, executor)
    else:
        per_micro = knobs.micro_batch_size_per_gpu or 1
    c = prec.compute_bytes
    logits = logits_traffic_bytes(spec.vocab_size, c, executor, training=True)
    lora = lora_time_terms(spec, workload)
    if lora is None:
        cost = training_cost(
            spec,
            attention_context=ts.attention_context,
            compute_bytes=c,
            logits_bytes=logits,
            recompute=knobs.gradient_checkpointing,
        )
    else:
        forward = forward_cost(spec, ts.attention_context, c, 0.0)
        cost = lora_training_cost(forward, lora, knobs.gradient_checkpointing, logits)
    trainable = shard_params if lora is None else lora.adapter_params / ts.shards
    compute_per_token = token_seconds(cost, gpu, coef)
    comm_s, serial_micro_s, step_comm_s = _training_comm_s(spec, cluster, knobs, ts=ts, trainable=trainable, coef=coef)
    device = cluster.device
    p_off = knobs.param_offload and device.offload_meaningful
    o_off = knobs.optimizer_offload and device.offload_meaningful
    phase_s = 0.0  # once per update phase
    optim_s = trainable * ADAM_BYTES_PER_PARAM / gpu.hbm_bytes_per_s + step_comm_s
    if executor.offload_streams:
        if p_off:  # shard in for forward and backward, grads out, every micro-batch
            comm_s += (2 * prec.master_bytes * shard_params + prec.grad_bytes * trainable) / host
        if knobs.state_sharding in ZERO_MODES and o_off:  # DeepSpeed ZeRO-1/2 offload_optimizer (memory/zero.py):
            # the fp32 gradient partition out, the bf16 partition back, then the step's collectives as without
            optim_s = cpu_adam_s(trainable, cluster, coef) + (FP32_BYTES + c) * trainable / host + step_comm_s
        elif p_off or o_off:  # the optimizer steps on the host
            optim_s = cpu_adam_s(trainable, cluster, coef)
            if not p_off:  # grads out, updated params back, per optimizer step
                optim_s += (prec.grad_bytes + prec.master_bytes) * trainable / host
    else:
        # verl loads offloaded states for the phase and offloads them after (each crosses PCIe twice).
        phase_s += 2 * prec.master_bytes * shard_params / host if p_off else 0.0
        phase_s += 2 * prec.adam_bytes * trainable / host if o_off else 0.0
    passes = 3 if knobs.gradient_checkpointing else 2
    micros_s = micro_loop_s(
        seqs=seqs_per_rank_mini,
        per_micro=per_micro,
        tokens_per_seq=seq / sp,
        compute_s_per_token=compute_per_token,
        comm_s_per_micro=comm_s,
        serial_s_per_token=_ulysses_s(spec, tokens_per_rank=1, sp=sp, bw=ts.bw, passes=passes),
        # forward 1 + backward 2 (+ recomputed forward 1): the FLOP multipliers of `training_cost`
        dispatch_s_per_micro=train_dispatch_s(spec, passes + 1, coef)
        + serial_micro_s
        + _family_micro_s(spec, knobs, ts, lora=lora, tokens=min(per_micro, seqs_per_rank_mini) * seq / sp, coef=coef),
    )
    per_epoch = num_minis * (micros_s + optim_s)
    return workload.ppo_epochs * per_epoch + phase_s


def _training_comm_s(
    spec: ModelSpec, cluster: Cluster, knobs: Knobs, *, ts: TrainSide, trainable: float, coef: TimeCoefficients
) -> tuple[float, float, float]:
    """(overlappable seconds per micro-batch, serial seconds per micro-batch, seconds per optimizer step) of the
    training collectives: FSDP's per micro-batch — all-gather bf16 params in forward and again in backward
    (reshard_after_forward), reduce-scatter fp32 grads (verl MixedPrecision reduce_dtype fp32), and under HSDP
    (fsdp_size < training GPUs) an all-reduce of the fp32 gradient shard across replicas; replicated states
    (`Knobs.state_sharding`): `replicated_comm_s`."""
    if knobs.state_sharding != "full":
        spans = cluster.num_nodes > 1 and ts.train_gpus > cluster.gpus_per_node
        dp_bw = collective_bytes_per_s(ts.gpu, spans, coef, gpus_per_node=cluster.gpus_per_node)
        return replicated_comm_s(
            knobs.state_sharding,
            trainable * ts.shards,
            ranks=ts.train_gpus,
            bw=dp_bw,
            coef=coef,
            grad_bytes=ts.prec.grad_bytes,
        )
    comm_s = ring_time_s(2 * BF16_BYTES * param_counts(spec)[0] + FP32_BYTES * trainable * ts.shards, ts.shards, ts.bw)
    comm_s += allreduce_s(FP32_BYTES * trainable, ts.replicas, ts.replica_bw, coef.allreduce_latency_s)
    return comm_s, 0.0, 0.0


def replicated_comm_s(
    mode: str, trainable: float, *, ranks: int, bw: float, coef: TimeCoefficients, grad_bytes: int
) -> tuple[float, float, float]:
    """(overlapped per micro-batch, serial per micro-batch, per optimizer step) collective seconds of the update
    under ZeRO-1/2 or DDP (memory/zero.py), over the `ranks` training GPUs:
    - DDP: accelerate's `accumulate` skips the reducer outside the accumulation boundary (`no_sync`), so one
      ring all-reduce of the gradients (the policy's dtype, `grad_bytes`) per optimizer step; the reducer overlaps
      it with that micro-batch's backward, planned exposed (an upper bound);
    - ZeRO-1: stage_1_and_2.py reduces only at the boundary: bf16 gradients reduced to their partition owners
      (≈ a reduce-scatter) then the updated bf16 partitions all-gathered (`all_gather_dp_groups`), per step;
    - ZeRO-2 (`partition_gradients`): every backward reduces its bf16 buckets in the gradient hooks, on the compute
      stream (overlap_comm False by default for stages 1-2: zero/config.py `overlap_comm_valid`), so serially, and
      the step all-gathers the bf16 parameters."""
    bf16_bytes = BF16_BYTES * trainable
    if mode == "ddp":
        return 0.0, 0.0, allreduce_s(grad_bytes * trainable, ranks, bw, coef.allreduce_latency_s)
    gather_s = ring_time_s(bf16_bytes, ranks, bw)
    if mode == "zero1":
        return 0.0, 0.0, ring_time_s(bf16_bytes, ranks, bw) + gather_s
    return 0.0, ring_time_s(bf16_bytes, ranks, bw), gather_s


def weight_sync_time_s(
    spec: ModelSpec,
    cluster: Cluster,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    coefficients: TimeCoefficients = DEFAULT_TIME_COEFFICIENTS,
    workload: Workload | None = None,
) -> float:
    """Trainer → rollout engine: gather 2·P bf16 bytes, load into vLLM (split: over the link between the pools,
    verl's NCCL group; our engine's master-dtype buckets through host memory, `host_transfer_s`); none for HF
    rollout on the policy itself, `replica_sync_s` into our engine's hf replica."""
    coef, gpu = coefficients, cluster.gpu
    if knobs.rollout_backend == "hf":
        replica = plan_replica(cluster, knobs, executor=executor)
        return replica_sync_s(spec, cluster, knobs, executor=executor, coefficients=coef) if replica else 0.0
    _, train_gpus = pools(cluster, knobs)
    weights = BF16_BYTES * param_counts(spec)[0]
    lora = lora_time_terms(spec, workload) if workload is not None else None
    if lora is not None and executor.lora_rollout == "adapters":  # verl ships the adapters (fp32) only
        weights = FP32_BYTES * lora.adapter_params
    load_s = weights / knobs.rollout_tp / gpu.hbm_bytes_per_s
    p_off = knobs.param_offload and cluster.device.offload_meaningful
    # Offloaded params come from the host once (verl loads them for the sync; streaming targets read
    # each shard once while gathering).
    master_bytes = precision_for(
        executor, cluster.device, model_dtype=knobs.model_dtype, state_sharding=knobs.state_sharding
    ).master_bytes
    offload_s = master_bytes * param_counts(spec)[0] / train_gpus / host_link_bytes_per_s(gpu, coef) if p_off else 0.0
    link = collective_bytes_per_s(gpu, cluster.num_nodes > 1, coef, gpus_per_node=cluster.gpus_per_node)
    if knobs.placement == "split" and executor.split_sync_via_host:  # our engine: master-dtype buckets via host
        sent = master_bytes * param_counts(spec)[0]
        return ring_time_s(sent, train_gpus, link) + host_transfer_s(sent, cluster, coef) + load_s + offload_s
    if knobs.placement == "split":
        cross = coef.nic_bytes_per_s(gpu.name) if cluster.num_nodes > 1 else gpu.link_bytes_per_s
        return weights / (cross * coef.link_efficiency) + load_s + offload_s
    # ZeRO-1/2 and DDP: every rank holds the whole model, nothing is gathered (memory/zero.py)
    gather_s = ring_time_s(weights, train_gpus, link) if knobs.state_sharding == "full" else 0.0
    return gather_s + load_s + offload_s


def replica_sync_s(
    spec: ModelSpec, cluster: Cluster, knobs: Knobs, *, executor: ExecutorTraits, coefficients: TimeCoefficients
) -> float:
    """Trainer → our engine's hf replica (planner/memory/hf_rollout.py): every parameter gathered in the master
    dtype over the training ranks (`DTensor.full_tensor`, a ring all-gather; nothing for an unsharded trainer),
    then copied into the replica — on the same GPU colocated (read in the master dtype, written in the replica's),
    through host memory split (engine/weight_sync.py `to_host` on training rank 0, the Ray object store, and the
    rollout worker's host-to-device copy; across nodes the NIC besides)."""
    coef, gpu = coefficients, cluster.gpu
    _, train_gpus = pools(cluster, knobs)
    params = param_counts(spec)[0]
    sent = (
        precision_for(
            executor, cluster.device, model_dtype=knobs.model_dtype, state_sharding=knobs.state_sharding
        ).master_bytes
        * params
    )
    link = collective_bytes_per_s(gpu, cluster.num_nodes > 1, coef, gpus_per_node=cluster.gpus_per_node)
    load_s = (sent + rollout_element_bytes(cluster.device) * params) / gpu.hbm_bytes_per_s
    if knobs.placement != "split":
        return ring_time_s(sent, train_gpus, link) + load_s
    return ring_time_s(sent, train_gpus, link) + host_transfer_s(sent, cluster, coef) + load_s


def host_transfer_s(sent_bytes: float, cluster: Cluster, coefficients: TimeCoefficients) -> float:
    """Our engine's split weight sync between the pools (`ExecutorTraits.split_sync_via_host`): device → host on
    training rank 0, the Ray object store (across nodes: the NIC), host → device on the rollout GPU."""
    coef, gpu = coefficients, cluster.gpu
    host_s = 2 * sent_bytes / host_link_bytes_per_s(gpu, coef)
    nic_s = sent_bytes / (coef.nic_bytes_per_s(gpu.name) * coef.link_efficiency) if cluster.num_nodes > 1 else 0.0
    return host_s + nic_s


def trained_tokens_per_step(workload: Workload) -> float:
    """Real tokens (prompt + response) one step trains on, at the expected lengths."""
    return workload.responses_per_step * workload.seq_mean_tokens


def model_flops_per_step(spec: ModelSpec, workload: Workload, executor: ExecutorTraits) -> float:
    """Useful FLOPs (no recompute): 6·P per trained token per epoch, 2·P per log-prob token and per
    rollout token (prompt + response), attention included, at the expected lengths; with PPO the critic's
    values pass and update (`critic_time.critic_flops_per_step`)."""
    lengths = lengths_of(workload)
    fwd = forward_flops_per_token(spec, attention_seq(lengths, executor.padding))
    passes = int(old_logprob_pass_needed(workload, executor)) + int(workload.use_kl_loss)
    tokens = trained_tokens_per_step(workload)
    actor = tokens * fwd * (3 * workload.ppo_epochs + passes + 1)
    return actor + critic_flops_per_step(spec, workload, tokens, fwd)  # PPO: the critic's passes


def estimate_time(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    target: Target = "grpo-pilot",
    kv_cache_tokens_per_gpu: int | None = None,
    coefficients: TimeCoefficients = DEFAULT_TIME_COEFFICIENTS,
    overheads: Overheads = DEFAULT_OVERHEADS,
) -> TimeReport:
    """Seconds per phase at the workload's expected lengths. `kv_cache_tokens_per_gpu` is the rollout
    engine's KV capacity from the memory estimate (None = unlimited: `max_num_seqs` caps concurrency);
    `coefficients` the efficiencies (analytic defaults or a calibration); `overheads` the memory
    constants the time model reads (the sampler's bytes per vocabulary entry)."""
    coef, executor = coefficients, traits_for(target)
    hf = plan_hf_rollout(model, cluster, workload, knobs, executor=executor)  # one rule with the memory model
    rollout = rollout_time_s(
        model,
        cluster,
        workload,
        knobs,
        kv_cache_tokens_per_gpu=kv_cache_tokens_per_gpu,
        coefficients=coef,
        overheads=overheads,
        decode_mode=hf.decode_mode,
        replica_gpus=hf.gpus if hf.replica else None,
    )
    phases = {
        "rollout": rollout,
        "log_prob": log_prob_time_s(model, cluster, workload, knobs, executor=executor, coefficients=coef),
        "update": update_time_s(model, cluster, workload, knobs, executor=executor, coefficients=coef),
        "weight_sync": weight_sync_time_s(
            model, cluster, knobs, executor=executor, coefficients=coef, workload=workload
        ),
    }
    if knobs.strategy == "megatron":  # verl's Megatron workers (megatron_time.py)
        phases.update(megatron_times(model, cluster, workload, knobs, executor=executor, coefficients=coef))
    phases.update(critic_times(model, cluster, workload, knobs, executor=executor, coefficients=coef))
    step_s = sum(phases.values())
    peak = cluster.gpu.bf16_flops * cluster.world_size
    return TimeReport.model_construct(  # the search's inner loop: computed values, no validation pass
        phases_s=phases,
        step_s=step_s,
        tokens_per_s=trained_tokens_per_step(workload) / step_s if step_s > 0 else 0.0,
        mfu=model_flops_per_step(model, workload, executor) / (peak * step_s) if step_s > 0 else 0.0,
    )
