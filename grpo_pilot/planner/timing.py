"""Step time of one GRPO step (reference/memory-model.md §5), for ranking plans and predicting runs.

`T_step = T_rollout + T_log_prob (old + ref) + T_update + T_weight_sync`, phases run one after
another (synchronous, on-policy GRPO; with split placement the pools still wait for each other).
Time follows the expected lengths of the workload (`lengths.py`); the rollout is paced by its tail.

- rollout, per replica (rollout GPUs / TP), all replicas in parallel:
  prefill — compute-bound (2·P FLOPs per prompt token, vLLM's prefix cache prefills a prompt once for
  its n samples), never faster than reading the weights once per `max_num_batched_tokens` chunk;
  decode — vLLM batches continuously: the replica's S sequences run C at a time (C = the KV cache's
  capacity at the expected sequence length, capped by `max_num_seqs`), so decode takes
  max(tail, S·R̄ / C) steps; HF generate decodes fixed batches, each as long as its longest response.
  Over all steps the GPU reads the weights once per step and every live sequence's KV cache
  (Σ context = S·(P̄·R̄ + E[R²]/2) tokens), and computes 2·P per generated token: the decode time is the
  larger of that traffic over HBM bandwidth and those FLOPs over the peak, plus per step the engine's
  CPU time (V0: a fixed part and a part per running sequence; V1 overlaps it), the eager-mode kernel
  dispatch when CUDA graphs are off, and two TP all-reduces per layer (latency + bytes over the link).
- log-prob passes (old policy; reference with the KL loss): 2·P FLOPs per token plus attention.
- update: 6·P FLOPs per token (+2·P with full recompute) per epoch, plus the optimizer step.
- FSDP all-gathers / reduce-scatters overlap compute within a micro-batch: a micro-batch lasts
  max(compute, communication). Ulysses all-to-alls do not overlap. Offload traffic follows the
  executor (`ExecutorTraits.offload_streams`): verl loads and offloads whole shards once per phase
  (not overlapped); our engine and TRL stream shards in with every all-gather and step the optimizer
  on the host.
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
from grpo_pilot.planner.lengths import Lengths, lengths_of, tokens_per_sequence_for_time
from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token
from grpo_pilot.planner.memory.layout import layout_for
from grpo_pilot.planner.memory.precision import Precision, precision_for
from grpo_pilot.planner.reports import TimeReport
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import BF16_BYTES, FP32_BYTES

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
# Small-message all-reduce latency (decode TP all-reduces are a few KB to a few MB): nccl-tests /
# vLLM custom all-reduce report ~5-20 µs on NVLink; 10 µs per collective.
ALLREDUCE_LATENCY_S = 10e-6
# vLLM V0 engine time per decode step outside the model forward (scheduling, input preparation, sampled
# tokens back to the CPU): vLLM RFC #6854 (multi-step scheduling) measured 5-13 ms of GPU bubble per decode
# step; the midpoint, 9 ms. On top, V0 turns every running sequence's output into Python objects inside the
# step: RFC #6913 (asynchronous output processor) measured `_process_model_outputs` at 3.4 ms for a batch of
# 32 on Llama-3-70B / 4×H100, 0.106 ms per sequence.
VLLM_V0_STEP_OVERHEAD_S = 9e-3
VLLM_V0_SEQ_STEP_OVERHEAD_S = 3.4e-3 / 32
# The V1 engine (vLLM >= 0.8 default) runs scheduling and output processing in a separate busy loop that
# overlaps the forward ("near-zero CPU overhead", vLLM V1 user guide): no per-step engine term.
VLLM_V1_STEP_OVERHEAD_S = 0.0
# Kernel dispatch without CUDA graphs (vLLM enforce_eager, HF generate), per decoder layer per forward:
# a Llama-3.1-8B decode step on an H100 SXM5 measured 8.4 ms eager vs 5.1 ms as a CUDA graph
# (cloudai.pt, "CUDA Graphs + torch.compile: 1.65x LLM Decode Speedup"): 3.3 ms over 32 layers.
EAGER_LAUNCH_S_PER_LAYER = 3.3e-3 / 32
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
# Host link (PCIe generation) by catalog GPU: vendor datasheets (A100/A800: PCIe 4.0; H100/H800/H20/H200,
# B200, MI300X, RTX 5090: PCIe 5.0; the rest PCIe 4.0). Bytes/s, one direction, x16.
_PCIE5 = 64 * GB
_PCIE4 = 32 * GB
HOST_LINK_BYTES_PER_S = {
    "H100-80G": _PCIE5,
    "H100-PCIE": _PCIE5,
    "H800": _PCIE5,
    "H20": _PCIE5,
    "H20-141G": _PCIE5,
    "H200": _PCIE5,
    "B200": _PCIE5,
    "MI300X": _PCIE5,
    "RTX5090": _PCIE5,
}


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


def forward_flops_per_token(spec: ModelSpec, seq_tokens: float) -> float:
    """2·P_active plus causal attention (average context seq/2)."""
    return 2.0 * param_counts(spec)[1] + attention_flops_per_token(spec, seq_tokens / 2)


def _ring_time_s(bytes_total: float, ranks: int, bw: float) -> float:
    """All-gather / reduce-scatter of `bytes_total` (full size) over `ranks`: (k-1)/k of it crosses each link."""
    if ranks <= 1:
        return 0.0
    return bytes_total * (ranks - 1) / ranks / bw


def allreduce_s(bytes_total: float, ranks: int, bw: float) -> float:
    """One ring all-reduce: latency plus 2·(k−1)/k of the message over each link (0 without peers)."""
    if ranks <= 1:
        return 0.0
    return ALLREDUCE_LATENCY_S + 2.0 * bytes_total * (ranks - 1) / ranks / bw


class RolloutBreakdown(NamedTuple):
    """How one rollout spends its time, per replica (all replicas run in parallel)."""

    replicas: int
    seqs_per_replica: int
    concurrency: int  # sequences decoding at once
    decode_steps: int
    prefill_s: float
    decode_roofline_s: float  # max(weight + KV traffic / bandwidth, FLOPs / peak)
    decode_overhead_s: float  # per-step engine overhead, eager dispatch, TP all-reduces

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_roofline_s + self.decode_overhead_s


def rollout_breakdown(
    spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, kv_cache_tokens_per_gpu: int | None = None
) -> RolloutBreakdown:
    """Prefill and decode of every response of the step (module docstring). `kv_cache_tokens_per_gpu`
    is the KV capacity the memory estimate found (None = unlimited: `max_num_seqs` caps concurrency)."""
    gpu, L = cluster.gpu, lengths_of(workload)
    rollout_gpus, _ = pools(cluster, knobs)
    hf = knobs.rollout_backend == "hf"
    tp = 1 if hf else knobs.rollout_tp
    replicas = max(1, rollout_gpus // tp)
    seqs = math.ceil(workload.responses_per_step / replicas)
    rollout_bytes = precision_for("grpo-pilot", gpu.is_cpu).rollout_bytes
    total_params, active_params = param_counts(spec)
    weight_bytes = rollout_bytes * total_params / tp
    hbm = gpu.hbm_bytes_per_s * DECODE_HBM_EFFICIENCY
    peak = gpu.bf16_flops
    eager_s = EAGER_LAUNCH_S_PER_LAYER * spec.num_layers if (hf or knobs.enforce_eager) else 0.0
    v0 = not hf and knobs.vllm_engine == "v0"
    engine_s = 0.0 if hf else (VLLM_V0_STEP_OVERHEAD_S if v0 else VLLM_V1_STEP_OVERHEAD_S)
    seq_step_s = VLLM_V0_SEQ_STEP_OVERHEAD_S if v0 else 0.0
    link = collective_bytes_per_s(gpu, spans_nodes=tp > cluster.gpus_per_node)
    # HF generate on an FSDP policy all-gathers every weight for every forward.
    gather_s = (
        _ring_time_s(BF16_BYTES * total_params, rollout_gpus, collective_bytes_per_s(gpu, cluster.num_nodes > 1))
        if hf
        else 0.0
    )

    def tp_comm_s(tokens: float) -> float:
        return 2 * spec.num_layers * allreduce_s(tokens * spec.hidden_size * BF16_BYTES, tp, link)

    # Prefill: each distinct prompt once (prefix cache; HF prefills every row), in chunks.
    prompt_tokens = (seqs if hf else math.ceil(workload.prompts_per_step / replicas)) * L.prompt_mean
    chunk = max(1, knobs.max_num_batched_tokens)
    num_chunks = max(1, math.ceil(prompt_tokens / chunk))
    prefill_flops = prompt_tokens * forward_flops_per_token(spec, L.prompt_mean) / tp
    prefill_s = max(prefill_flops / (peak * FORWARD_MFU), num_chunks * weight_bytes / hbm)
    prefill_s += num_chunks * (tp_comm_s(min(chunk, prompt_tokens)) + eager_s + engine_s + gather_s)

    # Decode: concurrency from the KV capacity at the expected sequence length.
    cap = knobs.max_num_seqs
    if kv_cache_tokens_per_gpu is not None and not hf:
        cap = min(cap, kv_cache_tokens_per_gpu // max(1, math.ceil(L.seq_mean)))
    concurrency = max(1, min(cap, seqs))
    generated = seqs * L.response_mean
    if hf:  # fixed batches, each lasting its longest response
        steps = math.ceil(seqs / concurrency) * L.response_tail
    else:  # continuous batching: the tail or the throughput, whichever is longer
        steps = max(L.response_tail, math.ceil(generated / concurrency))
    kv_per_token = kv_bytes_per_token_per_gpu(spec, tp, rollout_bytes)
    context_reads = seqs * (L.prompt_mean * L.response_mean + L.response_second_moment / 2)
    memory_s = (steps * weight_bytes + context_reads * kv_per_token) / hbm
    mean_context = L.prompt_mean + L.response_second_moment / (2 * max(L.response_mean, 1.0))
    decode_flops = generated * (2.0 * active_params + attention_flops_per_token(spec, mean_context)) / tp
    roofline_s = max(memory_s, decode_flops / (peak * DECODE_MFU))
    batch = generated / steps if steps else 0.0
    # every generated token is one running sequence in one step
    overhead_s = steps * (engine_s + eager_s + tp_comm_s(batch) + gather_s) + generated * seq_step_s
    return RolloutBreakdown(
        replicas=replicas,
        seqs_per_replica=seqs,
        concurrency=concurrency,
        decode_steps=steps,
        prefill_s=prefill_s,
        decode_roofline_s=roofline_s,
        decode_overhead_s=overhead_s,
    )


def rollout_time_s(
    spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, kv_cache_tokens_per_gpu: int | None = None
) -> float:
    """Seconds of the rollout phase (`rollout_breakdown(...).total_s`)."""
    return rollout_breakdown(spec, cluster, workload, knobs, kv_cache_tokens_per_gpu).total_s


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
    (`ExecutorTraits.budget_scaled_by_sp`)."""
    return traits_for(target).budget_scaled_by_sp


