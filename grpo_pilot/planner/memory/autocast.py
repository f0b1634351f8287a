"""Autocast's weight casts: one unsharded process computing in bf16 over fp32 weights.

Without FSDP (one training rank: our engine without offload, TRL on one GPU) the fp32 parameters are used
in place under `torch.autocast(dtype=bfloat16)`. Autocast casts the arguments of the ops on its
lower-precision list (the matmul family: `linear`, `matmul`, `mm`, ...) and keeps the cast of a float32
leaf that requires grad, outside a view, in its cache until the outermost autocast region exits
(aten/src/ATen/autocast_mode.cpp `cached_cast`, `can_try_cache`). Which weights are cast: every weight and
bias a projection takes — the decoder layers' q/k/v/o and gate/up/down, and the LM head (the embedding
matrix itself when tied). Not cast: the embedding lookup (`embedding` is on no autocast list: it reads
the fp32 matrix) and the RMSNorm weights (an elementwise multiply). Traced through the engine's actor
(verify/traced.py, "Autocast Cast" label): exactly c × those parameters, in the update and in a
log-prob pass.

When the casts live:
- training forward: each cast is made at the weight's first use and stays referenced by autograd (the
  projection's backward needs the bf16 weight) until that layer's backward; at the logits all of them
  are live. A second micro-batch casts again (the region exited with the first forward);
- log-prob pass (`torch.no_grad`): the parameters still require grad, so the casts are cached all the
  same and accumulate to the whole set by the logits; a bf16 reference model is cast-free;
- HF rollout (`torch.inference_mode`): nothing is cached (`!c10::InferenceMode::is_enabled()` in
  `can_try_cache`, pytorch#158232; checked on torch 2.13: every projection casts its weight anew), so
  only the weight in use is live: at most the LM head's c·V·h (`memory/hf_generate.py`).

Measured on one H200 (tests/planner/gpu_measurements/h200-2026-11-26.json, the Qwen2.5-1.5B run with two
mini-batches): the old-policy log-prob pass peaked 2.54 GB above the FSDP model's tensors (root and two
gathered layers, 0.57 GB), i.e. ≈ the 3.09 GB bf16 copy of the 1.54B parameters in their place.
"""

from __future__ import annotations

from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import FP32_BYTES


def autocast_cast_params(model: ModelSpec, *, lm_head: bool = True) -> int:
    """Parameters autocast casts in one forward: every projection's weight and bias (a layer without its
    two RMSNorms and Qwen3's q/k norms), and the LM head (V·h, tied or not) unless `lm_head` is False:
    our fused log-prob kernel takes the head weight in the hidden states' dtype (`weight.to(hidden.dtype)`,
    fp32 under autocast: no copy) and runs with autocast off (engine/algos/logprobs.py)."""
    norms = 2 * model.hidden_size + (2 * model.head_dim if model.qk_norm else 0)
    head = model.vocab_size * model.hidden_size if lm_head else 0
    return model.num_layers * (model.params_per_layer - norms) + head


def autocast_weight_cache_bytes(cast_params: int, *, weight_bytes: int, compute_bytes: int, sharded: bool) -> int:
    """Bytes of compute-dtype weight casts one unsharded forward pass holds (0 when sharded: FSDP's
    mixed precision gathers bf16 layers instead; 0 when the weights are already in the compute dtype)."""
    if sharded or weight_bytes == compute_bytes:
        return 0
    return cast_params * compute_bytes


def head_weight_cast(model: ModelSpec, compute_bytes: int) -> int:
    """The LM head's cast (c·V·h): made at the logits and released by the head's backward, so absent from the
    moments inside the decoder layers (traced: a log-prob pass's layer peak holds every cast but the head's
    and the last layer's down projection)."""
    return compute_bytes * model.vocab_size * model.hidden_size


def unsharded_head_grad_bytes(model: ModelSpec, compute_bytes: int, *, cast: bool) -> int:
    """The LM head's weight gradient in flight on an unsharded rank, at the start of backward: the
    compute-dtype gradient the head's matmul returns (c·V·h) and, when the head was cast by autocast, its
    fp32 copy (ToCopyBackward) on its way into the fp32 `.grad` (4·V·h). Traced through the engine's actor
    (verify/traced.py, the H200 Qwen2.5-3B plan: 1 row of 1022 tokens, 768 scored): the update peaks there,
    all layers' activations and casts but the head's still held, 12,385 MiB beside the states; the analytic
    moment 12,378 MiB. Our fused kernel accumulates the fp32 gradient itself (`memory/logits.py`): 0 here."""
    extra = FP32_BYTES if cast else 0
    return (compute_bytes + extra) * model.vocab_size * model.hidden_size


def tied_head_grad_pending_bytes(model: ModelSpec, *, sharded: bool) -> int:
    """Tied embeddings on an unsharded rank: the LM head's fp32 gradient (4·V·h) waits in autograd's input
    buffer for the embedding's contribution to the same leaf, i.e. through every layer's backward (the
    engine accumulates a leaf's gradient once all its contributions arrived). 0 when untied or sharded."""
    if sharded or not model.tie_word_embeddings:
        return 0
    return FP32_BYTES * model.vocab_size * model.hidden_size


def tied_embedding_grad_bytes(model: ModelSpec, *, sharded: bool) -> int:
    """The end of an unsharded rank's backward with tied embeddings: the embedding's dense fp32 gradient,
    the head's pending one and their sum, 12·V·h (traced: a tied 32k-vocabulary model's update peaked
    there at exactly 12·V·h of temporaries, every activation and cast already released)."""
    return 3 * tied_head_grad_pending_bytes(model, sharded=sharded)
