"""Step-time terms of LoRA / QLoRA training and of verl's activation offload (added to timing.py's passes).

LoRA (`LoraTime`, from Workload.adapter):
- backward FLOPs: a frozen weight needs the gradient of its input only, not its own: the backward of the
  base is one forward's GEMMs instead of two (the 2·P of the 6·P per token); the adapters add 2·r·(in + out)
  per adapted linear in forward and 3× that in backward — small against the base;
- FSDP traffic: the base is all-gathered as before (bf16, forward and backward); only the adapters'
  gradients are reduce-scattered; the Adam step runs over the adapters;
- QLoRA / LLM.int8: every pass (forward, backward, recomputed forward) dequantizes each quantized linear
  (`family_time.dequant_s`: read the packed weights, write them in the compute dtype), once per micro-batch;
- weight sync: verl ships the adapters only (vLLM `enable_lora`): the transfer is r·(in + out) per linear;
  TRL and our engine merge and ship full weights (as a full fine-tune).
Activation offload (verl `enable_activation_offload`): each offloaded layer's saved tensors go to the host in
forward and back in backward, overlapped with the neighbouring layer's compute; only the excess is
exposed (`family_time.activation_offload_time_s`), per micro-batch.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.planner.config import Workload
from grpo_pilot.planner.family_time import activation_offload_time_s, dequant_s
from grpo_pilot.planner.memory.activation_offload import hf_layer_saved_tensor_bytes
from grpo_pilot.planner.memory.lora import adapter_params, frozen_base_bytes, linear_dims
from grpo_pilot.planner.memory.lora_plan import DEFAULT_LORA_RANK, base_bits, lora_targets
from grpo_pilot.planner.memory.shape import shape_of
from grpo_pilot.planner.roofline import TokenCost
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import BF16_BYTES


class LoraTime(NamedTuple):
    adapter_params: int
    adapter_flops_per_token: float  # forward FLOPs of every adapter
    quantized_bytes: int  # the packed quantized linears of the whole model (0: a 16/32-bit base)
    dequantized_bytes: int  # the same linears in the compute dtype


def lora_time_terms(spec: ModelSpec, workload: Workload) -> LoraTime | None:
    """The LoRA numbers the time model needs (None for a full fine-tune)."""
    adapter = workload.adapter
    if adapter is None or adapter.method == "none":
        return None
    shape = shape_of(spec)
    targets = lora_targets(adapter, spec)
    rank = adapter.rank or DEFAULT_LORA_RANK
    n = adapter_params(shape, targets, rank)
    bits = base_bits(adapter, BF16_BYTES)
    linear = shape.num_layers * sum(i * o for i, o in linear_dims(shape).values())
    quantized = 0
    if bits < 16:
        base = frozen_base_bytes(shape, base_bits=bits, unquantized_bytes=BF16_BYTES, double_quant=adapter.double_quant)
        quantized = base.linear_bytes
    return LoraTime(n, 2.0 * n, quantized, BF16_BYTES * linear if quantized else 0)


def lora_training_cost(forward: TokenCost, lora: LoraTime, recompute: bool, logits_bytes: float) -> TokenCost:
    """Forward + a backward without weight gradients for the base (+ recomputed forward), adapters in full."""
    passes = 1 + 1 + (1 if recompute else 0)
    adapters = lora.adapter_flops_per_token * (1 + 2 + (1 if recompute else 0))
    traffic = 1 + 2 + (1 if recompute else 0)
    return TokenCost(
        matmul_flops=forward.matmul_flops * passes + adapters,
        attention_flops=forward.attention_flops * (passes + 1),  # attention's backward is twice its forward
        memory_bytes=forward.memory_bytes * traffic + logits_bytes,
    )


def dequant_micro_s(lora: LoraTime | None, passes: int, hbm_bytes_per_s: float) -> float:
    """Dequantizing every quantized linear in each of a micro-batch's `passes` (forward 1, backward 1, a
    recomputed forward 1): 0 for a 16-bit base."""
    if lora is None or not lora.quantized_bytes:
        return 0.0
    return dequant_s(lora.quantized_bytes, lora.dequantized_bytes, passes, hbm_bytes_per_s)


def activation_offload_micro_s(
    spec: ModelSpec, tokens: float, *, checkpointing: bool, host_bytes_per_s: float, layer_forward_s: float
) -> float:
    """Exposed offload time of one micro-batch of `tokens` per rank (verl activation offload)."""
    c = BF16_BYTES
    per_token = (
        c * spec.hidden_size
        if checkpointing
        else sum(
            hf_layer_saved_tensor_bytes(
                spec.hidden_size,
                spec.q_dim,
                spec.intermediate_size,
                spec.num_attention_heads,
                kv_dim=spec.kv_dim,
                compute_bytes=c,
            )
        )
    )
    t = activation_offload_time_s(
        int(per_token * tokens),
        max(0, spec.num_layers - 1),
        host_bytes_per_s,
        forward_layer_s=layer_forward_s,
        backward_layer_s=2 * layer_forward_s,
    )
    return t.exposed_s
