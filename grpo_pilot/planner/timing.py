"""Roofline step time of one GRPO step (reference/memory-model.md §5), for ranking plans.

`T_step = T_rollout + T_log_prob (old + ref) + T_update + T_weight_sync`, phases run one after
another (synchronous, on-policy GRPO; with split placement the pools still wait for each other).

- rollout: prefill is compute-bound (2·P FLOPs per prompt token, chunked by
  `max_num_batched_tokens`, each chunk reading the weights once); decode is memory-bound: one step
  reads the weights (2·P/t bytes) plus the KV cache of every running sequence, over HBM bandwidth × η,
  and is never faster than its FLOPs; sequences run in waves of `max_concurrent_seqs` per replica and
  every wave lasts the longest response; TP adds two all-reduces per layer per step.
- log-prob passes (old policy; reference only with the KL loss): 2·P FLOPs per token.
- update: 6·P FLOPs per token (+2·P with full recompute) per epoch, plus the optimizer step.
- FSDP all-gathers / reduce-scatters overlap compute within a micro-batch: a micro-batch lasts
  max(compute, communication). Ulysses all-to-alls do not overlap. Offload traffic follows the
  executor (`offload_streams`): verl loads and offloads whole shards once per phase (not
  overlapped); our engine and TRL stream shards in with every all-gather (overlapped like it) and
  step the optimizer on the host.
- weight sync: ≈ 2·P bytes over the intra-node link (cross-node for split placement).

Every efficiency constant is named below with its source; they are calibratable starting points.
Pure and fast: no torch, a few hundred float operations.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.hardware.gpus import GB, GPUSpec
from grpo_pilot.planner.config import Knobs, Target, Workload, old_logprob_pass_needed
from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token
from grpo_pilot.planner.memory.layout import layout_for
from grpo_pilot.planner.memory.precision import Precision, precision_for
from grpo_pilot.planner.reports import TimeReport
from grpo_pilot.profiles.spec import ModelSpec

# ---- efficiency constants (fractions of datasheet peaks) ----
# Update (forward + backward) MFU: verl RL runs report perf/mfu/actor of 19-40% and torchtitan's FSDP2
# Llama-3-8B runs 33-57% (memory-model.md §5); 0.35 sits in the overlap of both ranges.
UPDATE_MFU = 0.35
# Forward-only passes (log-prob, vLLM prefill): no backward, larger GEMMs per kernel; torchtitan's
# forward share runs near the top of its 33-57% range, so 0.45.
FORWARD_MFU = 0.45
# Decode memory-bandwidth utilisation (MBU): Databricks "LLM Inference Performance Engineering"
# reports ~60% MBU for 7B-class decode on A100; vLLM decode kernels sit in that region.
DECODE_HBM_EFFICIENCY = 0.6
# Compute ceiling of large-batch decode (skinny GEMMs): same as forward passes.
DECODE_MFU = FORWARD_MFU
# NCCL bus bandwidth / link peak: nccl-tests all_reduce_perf reaches ~230 GB/s busbw on A100
# NVLink3 (300 GB/s per direction) ≈ 0.77; 0.75 also covers PCIe rings.
LINK_EFFICIENCY = 0.75
# Small-message all-reduce latency (decode TP all-reduces are a few KB): nccl-tests / vLLM custom
# all-reduce report ~5-20 µs on NVLink; 10 µs per collective.
ALLREDUCE_LATENCY_S = 10e-6
# Kernel launches without CUDA graphs (vLLM enforce_eager, HF generate): ~10 kernels per decoder
# layer (norms, qkv, rope, attention, o, gate/up, act, down, residual) × ~5 µs launch/dispatch
# (CUDA launch latency plus PyTorch dispatch) per layer-kernel.
EAGER_LAUNCH_S_PER_LAYER = 10 * 5e-6
# Host↔device copies of pinned memory reach ~80% of PCIe peak (CUDA bandwidthTest: ~25 GB/s of
# PCIe 4.0 x16's 32 GB/s).
HOST_LINK_EFFICIENCY = 0.8
# Inter-node bandwidth per GPU: DGX A100 reference design, one 200 Gb/s HDR InfiniBand NIC per GPU
# = 25 GB/s per direction (DGX H100 has 400 Gb/s NDR; 25 GB/s is the conservative common case).
INTER_NODE_BYTES_PER_S = 25 * GB
# Host memory bandwidth per node for the host-side optimizer step: a two-socket DDR4-3200 server
# peaks near 400 GB/s (16 channels × 25.6 GB/s); PyTorch's CPU AdamW (foreach, fp32) reaches about a
# quarter of that, shared by every rank on the node. A calibration replaces it with a measured rate.
HOST_MEMORY_BYTES_PER_S = 100 * GB
# AdamW step traffic per parameter of the shard: read fp32 param, grad, m, v (16 B), write param, m,
# v (12 B) = 28 B at HBM speed (PyTorch foreach/fused AdamW is bandwidth-bound).
ADAM_BYTES_PER_PARAM = 28
# Host link (PCIe generation) by catalog GPU: vendor datasheets (A100: PCIe 4.0; H100/H800/H20/H200,
# B200, MI300X, RTX 5090: PCIe 5.0; the rest PCIe 4.0). Bytes/s, one direction, x16.
_PCIE5 = 64 * GB
_PCIE4 = 32 * GB
HOST_LINK_BYTES_PER_S = {
    "H100-80G": _PCIE5,
    "H100-PCIE": _PCIE5,
    "H800": _PCIE5,
    "H20": _PCIE5,
    "H200": _PCIE5,
    "B200": _PCIE5,
    "MI300X": _PCIE5,
    "RTX5090": _PCIE5,
}

BF16_BYTES = 2
FP32_BYTES = 4


def host_link_bytes_per_s(gpu: GPUSpec) -> float:
    """Effective host↔device bandwidth (the CPU pseudo-device copies at its memory bandwidth)."""
    if gpu.is_cpu:
        return gpu.hbm_bytes_per_s
    return HOST_LINK_BYTES_PER_S.get(gpu.name, _PCIE4) * HOST_LINK_EFFICIENCY


def collective_bytes_per_s(gpu: GPUSpec, spans_nodes: bool) -> float:
    """Per-GPU bus bandwidth of a ring collective; a ring over several nodes runs at the NIC's pace."""
    link = gpu.link_bytes_per_s
    if spans_nodes:
        link = min(link, INTER_NODE_BYTES_PER_S)
    return link * LINK_EFFICIENCY


