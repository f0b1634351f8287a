"""Step-time terms of the launch families (Megatron pipelines and TP collectives, offload traffic over the
host link, activation offload, QLoRA dequantization). Pure functions of plain numbers: bandwidths come
from `roofline.py` (`host_link_bytes_per_s`, `collective_bytes_per_s`), compute times from its roofline.

- Pipeline bubble (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", arXiv 2104.04473 §2.2): with m micro-batches over p stages a 1F1B pipeline idles
  (p − 1) micro-batch slots, the interleaved schedule with v chunks per stage (p − 1)/v: a step lasts
  (m + (p − 1)/v) × one micro-batch's forward + backward on one stage.
- Megatron tensor parallelism (Korthikanti et al. 2022, arXiv 2205.05198 §4.2.2): per layer, forward
  and backward each run two all-reduces of the c·T·h activations without SP, or two all-gathers and two
  reduce-scatters with SP — the same ring traffic: 4·(t − 1)/t · c·T·h bytes per rank per direction.
- verl's Megatron / FSDP offload is load-use-offload: a phase that needs offloaded states copies them in
  (H2D) before and out (D2H) after, not overlapped with compute.
- Activation offload (verl/utils/activation_offload.py): each offloaded byte goes D2H in forward and H2D
  in backward on side streams; a layer's copy overlaps the next layer's compute, so only the excess of
  transfer over compute per layer is exposed.
- QLoRA / LLM.int8 dequantization (bitsandbytes dequant + F.linear for large batches): every pass reads
  the quantized weights and writes them in the compute dtype — memory-bound, per forward, backward and
  recomputed forward.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.planner.roofline import ring_time_s

TP_RING_OPS_PER_LAYER_PASS = 4  # two all-reduces = two (reduce-scatter + all-gather) pairs per layer per pass


def pipeline_bubble_fraction(pp: int, vpp: int, num_microbatches: int) -> float:
    """Idle share of an ideal pipelined step: (p − 1) / (v · m) (0 without pipelining)."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (max(1, vpp) * max(1, num_microbatches))


def pipelined_step_s(stage_microbatch_s: float, num_microbatches: int, pp: int, vpp: int = 1) -> float:
    """A pipelined step: (m + (p − 1)/v) × the forward + backward of one micro-batch on one stage."""
    m = max(1, num_microbatches)
    return stage_microbatch_s * m * (1.0 + pipeline_bubble_fraction(pp, vpp, m))


def megatron_tp_comm_bytes_per_layer(tokens: int, hidden: int, compute_bytes: int, tp: int) -> float:
    """Bytes each TP rank sends per layer per pass (forward or backward): 4·(t − 1)/t · c·T·h (SP or not)."""
    if tp <= 1:
        return 0.0
    return TP_RING_OPS_PER_LAYER_PASS * (tp - 1) / tp * compute_bytes * tokens * hidden


def megatron_tp_comm_s(tokens: int, hidden: int, compute_bytes: int, tp: int, *, link_bytes_per_s: float) -> float:
    """Per layer per pass TP collective time (not overlapped with compute in Megatron's default)."""
    per_op = compute_bytes * tokens * hidden
    return TP_RING_OPS_PER_LAYER_PASS * ring_time_s(per_op, tp, link_bytes_per_s)


def offload_round_trip_s(offloaded_bytes: int, host_link_bytes_per_s: float) -> float:
    """Load-use-offload of `offloaded_bytes` around one phase: H2D before, D2H after."""
    return 2.0 * offloaded_bytes / host_link_bytes_per_s


class OffloadTime(NamedTuple):
    transfer_s: float  # link busy time
    exposed_s: float  # what the step waits for


def activation_offload_time_s(
    bytes_per_layer: int,
    offloaded_layers: int,
    host_link_bytes_per_s: float,
    *,
    forward_layer_s: float,
    backward_layer_s: float,
) -> OffloadTime:
    """One micro-batch's activation offload: D2H behind each forward layer, H2D behind each backward layer."""
    one_way = bytes_per_layer / host_link_bytes_per_s
    exposed = max(0.0, one_way - forward_layer_s) + max(0.0, one_way - backward_layer_s)
    return OffloadTime(2.0 * one_way * offloaded_layers, exposed * offloaded_layers)


def dequant_s(quantized_bytes: int, dequantized_bytes: int, passes: int, hbm_bytes_per_s: float) -> float:
    """Dequantizing every quantized linear `passes` times (forward, backward, recompute): read + write."""
    return passes * (quantized_bytes + dequantized_bytes) / hbm_bytes_per_s
