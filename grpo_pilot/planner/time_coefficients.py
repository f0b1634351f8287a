"""`TimeCoefficients`: every efficiency and rate the step-time model takes from outside its formulas.

The time model (`timing.py`, `rollout_time.py`, `roofline.py`) is a roofline: FLOPs over the device's
peak, bytes over its bandwidths. What a real kernel reaches of those peaks is not a formula; it is
one of the fields below, each with the public measurement it comes from. Nothing else in the time
model is a free number: calibration (grpo-tune, issue 9) fits a new `TimeCoefficients` from measured
runs and threads it through `PlanInputs.time_coefficients`, as `Overheads` is for memory.

Matmul efficiency is device-aware: the Maximum Achievable Matmul FLOPS (MAMF) measured per accelerator
(stas00/ml-engineering@b9e29720eebd4aa946fa9678975385efbc90a777 compute/accelerator/README.md, "Maximum
Achievable Matmul FLOPS comparison table", BF16 v2 table: mean of 100 iterations at the best shape of
a brute-force search), keyed by our catalog's GPU names; a GPU the table does not list gets the
default, the lower end of "optimized GEMM can reach up to 80-90% of the theoretical maximum device
throughput" (Dao, FlashAttention-2, arXiv 2307.08691, §1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from grpo_pilot.models import Frozen
from grpo_pilot.units import GB

# MAMF / datasheet peak, BF16 (ml-engineering table above). A800 and H800 are the export versions of
# A100 SXM and H100 SXM (same dies and clocks, NVLink cut; hardware/gpus.py), so they take those rows;
# H200 takes the GH200 row (the same GH100 die with 141 GB HBM3e, measured at 900 W).
MAMF_EFFICIENCY: dict[str, float] = {
    "A100-40G": 271.2 / 312,  # NVIDIA A100 SXM: 86.9%
    "A100-80G": 271.2 / 312,
    "A800-80G": 271.2 / 312,
    "H100-80G": 794.5 / 989,  # NVIDIA H100 SXM: 80.3%
    "H800": 794.5 / 989,
    "H200": 828.6 / 989,  # NVIDIA GH200 SXM 141 GB HBM3e: 83.6% (83.8% in the table's rounding)
    "MI300X": 668.4 / 1300,  # AMD MI300X, ROCm 6.3, PYTORCH_TUNABLEOP_ENABLED=1: 51.4%
}


# Kernel-launching aten ops of a Qwen2 decoder layer (TorchDispatchMode trace of transformers 5.19 on torch 2.13,
# SDPA, bf16; views excluded): 40 per KV-cached decode step, 38 per training forward, 74 per backward; 63 per
# sampled decode step outside the layers. Host cost per eager op: ~8 µs to issue a CUDA op from Python on an
# A100 host (flagos-ai/Torch-FL#27: `add` on 512² tensors issued back to back), consistent with PyTorch's
# "~5-10 µs per op" dispatch figures (pytorch/pytorch#41383).
HOST_S_PER_OP = 8e-6
HF_DECODE_OPS_PER_LAYER = 40
HF_DECODE_OPS_PER_STEP = 63
EAGER_OPS_PER_LAYER_PASS = (38 + 74) / 3


# GPUs whose reference node designs give every GPU a 400 Gb/s NDR InfiniBand NIC (DGX H100 / H200 / B200 and
# their HGX partners: 8 × ConnectX-7): 50 GB/s per direction.
NDR_GPUS = ("H100-80G", "H100-PCIE", "H800", "H20", "H20-141G", "H200", "B200")
NDR_NIC_BYTES_PER_S = 50 * GB


class TimeCoefficients(Frozen):
    """Efficiencies (fractions of datasheet peaks) and rates of the step-time model, with their sources."""

    matmul_efficiency_by_gpu: tuple[tuple[str, float], ...] = Field(
        default=tuple(sorted(MAMF_EFFICIENCY.items())),
        description="(catalog GPU name, achieved fraction of the dense BF16 peak in large GEMMs (MAMF)) pairs; "
        "a mapping is accepted. Pairs, not a dict, so that the coefficients (and PlanInputs) stay hashable.",
    )
    matmul_efficiency_default: float = Field(
        default=0.80,
        gt=0.0,
        le=1.0,
        # FlashAttention-2 §1: optimized GEMM reaches up to 80-90% of peak; the lower end for GPUs
        # without a MAMF measurement (H20, L40S, B200, ...).
        description="Matmul efficiency of a GPU the table does not list.",
    )
    attention_relative_efficiency: float = Field(
        default=0.7,
        gt=0.0,
        le=1.0,
        # FlashAttention-2 (arXiv 2307.08691): its attention reaches 50-73% of A100 peak where GEMMs
        # reach 80-90% (abstract, §1): about 0.7 of the GEMM rate.
        description="Attention (flash kernels) FLOP rate as a fraction of the GPU's matmul rate.",
    )
    hbm_efficiency: float = Field(
        default=0.6,
        gt=0.0,
        le=1.0,
        # Databricks, "LLM Inference Performance Engineering: Best Practices" (2023): ~60% memory
        # bandwidth utilisation (MBU) for 7B-class decode on A100; used for every memory-bound
        # stream (decode weights and KV, training elementwise traffic, logits, the sampler).
        description="Achieved fraction of peak HBM bandwidth in memory-bound kernels.",
    )
    link_efficiency: float = Field(
        default=0.75,
        gt=0.0,
        le=1.0,
        # nccl-tests all_reduce_perf: ~230 GB/s bus bandwidth on A100 NVLink3 (300 GB/s per direction)
        # = 0.77; 0.75 also covers PCIe rings.
        description="NCCL bus bandwidth / link peak for large collectives.",
    )
    allreduce_latency_s: float = Field(
        default=10e-6,
        ge=0.0,
        # nccl-tests / vLLM's custom all-reduce: ~5-20 µs per small-message collective on NVLink.
        description="Latency of one small-message collective (decode TP all-reduce, logits all-gather).",
    )
    vllm_v0_step_overhead_s: float = Field(
        default=9e-3,
        ge=0.0,
        # vLLM RFC #6854 (multi-step scheduling): 5-13 ms of GPU bubble per V0 decode step; midpoint.
        description="vLLM V0 engine time per decode step outside the forward.",
    )
    vllm_v0_seq_step_overhead_s: float = Field(
        default=3.4e-3 / 32,
        ge=0.0,
        # vLLM RFC #6913: V0 `_process_model_outputs` took 3.4 ms for a batch of 32 (Llama-3-70B, 4×H100).
        description="vLLM V0 output processing per running sequence per decode step.",
    )
    vllm_v1_step_overhead_s: float = Field(
        default=3e-3,
        ge=0.0,
        # V1 moves output processing out of the engine core, but without async scheduling (opt-in from vLLM
        # 0.10; full overlap only with vllm-project/vllm#23569, Aug 2025) the core still schedules and prepares
        # each step's inputs while the GPU waits: vllm-project/vllm#10634 measured a 5-6 ms gap between two
        # decodes of Llama-2-7B at batch 256 and located 2-3 ms of it in removable GIL contention; 3 ms stays.
        description="vLLM V1 engine time per decode step outside the forward (scheduling, input preparation).",
    )
    eager_launch_s_per_layer: float = Field(
        default=3.3e-3 / 32,
        ge=0.0,
        # cloudai.pt, "CUDA Graphs + torch.compile: 1.65x LLM Decode Speedup": a Llama-3.1-8B decode
        # step on H100 SXM5 took 8.4 ms eager vs 5.1 ms as a CUDA graph: 3.3 ms over 32 layers.
        description="Kernel-dispatch time per decoder layer per forward without CUDA graphs.",
    )
    train_dispatch_s_per_layer_pass: float = Field(
        default=EAGER_OPS_PER_LAYER_PASS * HOST_S_PER_OP,
        ge=0.0,
        # A Qwen2 layer dispatches 38 kernel-launching ops in a training forward and 74 in its backward
        # (traced op count, torch 2.13 / transformers 5.19, SDPA, bf16: 112 ops over the 3 passes the
        # update counts, ~37 per pass) at HOST_S_PER_OP each. The packaged H200 calibration measures it on
        # a real GPU host (planner/calibrations/).
        description="Host op-dispatch time per decoder layer per training pass (forward, backward, recompute) "
        "of one micro-batch.",
    )
    hf_decode_s_per_layer: float = Field(
        default=HF_DECODE_OPS_PER_LAYER * HOST_S_PER_OP,
        ge=0.0,
        # A Qwen2 decoder layer launches 40 ops per decode step with a KV cache (traced op count, as above);
        # an eager HF decode loop dispatches them one by one.
        description="Host time per decoder layer per decode step of an eager HF decode loop (our hf backend, "
        "TRL without vLLM).",
    )
    hf_decode_s_per_step: float = Field(
        default=HF_DECODE_OPS_PER_STEP * HOST_S_PER_OP,
        ge=0.0,
        # Outside the layers a sampled decode step launches ~63 ops (embedding, rotary tables, final norm,
        # lm_head, temperature / top-k / top-p sampling, stop checks; traced op count, as above).
        description="Host time per decode step outside the layers (embedding, lm_head, sampling, stop checks).",
    )
    cuda_graph_launch_s: float = Field(
        default=HOST_S_PER_OP,
        ge=0.0,
        # Our static decode loop replays one captured graph per token (engine/rollout/cuda_graphs.py): the host
        # issues one `CUDAGraph.replay()` (one cudaGraphLaunch, whose CPU cost does not grow with the graph's
        # kernel count for a straight-line graph: NVIDIA technical blog, "Constant Time Launch for Straight-Line
        # CUDA Graphs and Other Performance Enhancements", CUDA 12.6) instead of every op of every layer; charged
        # as one eager op from Python (HOST_S_PER_OP).
        description="Host time per decode step of our hf rollout's CUDA-graph loop (one graph replay per token).",
    )
    host_link_efficiency: float = Field(
        default=0.8,
        gt=0.0,
        le=1.0,
        # CUDA bandwidthTest: pinned copies reach ~25 GB/s of PCIe 4.0 x16's 32 GB/s.
        description="Achieved fraction of the PCIe peak for pinned host<->device copies.",
    )
    inter_node_bytes_per_s: float = Field(
        default=25 * GB,
        gt=0.0,
        # DGX A100 reference design: one 200 Gb/s HDR InfiniBand NIC per GPU = 25 GB/s per direction; the
        # GPUs of `NDR_GPUS` get the DGX H100 / H200 / B200 design's 400 Gb/s NDR NIC per GPU (`nic_bytes_per_s`).
        description="Inter-node bandwidth per GPU (its NIC), one direction, for GPUs without a 400 Gb/s design.",
    )
    inter_node_collective_efficiency: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        # NCCL spreads a multi-node collective over every NIC of a node (one channel per NIC): the node's
        # aggregate NIC bandwidth bounds the per-GPU bus bandwidth. NVIDIA/nccl#1218: all_gather reaches ~200
        # GB/s bus bandwidth on 32 nodes of 8 H100 with one 400 Gb/s NIC each (8 × 50 GB/s = 400 GB/s): 0.5.
        description="Achieved fraction of a node's aggregate NIC bandwidth in a collective that spans nodes.",
    )
    host_memory_bytes_per_s: float = Field(
        default=100 * GB,
        gt=0.0,
        # A two-socket DDR4-3200 server peaks near 400 GB/s; PyTorch's CPU AdamW (foreach, fp32) reaches
        # about a quarter of it, shared by every rank of the node.
        description="Host memory bandwidth per node available to a host-side optimizer step.",
    )

    @field_validator("matmul_efficiency_by_gpu", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        """A mapping (as a calibration file writes it) becomes sorted (name, efficiency) pairs."""
        return tuple(sorted(value.items())) if isinstance(value, Mapping) else value

    @field_validator("matmul_efficiency_by_gpu")
    @classmethod
    def _fractions(cls, value: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
        bad = {name: eff for name, eff in value if not 0.0 < eff <= 1.0}
        if bad:
            raise ValueError(f"matmul efficiencies must lie in (0, 1]: {bad}")
        return value

    def nic_bytes_per_s(self, gpu_name: str) -> float:
        """One GPU's inter-node NIC bandwidth, one direction (the reference design of its generation)."""
        return NDR_NIC_BYTES_PER_S if gpu_name in NDR_GPUS else self.inter_node_bytes_per_s

    def matmul_efficiency(self, gpu_name: str) -> float:
        """The achieved fraction of `gpu_name`'s BF16 peak in large GEMMs."""
        for name, efficiency in self.matmul_efficiency_by_gpu:
            if name == gpu_name:
                return efficiency
        return self.matmul_efficiency_default


DEFAULT_TIME_COEFFICIENTS = TimeCoefficients()

# Constants set by the host (its CPU and the Python / PyTorch / transformers stack issuing the ops), not by the
# GPU: a calibration measured on one GPU's host applies them to plans for every GPU (planner/calibration.py).
HOST_SIDE_FIELDS: tuple[str, ...] = (
    "train_dispatch_s_per_layer_pass",
    "hf_decode_s_per_layer",
    "hf_decode_s_per_step",
    "cuda_graph_launch_s",
    "eager_launch_s_per_layer",
    "vllm_v0_step_overhead_s",
    "vllm_v0_seq_step_overhead_s",
    "vllm_v1_step_overhead_s",
)
