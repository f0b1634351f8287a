"""Bytes per element of each tensor family, by executor (`Target`) and device.

Variants:
- GPU, all targets: compute in bf16 (2 bytes) under mixed precision; actor master params, grads and
  Adam m/v in fp32 (verl `fsdp_workers._build_model_optimizer`: the actor is created in fp32
  "otherwise the optimizer is in bf16"; MixedPrecision(param bf16, reduce fp32)). TRL loads the
  policy in fp32 when `model_init_kwargs` has no dtype (GRPOTrainer docstring, trl 1.16) and trains
  under bf16 autocast (`GRPOConfig.bf16` defaults to True). Our engine: fp32 master + bf16 autocast.
- Reference model: `ExecutorTraits.ref_bytes` (bf16 for our engine and verl, fp32 for TRL).
- The rollout engine's weights (vLLM) are bf16 on GPU.
- cpu pseudo-device (our engine, `1xcpu`): everything fp32 — no bf16 copies at all.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.hardware.device_traits import DeviceTraits
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.units import BF16_BYTES, FP32_BYTES

ADAM_STATE_BYTES = 2 * FP32_BYTES  # exp_avg + exp_avg_sq in fp32 (torch.optim.AdamW on fp32 params)


class Precision(NamedTuple):
    """Bytes per element; a plain tuple so the search's inner loop stays allocation-light."""

    compute_bytes: int  # activations, gathered layers, logits dtype
    master_bytes: int  # actor parameters as stored (FSDP shard)
    grad_bytes: int  # actor gradients (FSDP reduce dtype)
    adam_bytes: int  # both Adam moments together
    ref_bytes: int  # reference-model parameters
    rollout_bytes: int  # rollout-engine (vLLM) weights and KV cache


def precision_for(executor: ExecutorTraits, device: DeviceTraits) -> Precision:
    """Element sizes for one executor on a GPU (mixed precision; the reference's dtype is the executor's
    `ref_bytes`) or on the cpu pseudo-device (fp32 everywhere)."""
    if not device.mixed_precision:
        return Precision(FP32_BYTES, FP32_BYTES, FP32_BYTES, ADAM_STATE_BYTES, FP32_BYTES, FP32_BYTES)
    return Precision(BF16_BYTES, FP32_BYTES, FP32_BYTES, ADAM_STATE_BYTES, executor.ref_bytes, BF16_BYTES)


def rollout_element_bytes(device: DeviceTraits) -> int:
    """Bytes per element of the rollout engine's weights and KV cache (bf16 on a GPU, fp32 on cpu)."""
    return BF16_BYTES if device.mixed_precision else FP32_BYTES
