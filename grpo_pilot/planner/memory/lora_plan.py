"""LoRA / QLoRA on the FSDP path: the leaves of memory/lora.py and memory/lora_rollout.py, combined once per
estimate into the numbers the phase estimators read (`LoraPlan`).

What changes against a full fine-tune (docs/families.md §2; each leaf cites its sources):
- states: the frozen base at its storage width (`ExecutorTraits` element sizes: verl's fp32 actor, TRL's
  load dtype, fp32 in our engine; bitsandbytes 8/4-bit linears with their quantization constants), sharded
  over the FSDP ranks like any parameter; params, grads and Adam moments only for the adapters, in fp32 — or
  over a quantized base in the executor's `quantized_adapter_bytes` (TRL: bf16);
- reference: none (verl `ref_in_actor`, TRL `ref_model = None`): the actor runs with its adapters disabled;
- activations: the full fine-tune's per layer and token plus `lora_activation_delta` (A's outputs, dropout
  masks, minus what frozen weights need not save), minus the frozen head's saved inputs;
- gradients: no root (embedding / lm_head) gradients and no lm_head weight-gradient accumulator in a fused
  log-prob kernel; a layer's reduce-scatter carries only its adapters;
- autocast (one unsharded rank over fp32 weights): only trainable leaves are cached (aten autocast
  `cached_cast` requires requires_grad), so the cache holds the adapters; the frozen LM head's cast is made
  at the logits as a full fine-tune's (memory/family_parts.py `actor_states`);
- quantized linears are dequantized one at a time in every pass (`dequant_transient_bytes`);
- rollout: with `lora_rollout == "adapters"` (verl) vLLM holds LoRA slots for every supported linear inside
  its budget and the sync gathers the adapters (FSDP1 whole model without `layered_summon`, one layer with
  it); with "merged" (TRL, our engine) vLLM runs a plain model and receives merged full weights.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.planner.adapters import AdapterSettings
from grpo_pilot.planner.memory.lora import (
    adapter_params,
    adapter_params_per_layer,
    adapter_state_bytes,
    dequant_transient_bytes,
    frozen_base_bytes,
    lora_activation_delta,
    lora_head_savings_bytes,
    resolve_targets,
)
from grpo_pilot.planner.memory.lora_rollout import lora_sync_bytes, vllm_lora_slot_bytes
from grpo_pilot.planner.memory.precision import Precision
from grpo_pilot.planner.memory.shape import TransformerShape, shape_of
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import FP32_BYTES

DEFAULT_LORA_RANK = 8  # peft LoraConfig(r=8) when a launch names adapters but no rank


class LoraPlan(NamedTuple):
    """One rank's LoRA numbers (module docstring)."""

    adapter_params: int  # all adapter parameters of the model
    adapter_params_per_layer: int
    frozen_base_bytes: int  # one rank's shard of the frozen base at its storage width
    adapter_param_bytes: int  # one rank's shard of the adapters
    adapter_grad_bytes: int
    adapter_adam_bytes: int
    adapter_bytes: int  # bytes per adapter element
    activation_delta_per_layer_token: int  # signed: + adapters / dropout, − frozen savings
    head_savings_per_token: int
    quantized: bool
    dequant_bytes: int  # the largest dequantized linear (and int8 input copies) at the micro-batch
    rollout_slot_bytes: int  # vLLM's LoRA A/B slots on one rollout GPU (0: merged weights)
    sync_gathered_bytes: int  # GPU transient of the adapter sync (0: merged weights)
    sync_host_bytes: int
    adapters_only_sync: bool  # the rollout engine receives adapters, not full weights


def base_bits(adapter: AdapterSettings, storage_bytes: int) -> int:
    """Bits per frozen linear weight: 4 or 8 with a bitsandbytes base, else the storage width."""
    if adapter.base_quantization == "4bit":
        return 4
    if adapter.base_quantization == "8bit":
        return 8
    return 8 * storage_bytes


def lora_targets(adapter: AdapterSettings, spec: ModelSpec) -> tuple[str, ...]:
    names = adapter.target_modules
    if not names:
        return resolve_targets("default", spec.model_type)
    if len(names) == 1:
        return resolve_targets(names[0], spec.model_type)
    return resolve_targets(tuple(names), spec.model_type)


def lora_plan(
    spec: ModelSpec,
    adapter: AdapterSettings,
    *,
    executor: ExecutorTraits,
    precision: Precision,
    shard_degree: int,
    tokens: int,
    rollout_tp: int,
    layered_summon: bool,
) -> LoraPlan:
    """The LoRA numbers of one training rank (module docstring). `tokens`: the update micro-batch per rank."""
    shape: TransformerShape = shape_of(spec)
    targets = lora_targets(adapter, spec)
    rank = adapter.rank or DEFAULT_LORA_RANK
    n_adapter = adapter_params(shape, targets, rank)
    bits = base_bits(adapter, precision.frozen_bytes)
    quantized = bits < 16
    storage = precision.frozen_bytes  # the base as loaded (TRL: its load dtype, memory/precision.py)
    base = frozen_base_bytes(
        shape,
        base_bits=bits if quantized else 8 * storage,
        unquantized_bytes=storage,
        double_quant=adapter.double_quant,
        shard_degree=shard_degree,
    )
    adapter_bytes = executor.quantized_adapter_bytes if quantized else FP32_BYTES
    if precision.compute_bytes == FP32_BYTES:  # the cpu pseudo-device: fp32 throughout
        adapter_bytes = FP32_BYTES
    states = adapter_state_bytes(n_adapter, adapter_bytes, shard_degree)
    c = precision.compute_bytes
    delta = lora_activation_delta(shape, targets, rank, c, dropout=bool(adapter.dropout), on_cpu=c == FP32_BYTES)
    largest_frozen = max(shape.embedding_params, shape.output_layer_params)
    adapters_only = executor.lora_rollout == "adapters"
    slots = vllm_lora_slot_bytes(shape, rank, rollout_tp, head_dim=spec.head_dim) if adapters_only else 0
    sync = lora_sync_bytes(
        model_params=spec.num_params + n_adapter,
        layer_params=spec.params_per_layer + adapter_params_per_layer(shape, targets, rank),
        largest_param_elements=largest_frozen,
        num_adapter_params=n_adapter,
        largest_adapter_elements=max(shape.hidden, shape.ffn) * rank,
        storage_bytes=storage,
        fsdp_version=1,
        layered_summon=layered_summon,
        base_sync_done=True,
        resend_base=False,
    )
    return LoraPlan(
        adapter_params=n_adapter,
        adapter_params_per_layer=adapter_params_per_layer(shape, targets, rank),
        frozen_base_bytes=base.total_bytes,
        adapter_param_bytes=states.params_bytes,
        adapter_grad_bytes=states.grads_bytes,
        adapter_adam_bytes=states.adam_bytes,
        adapter_bytes=adapter_bytes,
        activation_delta_per_layer_token=delta.net_bytes,
        head_savings_per_token=lora_head_savings_bytes(1, shape.hidden, c),
        quantized=quantized,
        dequant_bytes=dequant_transient_bytes(shape, bits, c, tokens) if quantized else 0,
        rollout_slot_bytes=slots,
        # one FSDP rank holds its parameters whole: summoning them allocates nothing
        sync_gathered_bytes=sync.gathered_bytes if adapters_only and shard_degree > 1 else 0,
        sync_host_bytes=sync.host_bytes if adapters_only else 0,
        adapters_only_sync=adapters_only,
    )
