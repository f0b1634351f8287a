"""Rollout time: prefill and decode of every response of a step, per replica (replicas run in parallel).

A replica is `rollout_tp` GPUs (vLLM) or one GPU (HF generate on the policy); the step's S responses
are split evenly over the replicas.

- prefill: compute-bound (2·P FLOPs per prompt token, vLLM's prefix cache prefills a prompt once for
  its n samples), never faster than reading the weights once per `max_num_batched_tokens` chunk;
- decode: vLLM batches continuously: the replica's S sequences run C at a time (C = the KV cache's
  capacity at the expected sequence length, capped by `max_num_seqs`), so decode takes
  max(tail, S·R̄ / C) steps; HF generate decodes fixed batches, each as long as its longest response.
  Over all steps each GPU reads its weight shard once per step and its share of every live sequence's
  KV cache (Σ context = S·(P̄·R̄ + E[R²]/2) tokens), and computes 2·P/t per generated token. The
  GEMMs take the larger of their weight traffic over HBM bandwidth and their FLOPs at the GEMM rate;
  the attention kernels, which run after them, the larger of the KV traffic and their FLOPs
  (`roofline.py`): the two add. After each forward, per step:
  * the sampler: vLLM V1 all-gathers the logits to every TP rank (`Platform.use_all_gather()` is true
    under V1: vllm/platforms/interface.py) and every rank samples the replica's whole batch, so each
    GPU streams B × V × the sampler's bytes per vocabulary entry (`Overheads`, read and written) —
    a cost that does not shrink with TP, which is one reason more, smaller replicas win;
  * TP collectives: two all-reduces of the hidden states per layer and the logits all-gather, each
    latency + bytes over the link;
  * the engine's CPU time (V0: a fixed part and a part per running sequence; V1 overlaps it), the
    eager-mode kernel dispatch when CUDA graphs are off, and for HF generate on an FSDP policy the
    all-gather of every weight (none for our engine's replica: an unsharded copy of the model on each rollout
    GPU — the training GPUs colocated, the rollout pool split — `hf_decode_mode.plan_hf_rollout`). HF decode
    loops (our engine's `hf` backend, TRL without vLLM) run eagerly
    and read the sampled tokens back every step: each step costs the host's dispatch of every layer's
    ops plus the step's own (embedding, sampling, stop checks), added to the device's work
    (`TimeCoefficients.hf_decode_s_per_layer`, `hf_decode_s_per_step`) — our engine's `static` loop too
    (the same ops, dispatched one by one). Its `cuda_graph` loop (the plan's `hf_decode`, resolved by
    `hf_decode_mode.planned_decode_mode`) replays each step as one CUDA graph: no per-layer dispatch, one
    launch per token (`cuda_graph_launch_s`), plus the captures: one graph per 128-slot attended length
    (`kernels.STATIC_LENGTH_BUCKET_TOKENS`) per fixed batch, each an eager warm-up step and its recording
    (both dispatch every op: twice the eager step's host time). A bitsandbytes-quantized policy
    (QLoRA) generating with HF dequantizes every linear in every forward of more than one row (bitsandbytes
    `matmul_4bit` takes its one-row gemv kernel only for a single token; `lora_time.dequant_micro_s`).
Every efficiency comes from `TimeCoefficients`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.kernels import STATIC_LENGTH_BUCKET_TOKENS
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.lengths import lengths_of
from grpo_pilot.planner.lora_time import dequant_micro_s, lora_time_terms
from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token_per_gpu
from grpo_pilot.planner.memory.precision import rollout_element_bytes
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads
from grpo_pilot.planner.roofline import (
    TokenCost,
    allreduce_s,
    attention_flops_per_token,
    collective_bytes_per_s,
    compute_seconds,
    memory_seconds,
    param_counts,
    pools,
    ring_time_s,
)
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS, TimeCoefficients
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import BF16_BYTES

# The sampler writes each of its per-vocabulary-entry buffers once and reads it once.
SAMPLER_TRAFFIC_PER_HELD_BYTE = 2


def _hf_step_s(spec: ModelSpec, workload: Workload, coef: TimeCoefficients, hbm_bytes_per_s: float) -> float:
    """One HF decode step's host time (every layer's dispatch and the step's own), plus a quantized (QLoRA)
    policy's dequantization of every linear in the forward (module docstring)."""
    dequant = dequant_micro_s(lora_time_terms(spec, workload), 1, hbm_bytes_per_s * coef.hbm_efficiency)
    return coef.hf_decode_s_per_layer * spec.num_layers + coef.hf_decode_s_per_step + dequant


