"""AdamW step temporaries.

- GPU: torch.optim.AdamW defaults to the `foreach` implementation when every parameter is a CUDA
  tensor (torch/optim/optimizer.py `_default_to_fused_or_foreach`); its intermediate tensor lists
  are the size of the parameter shard: about 4 bytes per parameter (fp32), memory-model.md §2.
  `fused=True` needs ~0.
- cpu: the default is the single-tensor loop (foreach only defaults on for CUDA), so only one
  parameter's intermediate (the `denom` of the largest tensor, fp32) is live at a time.
- fused (`fused=True`; our engine on cpu, target grpo-pilot): torch.optim.AdamW dispatches to
  `torch._fused_adamw_` (torch/optim/adam.py `_fused_adam`), one in-place elementwise kernel per
  parameter group (aten/src/ATen/native/cpu/FusedAdamKernel.cpp on cpu) that updates param, exp_avg
  and exp_avg_sq element by element: no intermediate tensors, 0 bytes.
- optimizer offloaded to the host (our engine, TRL): the step runs there — 0 on the GPU.
The step runs after backward, when activations and logits are gone: it is its own peak moment
(memory/moments.py).
"""

from __future__ import annotations

from grpo_pilot.units import FP32_BYTES

FOREACH_ADAMW_BYTES_PER_PARAM = 4
FP32 = FP32_BYTES


def adam_step_temporary_bytes(
    shard_params: int, largest_param_elements: int, *, on_host: bool, single_tensor: bool, fused: bool = False
) -> int:
    """Transient bytes of one AdamW step over a rank's shard on the device: none when the step runs on the
    host (`on_host`) or fused; one tensor's intermediate in the single-tensor loop (`single_tensor`: the
    cpu default); else the foreach lists over the shard (see above)."""
    if on_host or fused:
        return 0
    if single_tensor:
        return FP32 * largest_param_elements
    return FOREACH_ADAMW_BYTES_PER_PARAM * shard_params