def _seqs_per_token_budget(budget_tokens: int, sp: int, seq_tokens: float, target: Target) -> int:
    """Whole sequences one packed micro-batch (one SP group) holds; at least one."""
    group_budget = budget_tokens * sp if budget_scaled_by_sp(target) else budget_tokens
    return max(1, int(group_budget // max(1.0, seq_tokens)))


def _ulysses_s(spec: ModelSpec, tokens_per_rank: float, sp: int, bw: float, passes: int) -> float:
    """All-to-all before and after attention (q, k, v in; output back), per layer, per pass."""
    if sp <= 1:
        return 0.0
    bytes_per_token = (2 * spec.q_dim + 2 * spec.kv_dim) * BF16_BYTES
    return passes * spec.num_layers * tokens_per_rank * bytes_per_token * (sp - 1) / sp / bw


def offload_streams(target: Target) -> bool:
    """How offloaded shards reach the GPU (`ExecutorTraits.offload_streams`): verl loads and offloads
    once per phase (fsdp_workers); our engine and TRL stream shards in with every all-gather."""
    return traits_for(target).offload_streams


def cpu_adam_s(shard_params: float, cluster: Cluster) -> float:
    """AdamW on the host over one rank's shard; every rank of the node shares host memory bandwidth."""
    per_rank = HOST_MEMORY_BYTES_PER_S / cluster.gpus_per_node
    return shard_params * ADAM_BYTES_PER_PARAM / per_rank


class _TrainSide(NamedTuple):
    """What both training-side phases (log-prob passes, update) derive from the inputs."""

    gpu: GPUSpec
    prec: Precision
    lengths: Lengths
    train_gpus: int
    sp: int
    seq: float  # tokens one sequence costs in a pass (expected length; TRL: padded)
    dp: int  # data-parallel groups: training GPUs / SP degree
    bw: float  # collective bandwidth of the training pool
    shard_params: float  # parameters one training rank holds
    host: float  # host-link bytes/s per rank (offload traffic)


def _train_side(spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, target: Target) -> _TrainSide:
    gpu = cluster.gpu
    _, train_gpus = pools(cluster, knobs)
    lengths = lengths_of(workload)
    return _TrainSide(
        gpu=gpu,
        prec=precision_for(target, gpu.is_cpu),
        lengths=lengths,
        train_gpus=train_gpus,
        sp=knobs.ulysses_sp,
        seq=tokens_per_sequence_for_time(lengths, traits_for(target).padding),
        dp=max(1, train_gpus // knobs.ulysses_sp),
        bw=collective_bytes_per_s(gpu, cluster.num_nodes > 1 and train_gpus > cluster.gpus_per_node),
        shard_params=param_counts(spec)[0] / train_gpus,
        host=host_link_bytes_per_s(gpu),
    )


def _attention_seq(lengths: Lengths, padding: str) -> float:
    """Sequence length whose causal attention cost per token matches the batch's: Σ L² / Σ L = E[L²] / E[L]
    over real lengths (padded rows: the padded length)."""
    if padding == "batch_max":
        return float(lengths.seq_max)
    second = lengths.seq_mean**2 + lengths.seq_std**2
    return min(float(lengths.seq_max), second / max(lengths.seq_mean, 1.0))


def log_prob_time_s(spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, target: Target) -> float:
    """Old-policy pass (+ reference pass with the KL loss), sharded over the training pool."""
    ts = _train_side(spec, cluster, workload, knobs, target)
    gpu, sp, seq = ts.gpu, ts.sp, ts.seq
    seqs_per_rank = math.ceil(workload.responses_per_step / ts.dp)
    if knobs.log_prob_micro_batch_size_per_gpu is not None:
        per_micro = knobs.log_prob_micro_batch_size_per_gpu
    else:
        per_micro = _seqs_per_token_budget(knobs.log_prob_max_token_len_per_gpu, sp, seq, target)
    compute_per_token = forward_flops_per_token(spec, _attention_seq(ts.lengths, traits_for(target).padding)) / (
        gpu.bf16_flops * FORWARD_MFU
    )
    gather_s = _ring_time_s(BF16_BYTES * param_counts(spec)[0], ts.train_gpus, ts.bw)
    a2a_per_token = _ulysses_s(spec, 1, sp, ts.bw, passes=1)
    streams = offload_streams(target) and not gpu.is_cpu

    def one_pass(offloaded: bool, bytes_per_param: int) -> float:
        h2d = bytes_per_param * ts.shard_params / ts.host if offloaded and not gpu.is_cpu else 0.0
        if streams:  # every micro-batch streams the shard in, overlapped with compute like the all-gather
            return _micro_loop_s(seqs_per_rank, per_micro, seq / sp, compute_per_token, gather_s + h2d, a2a_per_token)
        loop = _micro_loop_s(seqs_per_rank, per_micro, seq / sp, compute_per_token, gather_s, a2a_per_token)
        return loop + h2d  # verl: once per pass

    total = 0.0
    if old_logprob_pass_needed(workload, target):
        total += one_pass(knobs.param_offload, ts.prec.master_bytes)
    if workload.use_kl_loss:
        total += one_pass(knobs.ref_param_offload, ts.prec.ref_bytes)
    return total


def update_time_s(spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, target: Target) -> float:
    """ppo_epochs × mini-batches × micro-batches of forward+backward, one optimizer step per mini-batch."""
    ts = _train_side(spec, cluster, workload, knobs, target)
    gpu, prec, sp, seq, shard_params, host = ts.gpu, ts.prec, ts.sp, ts.seq, ts.shard_params, ts.host
    num_minis = math.ceil(workload.prompts_per_step / workload.mini_batch_prompts)
    seqs_per_rank_mini = max(1, math.ceil(workload.mini_batch_prompts * workload.n / ts.dp))
    if knobs.dynamic_batching:
        per_micro = _seqs_per_token_budget(knobs.max_token_len_per_gpu or ts.lengths.seq_max, sp, seq, target)
    else:
        per_micro = knobs.micro_batch_size_per_gpu or 1
    fwd = forward_flops_per_token(spec, _attention_seq(ts.lengths, traits_for(target).padding))
    # backward = 2× forward; full recompute adds one more forward (memory-model.md §5: 6P, +2P).
    flops_per_token = 3 * fwd + (fwd if knobs.gradient_checkpointing else 0.0)
    compute_per_token = flops_per_token / (gpu.bf16_flops * UPDATE_MFU)
    # FSDP per micro-batch: all-gather bf16 params in forward and again in backward
    # (reshard_after_forward), reduce-scatter fp32 grads (verl MixedPrecision reduce_dtype fp32).
    comm_s = _ring_time_s((2 * BF16_BYTES + FP32_BYTES) * param_counts(spec)[0], ts.train_gpus, ts.bw)
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
    a2a_per_token = _ulysses_s(spec, 1, sp, ts.bw, passes=passes)
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
        precision_for(target, gpu.is_cpu).master_bytes * param_counts(spec)[0] / train_gpus / host_link_bytes_per_s(gpu)
        if p_off
        else 0.0
    )
    if knobs.placement == "split":
        cross = INTER_NODE_BYTES_PER_S if cluster.num_nodes > 1 else gpu.link_bytes_per_s
        return weights / (cross * LINK_EFFICIENCY) + load_s + offload_s
    return _ring_time_s(weights, train_gpus, collective_bytes_per_s(gpu, cluster.num_nodes > 1)) + load_s + offload_s


def trained_tokens_per_step(workload: Workload) -> float:
    """Real tokens (prompt + response) one step trains on, at the expected lengths."""
    return workload.responses_per_step * workload.seq_mean_tokens


def model_flops_per_step(spec: ModelSpec, workload: Workload, target: Target) -> float:
    """Useful FLOPs (no recompute): 6·P per trained token per epoch, 2·P per log-prob token and per
    rollout token (prompt + response), attention included, at the expected lengths."""
    lengths = lengths_of(workload)
    fwd = forward_flops_per_token(spec, _attention_seq(lengths, traits_for(target).padding))
    passes = int(old_logprob_pass_needed(workload, target)) + int(workload.use_kl_loss)
    return trained_tokens_per_step(workload) * fwd * (3 * workload.ppo_epochs + passes + 1)


def estimate_time(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    target: Target = "grpo-pilot",
    kv_cache_tokens_per_gpu: int | None = None,
) -> TimeReport:
    """Seconds per phase at the workload's expected lengths. `kv_cache_tokens_per_gpu` is the rollout
    engine's KV capacity from the memory estimate (None = unlimited: `max_num_seqs` caps concurrency)."""
    phases = {
        "rollout": rollout_time_s(model, cluster, workload, knobs, kv_cache_tokens_per_gpu),
        "log_prob": log_prob_time_s(model, cluster, workload, knobs, target),
        "update": update_time_s(model, cluster, workload, knobs, target),
        "weight_sync": weight_sync_time_s(model, cluster, knobs, target),
    }
    step_s = sum(phases.values())
    peak = cluster.gpu.bf16_flops * cluster.world_size
    return TimeReport(
        phases_s=phases,
        step_s=step_s,
        tokens_per_s=trained_tokens_per_step(workload) / step_s if step_s > 0 else 0.0,
        mfu=model_flops_per_step(model, workload, target) / (peak * step_s) if step_s > 0 else 0.0,
    )
