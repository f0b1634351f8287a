"""Activation bytes of a decoder-only transformer for T tokens on one rank.

Saved for backward per token per layer without checkpointing (HF eager layers, SDPA attention, bf16),
traced on torch 2.13 / transformers 5.19 with the traced method (verify/traced.py, FSDP2 mem
tracker; layer count varied 4 → 8 and batch shape varied to separate the terms), exact to the byte
for Qwen2.5-0.5B, Qwen2.5-1.5B, Llama-3.2-1B, Qwen3-0.6B and Qwen3-1.7B shapes:

    16h + 8·q_dim + 8I + 4a + 8                       (bf16 bytes, c = 2)
    + 6·(q_dim + kv_dim) + 4·(a + kv_heads)           with per-head q/k RMSNorm (Qwen3)

The 8·q_dim are the rotary-embedded queries, the keys and values *after* `repeat_kv` (SDPA runs GQA
on expanded k/v, so they are a·d wide, not kv·d) and the attention output, 2 bytes each; 8I the
SwiGLU gate, up, SiLU and product; 4a flash's fp32 log-sum-exp per head; 8 bytes of bookkeeping.
memory-model.md §2 quotes 20h + 4h_kv + 8I + 4a + 8 (an earlier stack without the repeat_kv
expansion); for q_dim = h, kv_dim < h ours is 4·(h − h_kv) bytes larger. On the cpu pseudo-device
(fp32) the 2-byte terms scale by c/2.

Attention mask: HF builds one boolean (block-)causal mask per forward (1 byte per element, B · S²
for B rows of S tokens) and its SDPA path turns it into an additive mask in the compute dtype in
every layer, which the layer keeps for backward: c · B · S² bytes per layer (traced: exactly 2·S
bytes per token per layer at bf16, and S bytes per token once per forward). TRL pads [B, S] rows
with a padding mask; verl runs flash-attention varlen on unpadded tokens and has no mask; our
engine has none either: it right-pads length-sorted rows and runs SDPA with `is_causal` (no mask
tensor; the padding's own activations are counted, since token budgets bound the padded rows), or
packs one varlen row under flash-attention (engine/actor.py). Packing several sequences into one
row under SDPA would cost a block-causal mask with S = the row's tokens (quadratic in the
micro-batch) — the layout the engine avoids.

With activation checkpointing each layer keeps only its input (c·h per token per layer) and one
layer's full activations (and mask) live while it is recomputed in backward. The final hidden state
and its normalised copy (2·c·h per token) feed the lm_head in either case.
"""

from __future__ import annotations

FLASH_LSE_BYTES_PER_HEAD = 4  # fp32 log-sum-exp per query head (attention forward output)
PER_TOKEN_BOOKKEEPING_BYTES = 8  # traced constant per token per layer
QK_NORM_RSQRT_BYTES = 4  # fp32 rsqrt per head row of the per-head q/k RMSNorm


def layer_activation_bytes_per_token(
    hidden: int,
    q_dim: int,
    kv_dim: int,
    intermediate: int,
    num_heads: int,
    compute_bytes: int,
    *,
    qk_norm: bool = False,
    num_kv_heads: int = 0,
) -> int:
    """Bytes one decoder layer saves for backward per token (no checkpointing, mask excluded)."""
    two_byte_terms = 16 * hidden + 8 * q_dim + 8 * intermediate
    if qk_norm:
        two_byte_terms += 6 * (q_dim + kv_dim)
    fixed = FLASH_LSE_BYTES_PER_HEAD * num_heads + PER_TOKEN_BOOKKEEPING_BYTES
    if qk_norm:
        fixed += QK_NORM_RSQRT_BYTES * (num_heads + num_kv_heads)
    return two_byte_terms * compute_bytes // 2 + fixed


def attention_mask_bytes(tokens: int, row_tokens: int, compute_bytes: int) -> int:
    """One layer's saved attention mask: c · (rows × S²) = c · tokens · S for rows of S tokens (0 if S = 0)."""
    return compute_bytes * tokens * row_tokens


