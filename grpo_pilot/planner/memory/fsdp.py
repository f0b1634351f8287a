"""FSDP2 working set: gathered parameters and unsharded gradients (MixedPrecisionPolicy param bf16,
reduce fp32), as the traced method shows them (FSDP2 mem tracker labels in brackets):

- gathered layers: the decoder layer in use [Unsharded Param] plus the prefetched next layer's
  all-gather output [All Gather], both in the compute dtype: 2 · c · P_layer (memory-model.md §2).
- root: with `fully_shard` on the root module, embeddings and lm_head are gathered in bf16 and stay
  gathered through forward and backward: c · (P_embed + P_head) (2.03 GiB for Qwen2.5-7B).
- a layer's gradient is handed to reduce-scatter as an fp32 copy [Reduce Scatter] that lives until
  the next layer's backward: 4 · P_layer.
- the lm_head's bf16 gradient [Unsharded Grad / Temp] is produced at the start of backward and held
  until the root reduce-scatters at the very end: c · P_head (c · P_embed when tied: same tensor).
- the root's post-backward: bf16 grads of embeddings + lm_head, c · (E + H), and their fp32
  reduce-scatter input, 4 · (E + H).
Unsharded (`unsharded=True`: one process on the cpu pseudo-device — fp32, no FSDP, no mixed precision)
parameters are used in place and gradients land in the (full) `.grad` already counted as the actor's
grads: all of these are 0.
"""

from __future__ import annotations

FSDP_PREFETCH_LAYERS = 2  # the unsharded layer + the prefetched all-gather buffer


def gathered_layers_bytes(
    params_per_layer: int, compute_bytes: int, *, unsharded: bool, prefetch_layers: int = FSDP_PREFETCH_LAYERS
) -> int:
    """Bytes of the all-gathered decoder layer(s) in the compute dtype (0 when parameters are used in place)."""
    return 0 if unsharded else prefetch_layers * params_per_layer * compute_bytes


def root_gathered_bytes(embedding_params: int, lm_head_params: int, compute_bytes: int, *, unsharded: bool) -> int:
    """Embeddings + untied lm_head held gathered by the root FSDP unit."""
    return 0 if unsharded else (embedding_params + lm_head_params) * compute_bytes


def layer_reduce_scatter_bytes(params_per_layer: int, reduce_bytes: int, *, unsharded: bool) -> int:
    """One layer's gradient copied into the reduce dtype for reduce-scatter."""
    return 0 if unsharded else params_per_layer * reduce_bytes


def head_grad_bytes(embedding_params: int, lm_head_params: int, compute_bytes: int, *, unsharded: bool) -> int:
    """The lm_head gradient in the compute dtype (the embedding's when the weights are tied)."""
    return 0 if unsharded else (lm_head_params or embedding_params) * compute_bytes


def root_grad_bytes(
    embedding_params: int, lm_head_params: int, *, compute_bytes: int, reduce_bytes: int, unsharded: bool
) -> tuple[int, int]:
    """(bf16 root gradients, their fp32 reduce-scatter input) at the root's post-backward."""
    if unsharded:
        return 0, 0
    n = embedding_params + lm_head_params
    return n * compute_bytes, n * reduce_bytes
