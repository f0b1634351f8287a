"""`Overheads`: the named, calibratable constants of the memory model that are not tensor shapes.

Every field is a starting value with its source next to it (reference/memory-model.md §3–4 gives
the public ranges). Calibration (grpo-tune, measured runs) produces a new `Overheads` with measured
values; the estimator never hard-codes any of these numbers itself.

Where a range is known we pick one documented value and say why; all byte values are integers.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from grpo_pilot.models import Frozen
from grpo_pilot.units import GiB, MiB


class Overheads(Frozen):
    """Non-tensor and engine-internal memory constants (per GPU unless the name says otherwise)."""

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: Any) -> Any:
        """Calibration files written before planner/memory/allocator.py modelled the caching allocator's reserve
        carry a `fragmentation_factor`; it is no longer a constant of the model, so it is dropped on load."""
        if isinstance(data, dict) and "fragmentation_factor" in data:
            data = {k: v for k, v in data.items() if k != "fragmentation_factor"}
        return data

    # --- CUDA process baseline -------------------------------------------------------------------
    cuda_context_bytes: int = Field(
        default=512 * MiB,
        ge=0,
        # CUDA context with lazy module loading is 0.3–0.6 GB (memory-model.md §4); we take the
        # upper half because the trainer also loads cuDNN/flash-attn kernels into the same context.
        description="CUDA context of one process on one GPU (driver, kernels loaded lazily).",
    )
    cublas_workspace_bytes: int = Field(
        default=32 * MiB,
        ge=0,
        # cuBLAS workspace is 8–32 MiB per stream (memory-model.md §4); 32 MiB is the Hopper default
        # size of CUBLAS_WORKSPACE_CONFIG, the larger of the documented values.
        description="cuBLAS workspace of the compute stream.",
    )
    nccl_bytes_per_communicator: int = Field(
        default=512 * MiB,
        ge=0,
        # NCCL is 0.5–1.6 GB per communicator (memory-model.md §4). The top of the range comes from
        # NVLS / many-channel multi-node setups; a single 8-GPU node with default NCCL_BUFFSIZE sits
        # at the bottom, so we start there and let calibration raise it.
        description="Buffers of one NCCL communicator the trainer creates (FSDP group, Ulysses group).",
    )
    # --- vLLM engine (inside its gpu_memory_utilization budget) -----------------------------------
    vllm_non_torch_base_bytes: int = Field(
        default=int(0.15 * GiB),
        ge=0,
        # vLLM non-torch memory (NCCL, cuBLAS/attention workspaces) logged 0.15–1.3 GiB, growing
        # with TP (memory-model.md §3): 0.15 GiB is the TP=1 end of that range.
        description="vLLM non-torch buffers at tensor-parallel size 1.",
    )
    vllm_non_torch_per_extra_tp_rank_bytes: int = Field(
        default=int(0.16 * GiB),
        ge=0,
        # Linear fit through the two ends of the logged range: 0.15 GiB at TP=1, ~1.27 GiB at TP=8
        # (0.15 + 7 × 0.16), the 1.3 GiB top of memory-model.md §3.
        description="Extra vLLM non-torch bytes per additional tensor-parallel rank (custom all-reduce, NCCL).",
    )
    vllm_sampler_bytes_per_vocab_entry: int = Field(
        default=20,
        ge=0,
        # vLLM's profile run samples one dummy token for min(max_num_seqs, max_num_batched_tokens)
        # requests with top-p/top-k on (gpu_model_runner._dummy_sampler_run): fp32 logits (4) +
        # fp32 sorted values (4) + int64 sort indices (8) + fp32 probabilities (4) = 20 bytes per
        # vocab entry per request. 1024 requests × 152064 × 20 = 2.9 GiB, the top of the 0.25–3 GiB
        # activation peaks logged for 7–8B models (memory-model.md §3).
        description="Bytes per request per vocabulary entry in vLLM's sampler profile run.",
    )
    vllm_v0_sampler_bytes_per_vocab_entry: int = Field(
        default=32,
        ge=0,
        # vLLM's V0 engine profiles max_num_seqs prompts sampled with top_p=0.99, top_k=V-1
        # (vllm/worker/model_runner.py `_dummy_run`, v0.8.3); its peak is inside
        # model_executor/layers/sampler.py `_apply_top_k_top_p` (v0.8.3), where these [seqs, V] tensors are
        # alive at once: the bf16 logits the model runner holds (2), their fp32 copy (4), the sorted values
        # (4) and int64 indices (8), the top-k mask (bool, 1), the sorted softmax (4), its cumsum (4), the
        # top-p mask (1) and the re-scattered fp32 logits (4) = 32 bytes per vocab entry per sequence. vLLM 0.6.3
        # (the wheel's sources, under verl's vendored worker too: its ModelRunner overrides only load_model) has the
        # same `_dummy_run` prompts, fp32 cast and `_apply_top_k_top_p`, FlashInfer's sampler off by default.
        description="Bytes per sequence per vocabulary entry in the sampler profile run of vLLM's V0 engine.",
    )
    vllm_cuda_graph_bytes_per_graph: int = Field(
        default=4 * MiB,
        ge=0,
        # vLLM reserves at least 1 MiB per captured graph (gpu_model_runner.profile_cudagraph_memory,
        # "at least 1 MiB per graph for driver overhead"); startup logs of 1–8B models report
        # 0.3–0.6 GiB for ~100 graphs (FULL_AND_PIECEWISE, 51 sizes each), i.e. ~3–6 MiB per graph:
        # we take 4 MiB and add the largest capture's activations separately.
        description="Per captured CUDA graph: private pool blocks and driver state.",
    )
    vllm_cuda_graph_modes: int = Field(
        default=2,
        ge=1,
        # vLLM ≥ 0.11 defaults to cudagraph_mode FULL_AND_PIECEWISE: every capture size is captured
        # once as a full decode graph and once piecewise (vllm/config/compilation.py).
        description="Graph sets captured per capture size (FULL_AND_PIECEWISE = 2).",
    )

    # --- weight sync ------------------------------------------------------------------------------
    weight_sync_bucket_bytes: int = Field(
        default=2 * GiB,
        ge=0,
        # verl sends trainer weights to vLLM in buckets of 2 GiB (memory-model.md §3, "transfer
        # bucket (verl: 2 GiB)"); our engine imports this constant for its own bucket.
        description="Transfer bucket used to move trainer weights into the rollout engine.",
    )

    # --- host RAM ---------------------------------------------------------------------------------
    host_rss_bytes_per_gpu_process: int = Field(
        default=3 * GiB,
        ge=0,
        # A CUDA PyTorch process maps the CUDA 12 user-space libraries (cuBLAS, cuDNN, NCCL: ~2 GB)
        # plus Python, transformers and Ray worker state; 3 GiB is our starting value per GPU
        # process, to be replaced by the measured RSS of a run (engine profiles host RSS).
        description="Host RSS of one trainer / rollout process driving one GPU (libraries, Python).",
    )
    cpu_process_rss_bytes: int = Field(
        default=256 * MiB,
        ge=0,
        # Measured on the CPU dev box: `import torch, transformers` + grpo_pilot.engine.model_factory
        # peaks at 246,428 KiB max RSS (torch 2.13 CPU, transformers 5.19); rounded up to 256 MiB.
        description="Baseline RSS of our engine process on the cpu pseudo-device (counted in every phase).",
    )


DEFAULT_OVERHEADS = Overheads()
