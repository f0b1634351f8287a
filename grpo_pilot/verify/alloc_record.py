"""Record the allocation sequence of code running on torch tensors, for the allocator replay
(`verify/allocator_sim.py`).

`AllocationLog` collects events in program order: ("a", id, nbytes) when a tensor storage first appears,
("f", id) when it is freed (the storage's weak reference dies: CPython frees it at the same point of the
program as a CUDA run returns its block to the caching allocator), plus the markers the caller adds —
("p", phase) where the engine's profiler starts a phase, ("e",) where it empties the CUDA cache.

`recording(log)` is a TorchDispatchMode: every tensor an aten op returns is noted (a view or an in-place
result shares a noted storage and adds nothing). It works on real tensors and on fake ones (the traced
method: full-size models under FakeTensorMode on the cpu device, `verify/traced.py`), so the engine's own
step yields the sequence a GPU run would hand the allocator. `note_module(log, module)` notes what exists
before recording starts, in the order `Module.to(device)` allocates it (children first, then the
module's own parameters, then its buffers: torch/nn/modules/module.py `_apply`).

`cublas_workspace_bytes`: cuBLAS draws its workspace from the caching allocator once per (handle, stream)
and keeps it (aten/src/ATen/cuda/CublasHandlePool.cpp; handles are per thread, so the forward thread and
autograd's device thread hold one each: notes/mechanisms.md §5.5). With it set, the first matrix product
outside backward and the first inside backward each add one such never-freed allocation. On a CPU run
there is no cuBLAS, so the replay adds what a CUDA process would hold.

torch is imported inside the functions only.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# the matrix products that take a cuBLAS handle (forward and their backward: mm / bmm / addmm)
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_scaled_dot_product_flash_attention")


class AllocationLog:
    """Allocation events in program order (module docstring)."""

    def __init__(self, cublas_workspace_bytes: int = 0) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self.events: list[tuple] = []
        self.cublas_workspace_bytes = cublas_workspace_bytes
        self._ids: Any = WeakIdKeyDictionary()
        self._refs: dict[int, weakref.ref] = {}
        self._next = 0
        self._workspaces: set[bool] = set()

    def _new_id(self) -> int:
        self._next += 1
        return self._next

    def note(self, tensor: Any) -> None:
        """Record `tensor`'s storage unless already recorded (zero-byte storages take no block)."""
        storage = tensor.untyped_storage()
        if storage in self._ids:
            return
        nbytes = int(storage.nbytes())
        if nbytes == 0:
            return
        ident = self._new_id()
        self._ids[storage] = ident

        def freed(_: Any, ident: int = ident) -> None:
            self.events.append(("f", ident))
            self._refs.pop(ident, None)

        self._refs[ident] = weakref.ref(storage, freed)
        self.events.append(("a", ident, nbytes))

    def workspace(self, in_backward: bool) -> None:
        """One cuBLAS workspace for the forward or the backward thread, the first time it is needed."""
        if self.cublas_workspace_bytes and in_backward not in self._workspaces:
            self._workspaces.add(in_backward)
            self.events.append(("a", self._new_id(), self.cublas_workspace_bytes))

    def phase(self, name: str) -> None:
        self.events.append(("p", name))

    def empty_cache(self) -> None:
        self.events.append(("e",))

    def live_bytes(self) -> int:
        """Bytes of the storages noted and not yet freed (unrounded)."""
        live: dict[int, int] = {}
        for event in self.events:
            if event[0] == "a":
                live[event[1]] = event[2]
            elif event[0] == "f":
                live.pop(event[1], None)
        return sum(live.values())


def module_tensors(module: Any) -> Iterator[Any]:
    """`module`'s parameters and buffers in the order `Module._apply` moves them (module docstring)."""
    for child in module.children():
        yield from module_tensors(child)
    for p in module._parameters.values():
        if p is not None:
            yield p
    for b in module._buffers.values():
        if b is not None:
            yield b


def note_module(log: AllocationLog, module: Any) -> None:
    for t in module_tensors(module):
        log.note(t)


@contextmanager
def recording(log: AllocationLog) -> Iterator[None]:
    """Note every tensor aten ops return while the block runs (module docstring)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    matmuls = {getattr(torch.ops.aten, name) for name in MATMUL_OPS if hasattr(torch.ops.aten, name)}

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.overloadpacket in matmuls:
                log.workspace(torch._C._current_autograd_node() is not None)
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    log.note(t)
            return out

    with _Recorder():
        yield
