"""The launch families' items in the FSDP phases (estimate.py steps 2–4), and the critic's own phases.

- resident: LoRA's frozen base shard follows the actor's parameters (on the GPU when they are; verl's
  param_offload moves the whole FSDP module, frozen base included); the critic's (and a reward model's)
  shards sit on every training GPU during the actor's phases unless offloaded (memory/critic_plan.py).
- LoRA transients (`lora_transients`): a quantized linear dequantized to the compute dtype, one at a time in
  every pass.
- LoRA in the update: no root (embedding / lm_head) gradients, a layer's reduce-scatter carries its adapters
  only, the frozen head keeps no inputs (`lora_head_savings_bytes`), a fused log-prob kernel accumulates no
  lm_head weight gradient (verl fused: c·V·h, ours and TRL's: 4·V·h in memory/logits.py).
- LoRA weight sync: with adapters shipped (verl) the adapter collection replaces the full-weight walk
  (memory/lora_rollout.py `lora_sync_bytes`).
- the critic's phases: `values` (compute_values) and `critic_update` (update_critic), each beside what the
  actor keeps resident in that phase and what the rollout engine left behind.
- host RAM: the critic's offloaded shards and GAE's driver tensors; activation offload's pinned buffers of
  every training rank on the node; vLLM's weight backup on the host under sleep level 1 (verl uses level 1
  with `layered_summon`: workers/rollout/vllm_rollout/vllm_rollout.py L91–L95).
"""

from __future__ import annotations

from typing import Callable

from grpo_pilot.planner.memory.activation_offload import host_bytes_per_node
from grpo_pilot.planner.memory.context import MemoryContext
from grpo_pilot.planner.memory.critic_plan import (
    critic_host_items,
    critic_resident_items,
    critic_update_work,
    critic_values_work,
)
from grpo_pilot.units import FP32_BYTES

Finish = Callable[[MemoryContext, dict[str, int], dict[str, int], dict[str, int]], dict[str, int]]
Resident = Callable[[MemoryContext, str], dict[str, int]]


def family_resident(ctx: MemoryContext, phase: str, params_on: bool) -> dict[str, int]:
    """LoRA's frozen base (with the actor's parameters) and the critic's shards during `phase`."""
    items: dict[str, int] = {}
    if ctx.lora is not None:
        items["frozen_base"] = ctx.frozen_base_bytes if params_on else 0
    items.update(critic_resident_items(ctx.critic, phase))
    return items


def lora_transients(ctx: MemoryContext) -> dict[str, int]:
    """The dequantized linear, one at a time in every QLoRA pass (module docstring)."""
    if ctx.lora is None:
        return {}
    return {"lora_transients": ctx.lora.dequant_bytes}


def lora_logits_savings(ctx: MemoryContext, *, training: bool) -> int:
    """The lm_head weight-gradient accumulator a fused log-prob kernel does not build for a frozen head."""
    if ctx.lora is None or not training:
        return 0
    m, kernel = ctx.model, ctx.executor.logits_kernel
    if kernel == "trl" or (ctx.knobs.fused_logprob and kernel == "ours"):
        return FP32_BYTES * m.vocab_size * m.hidden_size
    if ctx.knobs.fused_logprob and kernel == "verl":
        return ctx.precision.compute_bytes * m.vocab_size * m.hidden_size
    return 0


def lora_head_savings(ctx: MemoryContext, tokens: int) -> int:
    """Saved head-side activations a frozen final norm and lm_head do without (0 for a full fine-tune)."""
    return ctx.lora.head_savings_per_token * tokens if ctx.lora is not None else 0


def lora_layer_grad_params(ctx: MemoryContext) -> int:
    """Parameters of one layer whose gradients are reduce-scattered: the adapters under LoRA."""
    return ctx.lora.adapter_params_per_layer if ctx.lora is not None else ctx.model.params_per_layer


def lora_sync_items(ctx: MemoryContext) -> dict[str, int] | None:
    """The weight sync's transfer items when only adapters ship (None: the full-weight walk applies)."""
    if ctx.lora is None or not ctx.lora.adapters_only_sync:
        return None
    return {"lora_sync_gathered": ctx.lora.sync_gathered_bytes}


def critic_phases(ctx: MemoryContext, finish: Finish, resident: Resident) -> dict[str, dict[str, int]]:
    """Items of `values` and `critic_update` (empty without a critic)."""
    if ctx.critic is None:
        return {}
    return {
        "values": finish(
            ctx,
            {**resident(ctx, "values"), **critic_values_work(ctx.critic)},
            ctx.rollout_leftovers,
            ctx.trainer_overheads,
        ),
        "critic_update": finish(
            ctx,
            {**resident(ctx, "critic_update"), **critic_update_work(ctx.critic)},
            ctx.rollout_leftovers,
            ctx.trainer_overheads,
        ),
    }


def family_host_items(ctx: MemoryContext) -> dict[str, int]:
    """Host RAM items of one node the launch families add (module docstring)."""
    ranks = ctx.layout.trainer_gpus_per_node
    items = critic_host_items(ctx.critic, ctx.workload, ranks)
    if ctx.activation_offload is not None:
        items["activations_offloaded_pinned"] = host_bytes_per_node(ctx.activation_offload, ranks)
    if ctx.lora is not None and ctx.lora.adapters_only_sync and ctx.vllm is not None:
        sleep_one = ctx.knobs.layered_summon  # vLLM sleep level 1 keeps a host copy of its weights
        backup = ctx.vllm.weights_bytes * ctx.layout.rollout_gpus_per_node if sleep_one else 0
        items["rollout_weights_backup"] = backup
        items["lora_sync_staging"] = ranks * ctx.lora.sync_host_bytes
    return items