def graph_captures_per_batch(longest_seq_tokens: float) -> int:
    """CUDA graphs one fixed batch of the static loop captures: one per 128-slot attended length it reaches."""
    return max(1, math.ceil(longest_seq_tokens / STATIC_LENGTH_BUCKET_TOKENS))


class RolloutBreakdown(NamedTuple):
    """How one rollout spends its time, per replica (all replicas run in parallel)."""

    replicas: int
    seqs_per_replica: int
    concurrency: int  # sequences decoding at once
    decode_steps: int
    prefill_s: float
    decode_roofline_s: float  # GEMMs max(weights / bandwidth, FLOPs / rate) + attention max(KV reads, FLOPs)
    decode_sampler_s: float  # logits → tokens over the replica's batch, on every GPU of the replica
    decode_tp_comm_s: float  # two all-reduces per layer and the logits all-gather, per step
    decode_overhead_s: float  # per-step engine overhead, eager dispatch, HF's weight all-gather

    @property
    def total_s(self) -> float:
        return (
            self.prefill_s
            + self.decode_roofline_s
            + self.decode_sampler_s
            + self.decode_tp_comm_s
            + self.decode_overhead_s
        )


class _Replica(NamedTuple):
    """One rollout replica's shape and its fixed per-forward costs (module docstring)."""

    hf: bool  # HF generate on the policy (one GPU per replica) rather than vLLM
    tp: int
    replicas: int
    seqs: int  # responses per replica
    rollout_bytes: int  # bytes per weight / KV element of the rollout
    active_params: float
    weight_bytes: float  # the replica's weight shard on one GPU
    eager_s: float  # per forward: eager dispatch, or the HF loop's host time
    engine_s: float  # per forward: vLLM's engine step
    seq_step_s: float  # per running sequence per step: vLLM V0's engine
    link_bytes_per_s: float  # the TP group's link
    gather_s: float  # per forward: HF generate's all-gather of an FSDP policy's weights
    gather_once_s: float  # per generate: the same gathered whole once (ZeRO-3 GatheredParameters)


