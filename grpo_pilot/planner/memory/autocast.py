"""Autocast's weight-cast cache: one unsharded process computing in bf16 over fp32 weights.

Without FSDP (one training rank: our engine without offload, TRL on one GPU) the fp32 parameters are used
in place under `torch.autocast(dtype=bfloat16)`. Autocast casts every fp32 leaf tensor that requires grad
once per autocast region and keeps the cast in its cache (aten/src/ATen/autocast_mode.cpp `cached_cast`:
`can_try_cache` for a float32 leaf with requires_grad, outside a view; the cache is cleared when the
region exits). A forward pass therefore accumulates a bf16 copy of every weight it uses — by the
logits, a whole c·P copy of the model — and a training forward's copies stay referenced by autograd
until the backward has used them. Parameters requires_grad stay True in a no-grad log-prob pass, so
that pass caches them too; a bf16 reference model is cast-free.

Measured on one H200 (../shared/measurements/h200-2026-11-26.json, the Qwen2.5-1.5B run with two
mini-batches): the old-policy log-prob pass peaked 2.54 GB above the FSDP model's tensors (root and two
gathered layers, 0.57 GB), i.e. ≈ the 3.09 GB bf16 copy of the 1.54B parameters in their place.
"""

from __future__ import annotations


def autocast_weight_cache_bytes(num_params: int, *, weight_bytes: int, compute_bytes: int, sharded: bool) -> int:
    """Bytes of compute-dtype weight casts one unsharded forward pass holds (0 when sharded: FSDP's
    mixed precision gathers bf16 layers instead; 0 when the weights are already in the compute dtype)."""
    if sharded or weight_bytes == compute_bytes:
        return 0
    return num_params * compute_bytes
