"""The traced method on one unsharded training rank: the engine's actor with its fp32 weights in place.

One training rank without offload is not sharded by the engine (engine/actor.py: `sharded = world_size > 1
or settings.offload`): the whole fp32 model sits on the device and its forward runs under
`torch.autocast(device, bfloat16)`. Traced here on fake `cpu` tensors (verify/traced.py runs the steps):

- the model is built inside the FakeTensorMode (no meta device, no FSDP2 `to_empty`); the actor's own
  `Module.to` calls (the policy's move, the reference's bf16 copy) run on fake parameters, whose swap
  torch refuses because the fake mode's converter memo holds weak references to them
  (torch/utils/__init__.py `swap_tensors`, torch/_subclasses/fake_tensor.py `FakeTensorConverter`):
  `fake_module_moves` swaps fake tensors' contents directly for the actor's construction only;
- autocast follows CUDA's cast policy (`verify/cuda_autocast.py`), cpu autocast's weight-cast cache
  included;
- `CastLabellingMemTracker` is torch's unsharded `MemTracker` that labels autocast's copies of
  parameters ("Autocast Cast": a `_to_copy` whose input is a parameter) apart from the activations,
  and installs no gradient hooks on a frozen module (the reference model), which torch refuses.

torch is imported inside the functions only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CAST_LABEL = "Autocast Cast"


@contextmanager
def fake_module_moves() -> Iterator[None]:
    """Let `Module.to` / `_apply` replace fake parameters (module docstring); undone on exit."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.utils.swap_tensors

    def swap(t1: Any, t2: Any) -> None:
        if isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor) and type(t1) is type(t2):
            t1.__dict__, t2.__dict__ = t2.__dict__, t1.__dict__
            torch._C._swap_tensor_impl(t1, t2)
            return
        original(t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def cast_labelling_tracker() -> Any:
    """A `MemTracker` whose snapshots carry CAST_LABEL for autocast's parameter casts (module docstring)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _RefType

    members = {m.name: m.value for m in _MemRefType}
    members["CAST"] = CAST_LABEL
    trace_ref = _RefType("_TraceRefType", members)  # same names and values: MemTracker's own keys hit
    copies = (torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout)

    class CastLabellingMemTracker(MemTracker):
        def __init__(self) -> None:
            super().__init__()
            self._ref_class = trace_ref

        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            # a frozen module (the reference) takes no gradient hooks: torch refuses them on such tensors
            frozen = not any(p.requires_grad for p in module.parameters())
            return super()._track_module_params_and_buffers(module, install_grad_hooks and not frozen)

        # Per-module stats are not read here (only the global peaks) and are cleared at every root forward
        # (`reset_module_stats_on_root_forward`); a backward hook of a module whose stats were cleared is skipped.
        def _pre_bw_hook(self, module: Any, args: Any) -> None:
            if module in self.memory_tracking:
                super()._pre_bw_hook(module, args)

        def _post_bw_hook(self, module: Any, args: Any) -> None:
            if module in self.memory_tracking:
                super()._post_bw_hook(module, args)

        def _post_fw_hook(self, module: Any, inputs: Any, outputs: Any) -> None:
            if module in self.memory_tracking:
                super()._post_fw_hook(module, inputs, outputs)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            res = super().__torch_dispatch__(func, types, args, kwargs)
            if func in copies and args and isinstance(args[0], torch.nn.Parameter) and res is not args[0]:
                self._update_and_maybe_create_winfos(res, trace_ref.CAST)
            return res

    return CastLabellingMemTracker()


def build_fake_model(config: Any) -> Any:
    """The HF causal LM of `config` in fp32 with SDPA attention, built in the active fake mode on cpu."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