def pools(cluster: Cluster, knobs: Knobs) -> tuple[int, int]:
    """(rollout GPUs, training GPUs), from the memory model's layout (colocated: both the whole world;
    split: `split_rollout_gpus_per_node` per node roll out, the rest train). HF rollout generates on
    the training GPUs with the policy itself."""
    layout = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    if knobs.rollout_backend == "hf":
        return layout.trainer_gpus, layout.trainer_gpus
    return layout.rollout_gpus_per_node * cluster.num_nodes, layout.trainer_gpus


def kv_bytes_per_token_per_gpu(spec: ModelSpec, tp: int, kv_bytes: int = BF16_BYTES) -> int:
    """2 (K and V) · L · ceil(kv_heads / t) · d · bytes: the memory model's own formula."""
    return kv_bytes_per_token(spec.num_layers, spec.num_kv_heads, spec.head_dim, tp, kv_bytes)


@lru_cache(maxsize=64)
def param_counts(spec: ModelSpec) -> tuple[int, int]:
    """(total, active-per-token) parameters, memoised: the search calls the time model thousands of times."""
    return spec.num_params, spec.num_active_params


def attention_flops_per_token(spec: ModelSpec, context_tokens: float) -> float:
    """Forward QKᵀ and AV FLOPs of one token attending to `context_tokens` keys: 4 · L · q_dim · c."""
    return 4.0 * spec.num_layers * spec.q_dim * context_tokens


