"""Host values onto the device without making the host wait for the device.

    to_device(values, dtype=, device=) -> Tensor     a list (or CPU tensor) as a tensor on `device`

`torch.tensor(values, device="cuda")` or `cpu_tensor.to("cuda")` copies from pageable memory with
`non_blocking=False`, and PyTorch then synchronises the stream after the copy: the host waits until every
kernel queued before it has finished, so the GPU drains between micro-batches (PyTorch tutorial "A guide on
good usage of non_blocking and pin_memory() in PyTorch", pytorch.org/tutorials/intermediate/
pinmem_nonblock.html: a host-to-device copy is synchronous unless the source is pinned and non_blocking
is set). On CUDA the values are staged in page-locked memory (PyTorch's caching host allocator, so
repeated small copies reuse their blocks) and copied with `non_blocking=True`: the copy is queued behind
the kernels already launched and the host goes on. Elsewhere (the CPU) a plain tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def to_device(values: Sequence[Any] | Tensor, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """`values` as a `dtype` tensor on `device` (module docstring)."""
    if isinstance(values, Tensor) and values.device.type != "cpu":
        return values.to(device=device, dtype=dtype)
    host = values.to(dtype) if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
