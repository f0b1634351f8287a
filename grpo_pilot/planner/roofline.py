"""Roofline building blocks of the step-time model: what a token costs and what the links carry.

A pass over T tokens takes, per token,

    matmul FLOPs / (peak × matmul efficiency)                       (dense GEMMs: 2·P_active per token)
  + attention FLOPs / (peak × matmul efficiency × attention share)  (flash kernels; 4·L·q_dim per key)
  + memory-bound bytes / (HBM bandwidth × HBM efficiency)           (norms, activations, RoPE, SwiGLU, logits)

with the efficiencies from `TimeCoefficients` (device-aware through the MAMF table). The three terms
add: kernels of a layer run one after another on one stream, so a compute-bound GEMM does not hide
the memory-bound RMSNorm that follows it. On a compute-poor, bandwidth-rich GPU (H20: 148 TFLOP/s
beside 4 TB/s) the GEMM term dominates and the pass runs near the GEMM rate; on a small model the
memory term (the logits above all: V entries per token) takes a large share, as measured MFUs show.

Memory-bound bytes of a forward: every activation byte a layer produces is written once and read once
by its consumer, so 2 × the bytes one layer saves per token (`memory.activations`, traced exactly for
HF eager layers) per layer; the backward reads each saved byte and writes and reads its gradient,
2 × the forward's traffic. The log-prob computation writes and reads each byte it holds per logits
element (`memory.logits`, the unfused path). Pure functions, no torch.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.hardware.device_traits import device_traits
from grpo_pilot.hardware.gpus import GPUSpec
from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.memory.activations import layer_activation_bytes_per_token
from grpo_pilot.planner.memory.layout import layout_for
from grpo_pilot.planner.memory.logits import logprob_logits_bytes
from grpo_pilot.planner.time_coefficients import TimeCoefficients
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import GB

# A produced byte is written once and read once (forward); the backward moves twice the forward's bytes.
FORWARD_TRAFFIC_PER_SAVED_BYTE = 2
BACKWARD_TRAFFIC_PER_FORWARD_BYTE = 2
# Host link (PCIe generation) by catalog GPU: vendor datasheets (A100/A800: PCIe 4.0; H100/H800/H20/H200,
# B200, MI300X, RTX 5090: PCIe 5.0; the rest PCIe 4.0). Bytes/s, one direction, x16.
_PCIE5 = 64 * GB
_PCIE4 = 32 * GB
PCIE5_GPUS = ("H100-80G", "H100-PCIE", "H800", "H20", "H20-141G", "H200", "B200", "MI300X", "RTX5090")


class TokenCost(NamedTuple):
    """Work of one token in one pass (FLOPs and bytes on one rank)."""

    matmul_flops: float
    attention_flops: float
    memory_bytes: float

    def times(self, k: float) -> "TokenCost":
        return TokenCost(self.matmul_flops * k, self.attention_flops * k, self.memory_bytes * k)

    def plus(self, other: "TokenCost") -> "TokenCost":
        return TokenCost(
            self.matmul_flops + other.matmul_flops,
            self.attention_flops + other.attention_flops,
            self.memory_bytes + other.memory_bytes,
        )


def compute_seconds(cost: TokenCost, gpu: GPUSpec, coef: TimeCoefficients) -> float:
    """Seconds of the FLOP terms only (matmul + attention) at the GPU's achieved rates."""
    rate = gpu.bf16_flops * coef.matmul_efficiency(gpu.name)
    return cost.matmul_flops / rate + cost.attention_flops / (rate * coef.attention_relative_efficiency)


def memory_seconds(num_bytes: float, gpu: GPUSpec, coef: TimeCoefficients) -> float:
    """Seconds to stream `num_bytes` through device memory at the achieved bandwidth."""
    return num_bytes / (gpu.hbm_bytes_per_s * coef.hbm_efficiency)


def token_seconds(cost: TokenCost, gpu: GPUSpec, coef: TimeCoefficients) -> float:
    """The three roofline terms of one token's pass, added (module docstring)."""
    return compute_seconds(cost, gpu, coef) + memory_seconds(cost.memory_bytes, gpu, coef)


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


@lru_cache(maxsize=256)
def layer_traffic_bytes(spec: ModelSpec, compute_bytes: int) -> int:
    """Memory-bound bytes of one forward per token over all layers: 2 × what each layer saves."""
    saved = layer_activation_bytes_per_token(
        hidden=spec.hidden_size,
        q_dim=spec.q_dim,
        kv_dim=spec.kv_dim,
        intermediate=spec.intermediate_size,
        num_heads=spec.num_attention_heads,
        compute_bytes=compute_bytes,
        qk_norm=spec.qk_norm,
        num_kv_heads=spec.num_kv_heads,
    )
    return FORWARD_TRAFFIC_PER_SAVED_BYTE * spec.num_layers * saved


