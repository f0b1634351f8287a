"""FSDP2 over the training ranks, and the few collectives the actor needs beside it.

    ensure_process_group(world_size, device)     world 1: a private one-process group when none exists
    shard(root, model, device=, offload=, train=) fully_shard each decoder layer, then the root
    all_reduce_max(value, device) / all_reduce_sum(values)

The training ranks are the default torch.distributed group of their processes (engine/workers.py
starts it: gloo on CPU, NCCL on GPU). An in-process vLLM engine then joins that group instead of
building its own (vLLM's `external_launcher` executor, engine/rollout/vllm_backend.py), so the two
never clash.

FSDP2 settings (torch >= 2.6 `fully_shard`):
- one unit per decoder layer and one root unit (the actor's `ScoredLogProbs`, which holds the
  embeddings, final norm and LM head) — torchtitan's and verl's wrapping;
- mixed precision on CUDA: bf16 compute, fp32 gradient reduction, fp32 master shards
  (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`, verl's actor default); CPU: fp32;
- `CPUOffloadPolicy` when the plan offloads params or optimizer states: FSDP2 has one policy for both, so
  parameters, gradients and optimizer states all live on the host and the optimizer step runs there
  (pinned memory on CUDA only; engine/notes.py says so when the plan offloads only one of them);
- gradients are summed across ranks, not averaged (divide factor 1, SUM reductions; gloo has no
  PREMUL_SUM): the actor's losses already divide by the whole mini-batch's token/sequence counts;
- each layer prefetches the next one's all-gather in forward (`set_modules_to_forward_prefetch`, FSDP2's
  explicit prefetching): the next layer's unshard — with offload its host-to-device copy of the pinned
  shards — is issued when this layer's starts, so it overlaps this layer's compute instead of waiting for
  the CPU to reach the next pre-forward hook. Backward prefetches one layer by default. At most two
  layers are gathered at a time, as the planner's `gathered_layers` item counts.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_pilot.errors import InputError, RunError


def ensure_process_group(world_size: int, device: torch.device) -> bool:
    """FSDP2 needs a process group even on one rank (offload): make a private one-process group if none exists.

    Returns whether it made one (its owner destroys it when done: `release_process_group`)."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise RunError(
                f"The training group has {dist.get_world_size()} ranks; this actor expects {world_size}.",
                "Start one worker per training rank (engine/workers.py does).",
            )
        return False
    if world_size != 1:
        raise RunError(
            f"No torch.distributed group for {world_size} training ranks.", "Start the workers through grpo-run."
        )
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1
    )
    return True


def release_process_group() -> None:
    """Destroy the default group (one this process made with `ensure_process_group`), if it still exists."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated decoder blocks of a transformers causal LM (`model.model.layers` for Llama/Qwen)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise InputError(
            f"Cannot find the decoder layers of {type(model).__name__} to shard them.",
            "Use a Llama/Qwen-style causal LM (model.model.layers), or run on one worker without offload.",
        )
    return list(layers)


def shard(
    root: torch.nn.Module,
    model: torch.nn.Module,
    *,
    device: torch.device,
    offload: bool,
    train: bool,
    mixed_precision: bool | None = None,
) -> None:
    """`fully_shard` every decoder layer of `model`, then `root` (which contains `model`); in place.

    `mixed_precision` (bf16 compute, fp32 reduce; training only): None = on CUDA devices."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    on_gpu = device.type == "cuda"
    mixed = on_gpu if mixed_precision is None else mixed_precision
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed and train else None
    kwargs: dict[str, Any] = {
        # the actor's device, not the machine's default (a CPU run on a GPU host stays on the CPU)
        "mesh": init_device_mesh(device.type, (dist.get_world_size(),)),
        "offload_policy": CPUOffloadPolicy(pin_memory=on_gpu) if offload else OffloadPolicy(),
    }
    if mp is not None:
        kwargs["mp_policy"] = mp
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(root, **kwargs)
    for current, following in zip(layers, layers[1:]):
        current.set_modules_to_forward_prefetch([following])  # type: ignore[operator]
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def all_reduce_max(value: int, device: torch.device) -> int:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """`values` summed over the ranks, in place on their device (no host read: the caller reads once)."""
    import torch.distributed as dist

    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values