def _replica(
    spec: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    coef: TimeCoefficients,
    replica_gpus: int | None = None,
) -> _Replica:
    """The replica shape (TP, count, responses each) and its per-forward host and gather costs. `replica_gpus`: our
    engine's hf rollout on replicas of the model, one per GPU (`hf_decode_mode.plan_hf_rollout`): unsharded, so no
    weight is gathered per forward; None: HF generate on the trainer's module (`pools`)."""
    gpu = cluster.gpu
    rollout_gpus = replica_gpus if replica_gpus is not None else pools(cluster, knobs)[0]
    hf = knobs.rollout_backend == "hf"
    tp = 1 if hf else knobs.rollout_tp
    replicas = max(1, rollout_gpus // tp)
    seqs = math.ceil(workload.responses_per_step / replicas)
    rollout_bytes = rollout_element_bytes(cluster.device)
    total_params, active_params = param_counts(spec)
    weight_bytes = rollout_bytes * total_params / tp
    if hf:  # the eager HF decode loop: host dispatch per layer and per step, a readback every step
        eager_s = _hf_step_s(spec, workload, coef, gpu.hbm_bytes_per_s)
    else:
        eager_s = coef.eager_launch_s_per_layer * spec.num_layers if knobs.enforce_eager else 0.0
    v0 = not hf and knobs.vllm_engine == "v0"
    engine_s = 0.0 if hf else (coef.vllm_v0_step_overhead_s if v0 else coef.vllm_v1_step_overhead_s)
    seq_step_s = coef.vllm_v0_seq_step_overhead_s if v0 else 0.0
    link = collective_bytes_per_s(gpu, tp > cluster.gpus_per_node, coef, gpus_per_node=cluster.gpus_per_node)
    # HF generate on an FSDP policy all-gathers every weight for every forward; gathered whole for the call
    # (ZeRO-3 GatheredParameters), once per generate.
    gather_once = hf and knobs.hf_generation_weights == "model"
    gather_s = (
        ring_time_s(
            BF16_BYTES * total_params,
            rollout_gpus,
            collective_bytes_per_s(gpu, cluster.num_nodes > 1, coef, gpus_per_node=cluster.gpus_per_node),
        )
        if hf and replica_gpus is None
        else 0.0
    )
    return _Replica(
        hf=hf,
        tp=tp,
        replicas=replicas,
        seqs=seqs,
        rollout_bytes=rollout_bytes,
        active_params=active_params,
        weight_bytes=weight_bytes,
        eager_s=eager_s,
        engine_s=engine_s,
        seq_step_s=seq_step_s,
        link_bytes_per_s=link,
        gather_s=0.0 if gather_once else gather_s,
        gather_once_s=gather_s if gather_once else 0.0,
    )


def _hidden_all_reduces_s(spec: ModelSpec, r: _Replica, coef: TimeCoefficients, tokens: float) -> float:
    """The two all-reduces of the hidden states per layer over the TP group, for one forward of `tokens`."""
    return (
        2
        * spec.num_layers
        * allreduce_s(tokens * spec.hidden_size * BF16_BYTES, r.tp, r.link_bytes_per_s, coef.allreduce_latency_s)
    )


def _logits_gather_s(spec: ModelSpec, r: _Replica, coef: TimeCoefficients, tokens: float) -> float:
    """The sampler's all-gather of the logits over the TP group (vLLM V1), for one forward of `tokens`."""
    if r.tp <= 1:
        return 0.0
    return coef.allreduce_latency_s + ring_time_s(tokens * spec.vocab_size * BF16_BYTES, r.tp, r.link_bytes_per_s)


def _prefill_s(
    spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, *, r: _Replica, coef: TimeCoefficients
) -> float:
    """Prefill: each distinct prompt once (prefix cache; HF prefills every row), in chunks."""
    gpu, L = cluster.gpu, lengths_of(workload)
    prompt_tokens = (r.seqs if r.hf else math.ceil(workload.prompts_per_step / r.replicas)) * L.prompt_mean
    chunk = max(1, knobs.max_num_batched_tokens)
    num_chunks = max(1, math.ceil(prompt_tokens / chunk))
    prefill_cost = TokenCost(
        2.0 * r.active_params / r.tp, attention_flops_per_token(spec, L.prompt_mean / 2) / r.tp, 0.0
    )
    prefill_s = max(
        prompt_tokens * compute_seconds(prefill_cost, gpu, coef), memory_seconds(num_chunks * r.weight_bytes, gpu, coef)
    )
    hidden_s = _hidden_all_reduces_s(spec, r, coef, min(chunk, prompt_tokens))
    return prefill_s + num_chunks * (hidden_s + r.eager_s + r.engine_s + r.gather_s)


def _decode_shape(
    workload: Workload, knobs: Knobs, r: _Replica, kv_cache_tokens_per_gpu: int | None
) -> tuple[int, int]:
    """(concurrency, decode steps): concurrency from the KV capacity at the expected sequence length."""
    L = lengths_of(workload)
    cap = knobs.max_num_seqs
    if kv_cache_tokens_per_gpu is not None and not r.hf:
        cap = min(cap, kv_cache_tokens_per_gpu // max(1, math.ceil(L.seq_mean)))
    concurrency = max(1, min(cap, r.seqs))
    generated = r.seqs * L.response_mean
    if r.hf:  # fixed batches, each lasting its longest response
        steps = math.ceil(r.seqs / concurrency) * L.response_tail
    else:  # continuous batching: the tail or the throughput, whichever is longer
        steps = max(L.response_tail, math.ceil(generated / concurrency))
    return concurrency, steps


def _decode_roofline_s(
    spec: ModelSpec, cluster: Cluster, workload: Workload, *, r: _Replica, steps: int, coef: TimeCoefficients
) -> float:
    """Two kernel classes per step, one after the other: the GEMMs stream the weight shard and compute
    2·P/t per running sequence (the larger of the two), then attention streams every live sequence's KV
    cache (and computes its QKᵀ and AV, the larger of the two)."""
    gpu, L = cluster.gpu, lengths_of(workload)
    generated = r.seqs * L.response_mean
    kv_per_token = kv_bytes_per_token_per_gpu(spec, r.tp, r.rollout_bytes)
    context_reads = r.seqs * (L.prompt_mean * L.response_mean + L.response_second_moment / 2)
    mean_context = L.prompt_mean + L.response_second_moment / (2 * max(L.response_mean, 1.0))
    gemm_s = max(
        memory_seconds(steps * r.weight_bytes, gpu, coef),
        generated * compute_seconds(TokenCost(2.0 * r.active_params / r.tp, 0.0, 0.0), gpu, coef),
    )
    attention_cost = TokenCost(0.0, attention_flops_per_token(spec, mean_context) / r.tp, 0.0)
    attention_s = max(
        memory_seconds(context_reads * kv_per_token, gpu, coef),
        generated * compute_seconds(attention_cost, gpu, coef),
    )
    return gemm_s + attention_s


def rollout_breakdown(
    spec: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    kv_cache_tokens_per_gpu: int | None = None,
    coefficients: TimeCoefficients = DEFAULT_TIME_COEFFICIENTS,
    overheads: Overheads = DEFAULT_OVERHEADS,
    decode_mode: str = "eager",
    replica_gpus: int | None = None,
) -> RolloutBreakdown:
    """Prefill and decode of every response of the step (module docstring). `kv_cache_tokens_per_gpu`
    is the KV capacity the memory estimate found (None = unlimited: `max_num_seqs` caps concurrency);
    `decode_mode` and `replica_gpus` what the hf rollout runs (`hf_decode_mode.plan_hf_rollout`, `_replica`)."""
    coef, gpu, L = coefficients, cluster.gpu, lengths_of(workload)
    r = _replica(spec, cluster, workload, knobs, coef=coef, replica_gpus=replica_gpus)
    concurrency, steps = _decode_shape(workload, knobs, r, kv_cache_tokens_per_gpu)
    generated = r.seqs * L.response_mean
    sampler_bytes = SAMPLER_TRAFFIC_PER_HELD_BYTE * overheads.vllm_sampler_bytes_per_vocab_entry * spec.vocab_size
    batch = generated / steps if steps else 0.0
    # every generated token is one running sequence in one step
    graphs = r.hf and decode_mode == "cuda_graph"
    step_host_s = coef.cuda_graph_launch_s if graphs else r.eager_s  # a graph: one launch, not every op
    overhead_s = steps * (r.engine_s + step_host_s + r.gather_s) + generated * r.seq_step_s + r.gather_once_s
    if graphs:  # each fixed batch captures its graphs once: a warm-up step and its recording, both eager
        batches = math.ceil(r.seqs / concurrency)
        overhead_s += batches * graph_captures_per_batch(L.prompt_mean + L.response_tail) * 2 * r.eager_s
    return RolloutBreakdown(
        replicas=r.replicas,
        seqs_per_replica=r.seqs,
        concurrency=concurrency,
        decode_steps=steps,
        prefill_s=_prefill_s(spec, cluster, workload, knobs, r=r, coef=coef),
        decode_roofline_s=_decode_roofline_s(spec, cluster, workload, r=r, steps=steps, coef=coef),
        decode_sampler_s=memory_seconds(generated * sampler_bytes, gpu, coef),
        decode_tp_comm_s=steps * (_hidden_all_reduces_s(spec, r, coef, batch) + _logits_gather_s(spec, r, coef, batch)),
        decode_overhead_s=overhead_s,
    )


def rollout_time_s(
    spec: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    kv_cache_tokens_per_gpu: int | None = None,
    coefficients: TimeCoefficients = DEFAULT_TIME_COEFFICIENTS,
    overheads: Overheads = DEFAULT_OVERHEADS,
    decode_mode: str = "eager",
    replica_gpus: int | None = None,
) -> float:
    """Seconds of the rollout phase (`rollout_breakdown(...).total_s`)."""
    return rollout_breakdown(
        spec,
        cluster,
        workload,
        knobs,
        kv_cache_tokens_per_gpu=kv_cache_tokens_per_gpu,
        coefficients=coefficients,
        overheads=overheads,
        decode_mode=decode_mode,
        replica_gpus=replica_gpus,
    ).total_s