def boolean_mask_bytes(tokens: int, row_tokens: int) -> int:
    """The forward's boolean causal mask, built once: tokens · S bytes (0 if S = 0)."""
    return tokens * row_tokens


def saved_activation_bytes(
    tokens: int,
    num_layers: int,
    per_layer_per_token: int,
    mask_per_layer: int,
    bool_mask: int,
    hidden: int,
    compute_bytes: int,
    checkpointing: bool,
) -> int:
    """Activations kept for backward (the checkpointed layer inputs, or everything) + the boolean mask."""
    head_side = head_side_activation_bytes(tokens, hidden, compute_bytes)
    if checkpointing:
        return num_layers * compute_bytes * hidden * tokens + head_side + bool_mask
    return num_layers * (per_layer_per_token * tokens + mask_per_layer) + head_side + bool_mask


def head_side_activation_bytes(tokens: int, hidden: int, compute_bytes: int) -> int:
    """The final hidden state, its normalised copy and the float32 upcast the final RMSNorm saves (HF
    Qwen2/Llama RMSNorm: `hidden_states.to(torch.float32)`): saved for the LM head's backward and freed by
    it, so part of the logits moment but not of the layers' backward (traced, verify/traced.py: the
    activations before the last layer's backward are exactly the layer inputs)."""
    return (2 * compute_bytes + 4) * hidden * tokens


def recompute_activation_bytes(tokens: int, per_layer_per_token: int, mask_per_layer: int, checkpointing: bool) -> int:
    """One layer's full activations recreated during backward (0 without checkpointing)."""
    return per_layer_per_token * tokens + mask_per_layer if checkpointing else 0


def layer_backward_temporary_bytes(tokens: int, hidden: int, intermediate: int, compute_bytes: int) -> int:
    """Gradients flowing through one layer's backward: c · (3I + h) per token (traced: the SwiGLU
    gradients of gate, up and their product plus the hidden-state gradient)."""
    return compute_bytes * (3 * intermediate + hidden) * tokens


# Hidden-state-sized tensors live at a forward-only pass's peak (inside a decoder layer's SwiGLU, layers 1..L-1).
# Traced through the engine's actor (verify/traced.py, Qwen2.5-7B shape, 32 rows × 1535 tokens, no grad): the
# live activation storages at a down_proj's input were these four c·h·T tensors, the SwiGLU product, three
# int64 id tensors and a B·S² boolean mask, and the pass's Activation peak was c·(3I + 4h)·T to the byte
# beside the ids and the mask. The mask (1 % of it there) is not counted: our engine passes no attention
# mask and transformers' SDPA path then relies on `is_causal` (masking_utils `_ignore_causal_mask_sdpa`);
# why the fake-tensor trace still holds a [B, S, S] boolean is not established. What the peak holds:
#   the embedding output (HF's decoder loop keeps `inputs_embeds` referenced until it returns),
#   the layer's input (held by the caller while the layer runs; the same tensor as the above in layer 0,
#     whose peak is c·h·T lower),
#   the post-attention residual sum, and the post-attention RMSNorm output (the MLP's input).
FORWARD_HIDDEN_COPIES = 4


def forward_activation_bytes(
    tokens: int, hidden: int, intermediate: int, compute_bytes: int, mask_per_layer: int, bool_mask: int
) -> int:
    """Peak of a forward-only (no-grad) pass inside a layer: the SwiGLU's act, up and product
    (3·c·I per token), the FORWARD_HIDDEN_COPIES hidden-sized tensors held beside them (c·h each), plus
    the masks. The earlier c·(3I + h) (one residual) was 5% under the traced log-prob phase for 7B–32B."""
    per_token = 3 * intermediate + FORWARD_HIDDEN_COPIES * hidden
    return compute_bytes * per_token * tokens + mask_per_layer + bool_mask
