"""Which transient tensors are live together: the peak moments of the update and log-prob passes.

A phase's transients do not all coexist; summing them over-counts (the traced method showed the
lm_head/logits moment has no decoder layer gathered and no layer gradients). The update step's peak
is the largest of four moments (traced with the FSDP2 memory tracker, verify/traced.py):

  logits    end of forward / loss backward: root params gathered, the last decoder layer's all-gather
            (FSDP2 prefetches it when the root's backward starts: one layer, c·P_layer), saved
            activations, the logits temporaries (and Ulysses buffers).
  layer     backward of the last decoder layer: root params gathered, saved activations without the
            head side (the final norm's saved tensors are freed by the LM head's backward), the layer
            being recomputed (checkpointing), two gathered layers (the unsharded one and the
            prefetch all-gather buffer), the gradients flowing through the layer (c·(3I + h)·T), the
            lm_head gradient held until the root's reduce-scatter (c·P_head, or c·P_embed when tied)
            and the previous layer's fp32 reduce-scatter input (4·P_layer).
  root      the root's post-backward reduce-scatter: bf16 gradients of embeddings + lm_head
            (c·(E + H)) and their fp32 reduce-scatter input (4·(E + H)) — the layers' reduce-scatters
            have completed;
            the root params stay gathered only when the embeddings are tied (untied: resharded).
  optimizer the AdamW step's temporaries (everything above is freed by then).

Every moment returns the same item names (absent ones are 0), so a report always carries the full
set; the items of the winning moment are the ones that are live at the phase's peak.
"""

from __future__ import annotations

UPDATE_ITEMS = (
    "autocast_weight_cache",
    "root_embed_lm_head",
    "gathered_layers",
    "activations",
    "recompute_activations",
    "logits",
    "layer_backward_temporaries",
    "unsharded_grads",
    "root_reduce_scatter",
    "ulysses_all_to_all",
    "optimizer_step_temporaries",
)
LOG_PROB_ITEMS = (
    "autocast_weight_cache",
    "root_embed_lm_head",
    "gathered_layers",
    "activations",
    "logits",
    "ulysses_all_to_all",
)


def _largest(moments: list[dict[str, int]], names: tuple[str, ...]) -> dict[str, int]:
    best = max(moments, key=lambda m: sum(m.values()))
    return {name: best.get(name, 0) for name in names}


def update_peak_items(
    *,
    root_gathered: int,
    root_tied: bool,
    gathered_layers: int,
    saved_activations: int,
    head_side_activations: int,
    prefetched_layer: int,
    recompute_activations: int,
    logits: int,
    layer_backward_temporaries: int,
    head_grad: int,
    root_grads: int,
    root_reduce_scatter: int,
    layer_reduce_scatter: int,
    all_to_all: int,
    optimizer_step: int,
    weight_casts: int = 0,
    head_weight_cast: int = 0,
    head_grad_in_flight: int = 0,
    head_grad_pending: int = 0,
    embedding_grad: int = 0,
) -> dict[str, int]:
    """Working-set items at the update's peak moment (see module docstring). `saved_activations` includes
    `head_side_activations` (the final norm's saved tensors, part of it); `prefetched_layer` is one
    gathered layer (the backward prefetch at the logits moment). Traced with verify/traced.py through
    the engine's actor (Qwen2.5-1.5B/7B, 16k tokens): per-module backward peaks of FSDPMemTracker.
    `weight_casts`: autocast's bf16 weight copies of an unsharded rank (`memory/autocast.py`), held by
    autograd from the forward through the backward: in the logits and layer moments, less the LM head's
    (`head_weight_cast`, released by the head's backward) in the layer moment. `head_grad_in_flight`: an
    unsharded rank's LM-head gradient on its way into `.grad` (`memory/autocast.unsharded_head_grad_bytes`),
    the head moment: right after the head's backward, every activation still saved. Tied embeddings on an
    unsharded rank (`memory/autocast.py`): the head's fp32 gradient pending through the layers' backward
    (`head_grad_pending`, in the layer moment) and the embedding moment at the end (`embedding_grad`)."""
    logits_moment = {
        "autocast_weight_cache": weight_casts,
        "root_embed_lm_head": root_gathered,
        "gathered_layers": prefetched_layer,
        "activations": saved_activations,
        "logits": logits,
        "ulysses_all_to_all": all_to_all,
    }
    layer_moment = {
        "autocast_weight_cache": weight_casts - head_weight_cast,
        "root_embed_lm_head": root_gathered,
        "gathered_layers": gathered_layers,
        "activations": saved_activations - head_side_activations,
        "recompute_activations": recompute_activations,
        "layer_backward_temporaries": layer_backward_temporaries + head_grad_pending,
        "unsharded_grads": head_grad + layer_reduce_scatter,
        "ulysses_all_to_all": all_to_all,
    }
    head_moment = {
        "autocast_weight_cache": weight_casts - head_weight_cast,
        "activations": saved_activations,
        "layer_backward_temporaries": head_grad_in_flight,
    }
    root_moment = {
        "root_embed_lm_head": root_gathered if root_tied else 0,
        "unsharded_grads": root_grads,
        "root_reduce_scatter": root_reduce_scatter,
    }
    step_moment = {"optimizer_step_temporaries": optimizer_step}
    embedding_moment = {"layer_backward_temporaries": embedding_grad}
    moments = [logits_moment, layer_moment, root_moment, step_moment, embedding_moment]
    moments += [head_moment] if head_grad_in_flight else []
    return _largest(moments, UPDATE_ITEMS)


def log_prob_peak_items(
    *,
    root_gathered: int,
    gathered_layers: int,
    layer_forward: int,
    head_side: int,
    logits: int,
    all_to_all: int,
    embedding_output: int,
    weight_casts: int = 0,
    head_weight_cast: int = 0,
) -> dict[str, int]:
    """Working-set items at a forward-only pass's peak: inside a layer, at the logits, or at the first
    layer's unshard.

    The first layer's unshard (traced through the engine's actor, verify/traced.py, Qwen2.5-7B on 8 ranks,
    2 rows × 1535 tokens: the tracker's peak sat in `layers.0`'s pre-forward): FSDP2's implicit forward
    prefetch keeps the previous group's all-gather result until the next group's `wait_for_unshard`, so
    while layer 0 is all-gathered and copied out the root is held twice (its unsharded params and its
    all-gather output, 2·root_gathered), layer 0 twice (all-gather output and unsharded copy, the
    `gathered_layers` pair) and the embedding output. It is the peak when few tokens pass (short rows,
    small log-prob micro-batches) and the root is large (big vocabularies). `weight_casts`: autocast's
    bf16 weight copies of an unsharded rank, all made by the logits; the LM head's (`head_weight_cast`)
    is made at the logits, so absent from the moments inside the layers."""
    layer_moment = {
        "autocast_weight_cache": weight_casts - head_weight_cast,
        "root_embed_lm_head": root_gathered,
        "gathered_layers": gathered_layers,
        "activations": layer_forward,
        "ulysses_all_to_all": all_to_all,
    }
    logits_moment = {
        "autocast_weight_cache": weight_casts,
        "root_embed_lm_head": root_gathered,
        "activations": head_side,
        "logits": logits,
    }
    unshard_moment = {
        "autocast_weight_cache": weight_casts - head_weight_cast,
        "root_embed_lm_head": 2 * root_gathered,
        "gathered_layers": gathered_layers,
        "activations": embedding_output,
    }
    return _largest([layer_moment, logits_moment, unshard_moment], LOG_PROB_ITEMS)
