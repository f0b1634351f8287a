"""Shared-prompt forward: a GRPO micro-batch computes each distinct prompt once, not once per completion.

    reason = shared_prefix_unsupported(model)       None when the shared forward applies to `model`
    batch = prefix_batch(prompts, responses, device) the layout below (pure bookkeeping, no model)
    hidden = shared_prefix_hidden(model, batch)      final hidden states [N, h] at the scored positions

GRPO samples every prompt n times, and the n completions of a group start with the same prompt
tokens. In a causal model those tokens' hidden states (and keys/values) do not depend on what follows,
so they are the same in all n sequences: this forward computes them once per distinct prompt and lets
every completion attend to its prompt's keys and values (the prefix-sharing idea of "Prefix Grouper",
Liu et al. 2025, arXiv:2506.05433; the arithmetic is the plain causal forward, reordered). Gradients are
exact: a prompt position's gradient is the sum over the completions that attended to it (autograd of
the `index_select` that hands the prompt's keys/values to each completion).

Layout of one micro-batch (U distinct prompts among its B samples; P = longest prompt, R = longest fed
response = longest response − 1, since a sequence's last token predicts nothing we score):
- prompt rows [U, P], right-padded, causal attention among themselves (SDPA `is_causal`, no mask: a
  pad after the prompt is never seen by a real prompt position);
- response rows [B, R], right-padded; row b's position j has position id p_b + j and attends to its
  prompt's first p_b keys and to its own response keys 0..j: one boolean mask [B, 1, R, P + R] shared by
  every layer (a pad query still sees its real prompt, so no row is fully masked);
- every projection, norm and MLP runs once over the U·P + B·R positions as one flat token batch; only
  attention is split into the prompt and response parts;
- scored positions: the first response token of sample b is predicted by its prompt's last position
  (p_b − 1, shared by its group), token t ≥ 1 by its response position t − 1. The final norm runs on
  those N = Σ r_b positions only.
Positions computed: U·P + B·R (vs B·(P + R) − 1 per row without sharing); real ones Σ_u p_u + Σ_b (r_b − 1).

Supported: what `rollout/llama_step.unsupported_reason` accepts (llama, qwen2, qwen3 with SDPA, full
attention, plain parameters) and no attention dropout; the layers' own modules run (projections, norms,
MLP, Qwen3's q/k norms, the model module's `apply_rotary_pos_emb`), so autocast and gradient
checkpointing (per layer, non-reentrant, when the model has it enabled) behave as in transformers.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from grpo_pilot.engine.host_copy import to_device
from grpo_pilot.engine.rollout.llama_step import unsupported_reason


def shared_prefix_unsupported(model: Any) -> str | None:
    """Why the shared-prompt forward cannot run `model` (None: it can)."""
    reason = unsupported_reason(model, allow_adapters=True)  # every projection is called as a module
    if reason is not None:
        return reason
    if float(getattr(model.config, "attention_dropout", 0.0) or 0.0) != 0.0:
        return "attention dropout is on"
    return None


@dataclass(frozen=True)
class PrefixBatch:
    """Index tensors of one micro-batch in the shared layout (module docstring); no model state."""

    prompt_ids: Tensor  # [U, P] right-padded with 0
    response_ids: Tensor  # [B, R] fed response tokens, right-padded with 0
    positions: Tensor  # [1, U·P + B·R] position ids of the flat token batch
    inverse: Tensor  # [B] the prompt row of every sample
    mask: Tensor  # [B, 1, R, P + R] bool: what a response position may attend to
    scored: Tensor  # [N] flat positions whose outputs predict the response tokens, sample-major
    targets: Tensor  # [N] the response tokens they predict
    real_positions: int  # non-pad positions among the U·P + B·R computed

    @property
    def computed_positions(self) -> int:
        return int(self.positions.shape[1])


def prefix_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], device: torch.device
) -> PrefixBatch:
    """The shared layout of samples (prompt ids, response ids ≥ 1 token each); equal prompts share a row."""
    first: dict[tuple[int, ...], int] = {}
    inverse = [first.setdefault(tuple(p), len(first)) for p in prompts]
    unique = list(first)
    width_p = max(len(p) for p in unique)
    width_r = max(len(r) for r in responses) - 1
    prompt_rows = [list(p) + [0] * (width_p - len(p)) for p in unique]
    response_rows = [list(r[:-1]) + [0] * (width_r - len(r) + 1) for r in responses]
    prompt_len = torch.tensor([len(p) for p in unique], dtype=torch.long)
    own_len = prompt_len[torch.tensor(inverse, dtype=torch.long)]  # [B] each sample's prompt length
    offset = len(unique) * width_p
    positions = torch.cat(
        [torch.arange(width_p).repeat(len(unique)), (own_len[:, None] + torch.arange(width_r)).flatten()]
    )
    sees_prompt = torch.arange(width_p)[None, :] < own_len[:, None]  # [B, P]
    causal = torch.ones((width_r, width_r), dtype=torch.bool).tril()  # [R, R]
    mask = torch.cat(
        [sees_prompt[:, None, :].expand(-1, width_r, -1), causal[None].expand(len(responses), -1, -1)], dim=-1
    )
    scored: list[int] = []
    targets: list[int] = []
    for b, (u, r) in enumerate(zip(inverse, responses)):
        scored.append(u * width_p + len(unique[u]) - 1)
        scored.extend(range(offset + b * width_r, offset + b * width_r + len(r) - 1))
        targets.extend(int(t) for t in r)
    real = sum(len(p) for p in unique) + sum(len(r) - 1 for r in responses)

    def put(x: Any, dtype: torch.dtype = torch.long) -> Tensor:  # no host wait on CUDA (engine/host_copy.py)
        return to_device(torch.as_tensor(x, dtype=dtype), dtype=dtype, device=device)

    return PrefixBatch(
        prompt_ids=put(prompt_rows).view(len(unique), width_p),
        response_ids=put(response_rows).view(len(responses), width_r),
        positions=put(positions)[None],
        inverse=put(inverse),
        mask=put(mask[:, None], torch.bool),
        scored=put(scored),
        targets=put(targets),
        real_positions=real,
    )


def _layer(layer: Any, h: Tensor, *, cos: Tensor, sin: Tensor, batch: PrefixBatch, rotary: Any) -> Tensor:
    """One decoder layer over the flat token batch h [T, hidden] (prompt rows first, then responses)."""
    attn = layer.self_attn
    u, p = batch.prompt_ids.shape
    b, r = batch.response_ids.shape
    split = u * p
    head_dim = attn.head_dim
    x = layer.input_layernorm(h)
    q = attn.q_proj(x).view(h.shape[0], -1, head_dim)
    k = attn.k_proj(x).view(h.shape[0], -1, head_dim)
    v = attn.v_proj(x).view(h.shape[0], -1, head_dim)
    if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = rotary(q, k, cos, sin, unsqueeze_dim=1)  # [T, heads, D] with cos/sin [T, D]
    heads, kv_heads = q.shape[1], k.shape[1]
    gqa = heads != kv_heads

    def rows(t: Tensor, n: int, width: int, start: int) -> Tensor:  # [n, heads, width, D]
        return t[start : start + n * width].view(n, width, t.shape[1], head_dim).transpose(1, 2)

    qp, kp, vp = rows(q, u, p, 0), rows(k, u, p, 0), rows(v, u, p, 0)
    outs = [
        torch.nn.functional.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=attn.scaling, enable_gqa=gqa)
        .transpose(1, 2)
        .reshape(split, -1)
    ]
    if r > 0:
        qr, kr, vr = rows(q, b, r, split), rows(k, b, r, split), rows(v, b, r, split)
        keys = torch.cat([kp.index_select(0, batch.inverse), kr], dim=2)
        values = torch.cat([vp.index_select(0, batch.inverse), vr], dim=2)
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(
                qr, keys, values, attn_mask=batch.mask, scale=attn.scaling, enable_gqa=gqa
            )
            .transpose(1, 2)
            .reshape(b * r, -1)
        )
    h = h + attn.o_proj(torch.cat(outs) if len(outs) > 1 else outs[0])
    return h + layer.mlp(layer.post_attention_layernorm(h))


def shared_prefix_hidden(model: Any, batch: PrefixBatch) -> Tensor:
    """Final (normed) hidden states [N, hidden] at `batch.scored`; `model` must pass `shared_prefix_unsupported`."""
    decoder = model.model
    tokens = torch.cat([batch.prompt_ids.flatten(), batch.response_ids.flatten()])
    h = decoder.embed_tokens(tokens)  # [T, hidden]
    cos, sin = decoder.rotary_emb(h[None], batch.positions)
    cos, sin = cos[0], sin[0]  # [T, D]
    rotary = sys.modules[type(decoder.layers[0].self_attn).__module__].apply_rotary_pos_emb
    use_checkpoint = bool(getattr(model, "is_gradient_checkpointing", False)) and torch.is_grad_enabled()
    for layer in decoder.layers:
        if use_checkpoint:
            h = checkpoint(_layer, layer, h, cos=cos, sin=sin, batch=batch, rotary=rotary, use_reentrant=False)
        else:
            h = _layer(layer, h, cos=cos, sin=sin, batch=batch, rotary=rotary)
    return decoder.norm(h.index_select(0, batch.scored))
