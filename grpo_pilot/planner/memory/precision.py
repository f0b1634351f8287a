"""Bytes per element of each tensor family, by executor (`Target`), device and — for TRL — the dtype the model
is loaded in (`Knobs.model_dtype`) and the launcher (`Knobs.state_sharding`).

Variants:
- GPU, our engine and verl: compute in bf16 (2 bytes) under mixed precision; actor master params, grads and
  Adam m/v in fp32 (verl `fsdp_workers._build_model_optimizer`: the actor is created in fp32 "otherwise the
  optimizer is in bf16"; MixedPrecision(param bf16, reduce fp32)). Our engine: fp32 master + bf16 autocast.
  Neither has a `model_dtype` setting (`ExecutorTraits.missing_knobs`): it stays "fp32".
- GPU, TRL: the policy and the reference are loaded with the same `model_init_kwargs` (trl 1.16
  grpo_trainer.py L1001 `model_init_kwargs.setdefault("dtype", self.model.dtype)`), in fp32 unless the launch sets
  a dtype (planner/from_trl.py reads it), and train under bf16 autocast (`GRPOConfig.bf16` True since trl 0.19).
  What each launcher then holds (`trl_precision`):
  * DDP / one process (`ddp`): nothing upcasts a 16-bit model — transformers' Trainer and accelerate's
    MULTI_GPU `prepare_model` wrap it as loaded — so parameters, gradients (`param.grad` has the parameter's dtype)
    and the reducer's buckets take the load dtype, and torch AdamW's moments too (torch 2.13
    torch/optim/adam.py L178-L184 `_init_group`: `torch.zeros_like(p)` for exp_avg and exp_avg_sq). bf16-loaded:
    2 + 2 + 2·2 bytes per parameter; fp32-loaded: 4 + 4 + 2·4 under autocast.
  * FSDP (`full`, accelerate's FSDP plugin): with mixed precision on, accelerate upcasts every trainable low-
    precision parameter to fp32 before sharding, "following DeepSpeed's strategy" (accelerate/accelerator.py
    `prepare_model`, FSDP1, since v0.30.0 @eeed902803; utils/fsdp_utils.py `fsdp2_prepare_model`, FSDP2, since
    v1.6.0 @12d38f0f5b; v1.14.0 @09228237b9 L709-L714 upcasts `requires_grad` parameters only): fp32 master,
    gradients and Adam whatever the load dtype. The reference is wrapped by TRL's `prepare_fsdp` (trl 1.16
    trl/models/utils.py L292-L342: `FSDP(...)` / `fully_shard` directly, no upcast), so it keeps the load dtype,
    as do frozen (LoRA base) weights.
  * DeepSpeed ZeRO-3 (also `full`): transformers loads both models inside `deepspeed.zero.Init`, which partitions
    them in bf16 when the config enables bf16 (deepspeedai/DeepSpeed@edaa7221 deepspeed/runtime/zero/
    partition_parameters.py L391-L401 `Init._set_dtype`), whatever the load dtype; the optimizer keeps fp32
    partitions. planner/from_trl.py plans a ZeRO-3 launch with `model_dtype="bf16"`, so the reference is bf16.
  * DeepSpeed ZeRO-1/2 (`zero1` / `zero2`): the engine casts the module to bf16 and keeps fp32 master and Adam
    partitions whatever the load dtype (memory/zero.py); the reference gets a stage-0 bf16 engine.
- Reference model elsewhere: `ExecutorTraits.ref_bytes` (bf16 for our engine and verl).
- The rollout engine's weights (vLLM) are bf16 on GPU.
- cpu pseudo-device (our engine, `1xcpu`): everything fp32 — no bf16 copies at all.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.hardware.device_traits import DeviceTraits
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.units import BF16_BYTES, FP32_BYTES

ADAM_MOMENTS = 2  # exp_avg + exp_avg_sq, each in the parameter's dtype (torch/optim/adam.py `_init_group`)
ADAM_STATE_BYTES = ADAM_MOMENTS * FP32_BYTES  # both moments over fp32 parameters
HALF_DTYPES: frozenset[str] = frozenset({"bf16", "fp16"})  # `Knobs.model_dtype` values stored in 2 bytes
DEEPSPEED_ZERO_MODES: frozenset[str] = frozenset({"zero1", "zero2"})  # memory/zero.py ZERO_MODES


class Precision(NamedTuple):
    """Bytes per element; a plain tuple so the search's inner loop stays allocation-light."""

    compute_bytes: int  # activations, gathered layers, logits dtype
    master_bytes: int  # actor parameters as stored (FSDP shard)
    grad_bytes: int  # actor gradients (FSDP reduce dtype)
    adam_bytes: int  # both Adam moments together
    ref_bytes: int  # reference-model parameters
    rollout_bytes: int  # rollout-engine (vLLM) weights and KV cache
    frozen_bytes: int  # frozen base weights of a LoRA policy, unquantized, as held


def precision_for(
    executor: ExecutorTraits, device: DeviceTraits, *, model_dtype: str = "fp32", state_sharding: str = "full"
) -> Precision:
    """Element sizes for one executor on a GPU (mixed precision; TRL's follow the load dtype and the launcher,
    `trl_precision`) or on the cpu pseudo-device (fp32 everywhere)."""
    if not device.mixed_precision:
        return Precision(*(FP32_BYTES,) * 3, ADAM_STATE_BYTES, *(FP32_BYTES,) * 3)
    if executor.has_knob("model_dtype"):
        return trl_precision(model_dtype, state_sharding)
    fp32 = FP32_BYTES
    return Precision(BF16_BYTES, fp32, fp32, ADAM_STATE_BYTES, executor.ref_bytes, BF16_BYTES, fp32)


def trl_precision(model_dtype: str, state_sharding: str) -> Precision:
    """TRL's element sizes on a GPU from the load dtype and the launcher (module docstring, rule by rule)."""
    loaded = BF16_BYTES if model_dtype in HALF_DTYPES else FP32_BYTES
    c = BF16_BYTES
    if state_sharding in DEEPSPEED_ZERO_MODES:  # DeepSpeed casts both models to bf16; fp32 master + Adam
        return Precision(c, FP32_BYTES, FP32_BYTES, ADAM_STATE_BYTES, c, c, c)
    if state_sharding == "ddp":  # nothing upcasts: every state in the load dtype
        return Precision(c, loaded, loaded, ADAM_MOMENTS * loaded, loaded, c, loaded)
    # FSDP upcasts the trainable parameters to fp32 (ZeRO-3 keeps fp32 partitions); the reference and frozen
    # weights stay as loaded (ZeRO-3: bf16 via zero.Init, planned as model_dtype bf16)
    return Precision(c, FP32_BYTES, FP32_BYTES, ADAM_STATE_BYTES, loaded, c, loaded)


def rollout_element_bytes(device: DeviceTraits) -> int:
    """Bytes per element of the rollout engine's weights and KV cache (bf16 on a GPU, fp32 on cpu)."""
    return BF16_BYTES if device.mixed_precision else FP32_BYTES