def forward_flops_per_token(spec: ModelSpec, seq_tokens: int) -> float:
    """2·P_active plus causal attention (average context seq/2)."""
    return 2.0 * param_counts(spec)[1] + attention_flops_per_token(spec, seq_tokens / 2)


def _ring_time_s(bytes_total: float, ranks: int, bw: float) -> float:
    """All-gather / reduce-scatter of `bytes_total` (full size) over `ranks`: (k-1)/k of it crosses each link."""
    if ranks <= 1:
        return 0.0
    return bytes_total * (ranks - 1) / ranks / bw


def rollout_time_s(
    spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, max_concurrent_seqs: int
) -> float:
    """Prefill + decode of every response of the step, per replica in parallel."""
    gpu = cluster.gpu
    rollout_gpus, _ = pools(cluster, knobs)
    hf = knobs.rollout_backend == "hf"
    tp = 1 if hf else knobs.rollout_tp
    replicas = max(1, rollout_gpus // tp)
    seqs = math.ceil(workload.responses_per_step / replicas)
    # vLLM's prefix cache (verl enable_prefix_caching=True) prefills each prompt once for its n samples.
    prompt_tokens = math.ceil(workload.prompts_per_step / replicas) * workload.prompt_len_tokens
    if hf:
        prompt_tokens = seqs * workload.prompt_len_tokens
    weight_bytes = precision_for("grpo-pilot", gpu.is_cpu).rollout_bytes * param_counts(spec)[0] / tp
    hbm = gpu.hbm_bytes_per_s * DECODE_HBM_EFFICIENCY
    launch_s = EAGER_LAUNCH_S_PER_LAYER * spec.num_layers if (hf or knobs.enforce_eager) else 0.0
    comm_bw = collective_bytes_per_s(gpu, spans_nodes=False)
    # HF generate on an FSDP policy all-gathers every weight for every forward.
    gather_s = (
        _ring_time_s(
            BF16_BYTES * param_counts(spec)[0], rollout_gpus, collective_bytes_per_s(gpu, cluster.num_nodes > 1)
        )
        if hf
        else 0.0
    )

    def tp_comm_s(tokens: float) -> float:
        if tp <= 1:
            return 0.0
        per_allreduce = ALLREDUCE_LATENCY_S + 2.0 * tokens * spec.hidden_size * BF16_BYTES * (tp - 1) / tp / comm_bw
        return 2 * spec.num_layers * per_allreduce

    # Prefill: chunks of max_num_batched_tokens; each chunk is compute-bound unless tiny.
    chunk = max(1, knobs.max_num_batched_tokens)
    num_chunks = math.ceil(prompt_tokens / chunk)
    prefill_flops = prompt_tokens * forward_flops_per_token(spec, workload.prompt_len_tokens) / tp
    prefill_s = max(prefill_flops / (gpu.bf16_flops * FORWARD_MFU), num_chunks * weight_bytes / hbm)
    prefill_s += num_chunks * (tp_comm_s(min(chunk, prompt_tokens)) + launch_s + gather_s)

    kv_per_token = kv_bytes_per_token_per_gpu(spec, tp, precision_for("grpo-pilot", gpu.is_cpu).rollout_bytes)
    avg_context = workload.prompt_len_tokens + workload.response_len_tokens / 2

    def decode_step_s(batch: int) -> float:
        memory_s = (weight_bytes + batch * avg_context * kv_per_token) / hbm
        flops = batch * (2.0 * param_counts(spec)[1] + attention_flops_per_token(spec, avg_context)) / tp
        return max(memory_s, flops / (gpu.bf16_flops * DECODE_MFU)) + tp_comm_s(batch) + launch_s + gather_s

    concurrency = max(1, min(max_concurrent_seqs, seqs))
    full_waves, rest = divmod(seqs, concurrency)
    steps = workload.response_len_tokens  # every wave lasts its longest response
    decode_s = full_waves * steps * decode_step_s(concurrency) + (steps * decode_step_s(rest) if rest else 0.0)
    return prefill_s + decode_s


def _micro_loop_s(
    seqs: int,
    per_micro: int,
    tokens_per_seq: float,
    compute_s_per_token: float,
    comm_s_per_micro: float,
    serial_s_per_token: float,
) -> float:
    """Full micro-batches of `per_micro` sequences and one partial one: each lasts max(compute,
    overlapped communication) plus its non-overlapped per-token time (`tokens_per_seq` per rank)."""

    def one(n: int) -> float:
        tokens = n * tokens_per_seq
        return max(tokens * compute_s_per_token, comm_s_per_micro) + tokens * serial_s_per_token

    per_micro = max(1, min(per_micro, seqs))
    full, rest = divmod(seqs, per_micro)
    return full * one(per_micro) + (one(rest) if rest else 0.0)


def budget_scaled_by_sp(target: Target) -> bool:
    """verl multiplies the per-GPU token budget by the Ulysses degree; our engine and TRL do not
    (planner/memory/tokens.py)."""
    return target == "verl"


def _seqs_per_token_budget(budget_tokens: int, sp: int, seq_tokens: int, target: Target) -> int:
    """Whole sequences one packed micro-batch (one SP group) holds; at least one."""
    group_budget = budget_tokens * sp if budget_scaled_by_sp(target) else budget_tokens
    return max(1, group_budget // seq_tokens)


def _ulysses_s(spec: ModelSpec, tokens_per_rank: float, sp: int, bw: float, passes: int) -> float:
    """All-to-all before and after attention (q, k, v in; output back), per layer, per pass."""
    if sp <= 1:
        return 0.0
    bytes_per_token = (2 * spec.q_dim + 2 * spec.kv_dim) * BF16_BYTES
    return passes * spec.num_layers * tokens_per_rank * bytes_per_token * (sp - 1) / sp / bw


def offload_streams(target: Target) -> bool:
    """How offloaded shards reach the GPU (planner/estimate.py step 2). verl: load-use-offload once per
    phase (fsdp_workers). Our engine and TRL (FSDP2 CPUOffloadPolicy / ZeRO-3 offload): shards stay on
    the host and stream in for every all-gather; the optimizer steps on the host."""
    return target != "verl"


def _host_rate(cluster: Cluster) -> float:
    return host_link_bytes_per_s(cluster.gpu)


def cpu_adam_s(shard_params: float, cluster: Cluster) -> float:
    """AdamW on the host over one rank's shard; every rank of the node shares host memory bandwidth."""
    per_rank = HOST_MEMORY_BYTES_PER_S / cluster.gpus_per_node
    return shard_params * ADAM_BYTES_PER_PARAM / per_rank


class _TrainSide(NamedTuple):
    """What both training-side phases (log-prob passes, update) derive from the inputs."""

    gpu: GPUSpec
    prec: Precision
    train_gpus: int
    sp: int
    seq: int
    dp: int  # data-parallel groups: training GPUs / SP degree
    bw: float  # collective bandwidth of the training pool
    shard_params: float  # parameters one training rank holds
    host: float  # host-link bytes/s per rank (offload traffic)


def _train_side(spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, target: Target) -> _TrainSide:
    gpu = cluster.gpu
    _, train_gpus = pools(cluster, knobs)
    return _TrainSide(
        gpu=gpu,
        prec=precision_for(target, gpu.is_cpu),
        train_gpus=train_gpus,
        sp=knobs.ulysses_sp,
        seq=workload.seq_len_tokens,
        dp=max(1, train_gpus // knobs.ulysses_sp),
        bw=collective_bytes_per_s(gpu, cluster.num_nodes > 1 and train_gpus > cluster.gpus_per_node),
        shard_params=param_counts(spec)[0] / train_gpus,
        host=_host_rate(cluster),
    )


def log_prob_time_s(spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, target: Target) -> float:
    """Old-policy pass (+ reference pass with the KL loss), sharded over the training pool."""
    gpu, prec, train_gpus, sp, seq, dp, bw, shard_params, host = _train_side(spec, cluster, workload, knobs, target)
    seqs_per_rank = math.ceil(workload.responses_per_step / dp)
    per_micro = _seqs_per_token_budget(knobs.log_prob_max_token_len_per_gpu, sp, seq, target)
    compute_per_token = forward_flops_per_token(spec, seq) / (gpu.bf16_flops * FORWARD_MFU)
    gather_s = _ring_time_s(BF16_BYTES * param_counts(spec)[0], train_gpus, bw)
    a2a_per_token = _ulysses_s(spec, 1, sp, bw, passes=1)
    streams = offload_streams(target) and not gpu.is_cpu

    def one_pass(offloaded: bool, bytes_per_param: int) -> float:
        h2d = bytes_per_param * shard_params / host if offloaded and not gpu.is_cpu else 0.0
        if streams:  # every micro-batch streams the shard in, overlapped with compute like the all-gather
            return _micro_loop_s(seqs_per_rank, per_micro, seq / sp, compute_per_token, gather_s + h2d, a2a_per_token)
        return (
            _micro_loop_s(seqs_per_rank, per_micro, seq / sp, compute_per_token, gather_s, a2a_per_token) + h2d
        )  # verl: once per pass

    total = 0.0
    if old_logprob_pass_needed(workload, target):
        total += one_pass(knobs.param_offload, prec.master_bytes)
    if workload.use_kl_loss:
        total += one_pass(knobs.ref_param_offload, prec.ref_bytes)
    return total


def update_time_s(spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, target: Target) -> float:
    """ppo_epochs × mini-batches × micro-batches of forward+backward, one optimizer step per mini-batch."""
    gpu, prec, train_gpus, sp, seq, dp, bw, shard_params, host = _train_side(spec, cluster, workload, knobs, target)
    num_minis = math.ceil(workload.prompts_per_step / workload.mini_batch_prompts)
    seqs_per_rank_mini = max(1, math.ceil(workload.mini_batch_prompts * workload.n / dp))
    if knobs.dynamic_batching:
        per_micro = _seqs_per_token_budget(knobs.max_token_len_per_gpu or seq, sp, seq, target)
    else:
        per_micro = knobs.micro_batch_size_per_gpu or 1
    fwd = forward_flops_per_token(spec, seq)
    # backward = 2× forward; full recompute adds one more forward (memory-model.md §5: 6P, +2P).
    flops_per_token = 3 * fwd + (fwd if knobs.gradient_checkpointing else 0.0)
    compute_per_token = flops_per_token / (gpu.bf16_flops * UPDATE_MFU)
    # FSDP per micro-batch: all-gather bf16 params in forward and again in backward
    # (reshard_after_forward), reduce-scatter fp32 grads (verl MixedPrecision reduce_dtype fp32).
    comm_s = _ring_time_s((2 * BF16_BYTES + FP32_BYTES) * param_counts(spec)[0], train_gpus, bw)
    p_off = knobs.param_offload and not gpu.is_cpu
    o_off = knobs.optimizer_offload and not gpu.is_cpu
    phase_s = 0.0  # once per update phase
    optim_s = shard_params * ADAM_BYTES_PER_PARAM / gpu.hbm_bytes_per_s
    if offload_streams(target):
        if p_off:  # shard in for forward and backward, grads out, every micro-batch
            comm_s += (2 * prec.master_bytes + prec.grad_bytes) * shard_params / host
        if p_off or o_off:  # the optimizer steps on the host
            optim_s = cpu_adam_s(shard_params, cluster)
            if not p_off:  # grads out, updated params back, per optimizer step
                optim_s += (prec.grad_bytes + prec.master_bytes) * shard_params / host
    else:
        # verl loads offloaded states for the phase and offloads them after (each crosses PCIe twice).
        phase_s += 2 * prec.master_bytes * shard_params / host if p_off else 0.0
        phase_s += 2 * prec.adam_bytes * shard_params / host if o_off else 0.0
    passes = 3 if knobs.gradient_checkpointing else 2
    a2a_per_token = _ulysses_s(spec, 1, sp, bw, passes=passes)
    micros_s = _micro_loop_s(seqs_per_rank_mini, per_micro, seq / sp, compute_per_token, comm_s, a2a_per_token)
    per_epoch = num_minis * (micros_s + optim_s)
    return workload.ppo_epochs * per_epoch + phase_s


def weight_sync_time_s(spec: ModelSpec, cluster: Cluster, knobs: Knobs, target: Target = "grpo-pilot") -> float:
    """Trainer → rollout engine: gather 2·P bf16 bytes, load into vLLM; none for HF rollout."""
    if knobs.rollout_backend == "hf":
        return 0.0
    gpu = cluster.gpu
    _, train_gpus = pools(cluster, knobs)
    weights = BF16_BYTES * param_counts(spec)[0]
    load_s = weights / knobs.rollout_tp / gpu.hbm_bytes_per_s
    p_off = knobs.param_offload and not gpu.is_cpu
    # Offloaded params come from the host once (verl loads them for the sync; streaming targets read
    # each shard once while gathering).
    offload_s = (
        precision_for(target, gpu.is_cpu).master_bytes * param_counts(spec)[0] / train_gpus / _host_rate(cluster)
        if p_off
        else 0.0
    )
    if knobs.placement == "split":
        cross = INTER_NODE_BYTES_PER_S if cluster.num_nodes > 1 else gpu.link_bytes_per_s
        return weights / (cross * LINK_EFFICIENCY) + load_s + offload_s
    return _ring_time_s(weights, train_gpus, collective_bytes_per_s(gpu, cluster.num_nodes > 1)) + load_s + offload_s


def model_flops_per_step(spec: ModelSpec, workload: Workload, target: Target) -> float:
    """Useful FLOPs (no recompute): 6·P per trained token per epoch, 2·P per log-prob token and per
    rollout token (prompt + response), attention included."""
    seq = workload.seq_len_tokens
    tokens = workload.responses_per_step * seq
    fwd = forward_flops_per_token(spec, seq)
    passes = int(old_logprob_pass_needed(workload, target)) + int(workload.use_kl_loss)
    return tokens * fwd * (3 * workload.ppo_epochs + passes + 1)


def estimate_time(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    target: Target = "grpo-pilot",
    max_concurrent_seqs: int | None = None,
) -> TimeReport:
    """Roofline seconds per phase. `max_concurrent_seqs` is the rollout concurrency per replica from
    the memory estimate (KV capacity capped by max_num_seqs); None means `knobs.max_num_seqs`."""
    concurrency = knobs.max_num_seqs if max_concurrent_seqs is None else max_concurrent_seqs
    phases = {
        "rollout": rollout_time_s(model, cluster, workload, knobs, concurrency),
        "log_prob": log_prob_time_s(model, cluster, workload, knobs, target),
        "update": update_time_s(model, cluster, workload, knobs, target),
        "weight_sync": weight_sync_time_s(model, cluster, knobs, target),
    }
    step_s = sum(phases.values())
    trained_tokens = workload.responses_per_step * workload.seq_len_tokens
    peak = cluster.gpu.bf16_flops * cluster.world_size
    return TimeReport(
        phases_s=phases,
        step_s=step_s,
        tokens_per_s=trained_tokens / step_s if step_s > 0 else 0.0,
        mfu=model_flops_per_step(model, workload, target) / (peak * step_s) if step_s > 0 else 0.0,
    )