def logits_traffic_bytes(vocab: int, compute_bytes: int, executor: ExecutorTraits, *, training: bool) -> int:
    """Bytes moved per token by the log-prob computation: each byte it holds per logits element
    (unfused path of `memory.logits`; TRL's tiles move what our unfused path does) written and read."""
    kernel = "verl" if executor.logits_kernel == "verl" else "ours"
    per_element = logprob_logits_bytes(1, 1, 0, compute_bytes, kernel=kernel, training=training, fused=False)
    return 2 * per_element * vocab


def forward_cost(spec: ModelSpec, attention_context: float, compute_bytes: int, logits_bytes: float) -> TokenCost:
    """One token's forward: 2·P_active of GEMMs, causal attention at the given average context, the
    layers' elementwise traffic and the log-prob computation's."""
    return TokenCost(
        matmul_flops=2.0 * param_counts(spec)[1],
        attention_flops=attention_flops_per_token(spec, attention_context),
        memory_bytes=layer_traffic_bytes(spec, compute_bytes) + logits_bytes,
    )


def training_cost(
    spec: ModelSpec, *, attention_context: float, compute_bytes: int, logits_bytes: float, recompute: bool
) -> TokenCost:
    """Forward + backward (2× the forward's FLOPs and traffic: memory-model.md §5's 6P) + one more
    forward with full activation checkpointing; the log-prob computation's training traffic once."""
    layers = forward_cost(spec, attention_context, compute_bytes, 0.0)
    flops = 1 + 2 + (1 if recompute else 0)
    traffic = 1 + BACKWARD_TRAFFIC_PER_FORWARD_BYTE + (1 if recompute else 0)
    return TokenCost(
        matmul_flops=layers.matmul_flops * flops,
        attention_flops=layers.attention_flops * flops,
        memory_bytes=layers.memory_bytes * traffic + logits_bytes,
    )


# ---- links -------------------------------------------------------------------------------------------


def host_link_bytes_per_s(gpu: GPUSpec, coef: TimeCoefficients) -> float:
    """Effective host↔device bandwidth (the CPU pseudo-device copies at its memory bandwidth)."""
    if not device_traits(gpu).offload_meaningful:
        return gpu.hbm_bytes_per_s
    return (_PCIE5 if gpu.name in PCIE5_GPUS else _PCIE4) * coef.host_link_efficiency


def collective_bytes_per_s(gpu: GPUSpec, spans_nodes: bool, coef: TimeCoefficients, *, gpus_per_node: int = 8) -> float:
    """Per-GPU bus bandwidth of a collective: the intra-node link's, or across nodes the smaller of that and
    the node's NICs together (NCCL runs one channel per NIC: `inter_node_collective_efficiency`)."""
    intra = gpu.link_bytes_per_s * coef.link_efficiency
    if not spans_nodes:
        return intra
    nics = gpus_per_node * coef.nic_bytes_per_s(gpu.name) * coef.inter_node_collective_efficiency
    return min(intra, nics)


def ring_time_s(bytes_total: float, ranks: int, bw: float) -> float:
    """All-gather / reduce-scatter of `bytes_total` (full size) over `ranks`: (k-1)/k of it crosses each link."""
    if ranks <= 1:
        return 0.0
    return bytes_total * (ranks - 1) / ranks / bw


def allreduce_s(bytes_total: float, ranks: int, bw: float, latency_s: float) -> float:
    """One ring all-reduce: latency plus 2·(k−1)/k of the message over each link (0 without peers)."""
    if ranks <= 1:
        return 0.0
    return latency_s + 2.0 * bytes_total * (ranks - 1) / ranks / bw


def pools(cluster: Cluster, knobs: Knobs) -> tuple[int, int]:
    """(rollout GPUs, training GPUs), from the memory model's layout (colocated: both the whole world;
    split: `split_rollout_gpus_per_node` per node roll out, the rest train). HF rollout reads as the training
    GPUs here, where only its rollout-TP-1 rules read the pool; where our engine's hf rollout really generates
    (a replica on each split rollout GPU) is `hf_decode_mode.hf_rollout_gpus`, which time and memory use."""
    layout = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    if knobs.rollout_backend == "hf":
        return layout.trainer_gpus, layout.trainer_gpus
    return layout.rollout_gpus_per_node * cluster.num_nodes, layout.trainer_gpus
