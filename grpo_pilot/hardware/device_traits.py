"""`DeviceTraits`: what differs between a GPU and the `cpu` pseudo-device, asked in one place.

The estimators, the search and the renderers ask these questions instead of testing `gpu.is_cpu`
themselves (DESIGN.md "One home per fact"):

- mixed_precision: a GPU computes in bf16 over fp32 master weights (verl, TRL, our engine); the cpu
  pseudo-device keeps everything in fp32 (our engine on CPU builds no bf16 copy).
- offload_meaningful: moving a state to host RAM frees device memory. On the cpu pseudo-device host
  RAM *is* device memory, so offload knobs move nothing there.
- cuda_graphs: vLLM captures CUDA graphs (none on CPU, where vLLM-CPU runs eagerly).
- caching_allocator: the device allocates through PyTorch's CUDA caching allocator, so what the device
  holds (reserved segments, CUDA context, cuBLAS workspace, NCCL) exceeds the live tensors; on CPU the
  process RSS is what counts.
- host_executes_ops: the thread that dispatches ops also runs them (CPU), so dispatch and compute add;
  a GPU runs queued kernels while the host dispatches the next (CUDA semantics: asynchronous execution).
- unit: what one "device" is called in tables and plots ('GPU' or 'process').
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.hardware.gpus import GPUSpec


class DeviceTraits(NamedTuple):
    kind: str  # the torch device type: "cuda" (NVIDIA, and AMD under ROCm) or "cpu"
    mixed_precision: bool
    offload_meaningful: bool
    cuda_graphs: bool
    caching_allocator: bool
    host_executes_ops: bool
    unit: str


GPU_TRAITS = DeviceTraits(
    kind="cuda",
    mixed_precision=True,
    offload_meaningful=True,
    cuda_graphs=True,
    caching_allocator=True,
    host_executes_ops=False,
    unit="GPU",
)
CPU_TRAITS = DeviceTraits(
    kind="cpu",
    mixed_precision=False,
    offload_meaningful=False,
    cuda_graphs=False,
    caching_allocator=False,
    host_executes_ops=True,
    unit="process",
)


def device_traits(gpu: GPUSpec) -> DeviceTraits:
    """The traits of one accelerator model (the only place `GPUSpec.is_cpu` is read)."""
    return CPU_TRAITS if gpu.is_cpu else GPU_TRAITS
