"""Bytes per element of each tensor family, by executor (`Target`) and device.

Variants:
- GPU, all targets: compute in bf16 (2 bytes) under mixed precision; actor master params, grads and
  Adam m/v in fp32 (verl `fsdp_workers._build_model_optimizer`: the actor is created in fp32
  "otherwise the optimizer is in bf16"; MixedPrecision(param bf16, reduce fp32)). TRL loads the
  policy in fp32 when `model_init_kwargs` has no dtype (GRPOTrainer docstring, trl 1.16) and trains
  under bf16 autocast (`GRPOConfig.bf16` defaults to True). Our engine: fp32 master + bf16 autocast.
- Reference model: our engine keeps it in bf16; verl creates non-actor roles in bf16 unless
  `fsdp_config.model_dtype` says otherwise (`torch.float32 if self._is_actor else torch.bfloat16`);
  TRL builds the reference with the policy's dtype (`model_init_kwargs.setdefault("dtype",
  self.model.dtype)`), i.e. fp32 by default.
- The rollout engine's weights (vLLM) are bf16 on GPU.
- cpu pseudo-device (our engine, `1xcpu`): everything fp32 — no bf16 copies at all.
"""

from __future__ import annotations

from typing import NamedTuple

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
    is_cpu: bool


_REF_BYTES_GPU = {"grpo-pilot": BF16_BYTES, "verl": BF16_BYTES, "trl": FP32_BYTES}


def precision_for(target: str, is_cpu: bool) -> Precision:
    """Element sizes for one executor on GPU (mixed precision) or on the cpu pseudo-device (fp32)."""
    if is_cpu:
        return Precision(FP32_BYTES, FP32_BYTES, FP32_BYTES, ADAM_STATE_BYTES, FP32_BYTES, FP32_BYTES, True)
    return Precision(BF16_BYTES, FP32_BYTES, FP32_BYTES, ADAM_STATE_BYTES, _REF_BYTES_GPU[target], BF16_BYTES, False)
