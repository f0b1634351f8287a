"""Activation bytes of a decoder-only transformer for T tokens on one rank.

Saved for backward per token per layer without checkpointing (HF eager layers, SDPA attention), traced
on torch 2.13 / transformers 5.19 with the traced method (verify/traced.py; layer count varied 2 → 3 and
batch shape varied to separate the terms), exact to the byte for Qwen2.5-0.5B/1.5B, Llama-3.2-1B and
Qwen3-0.6B shapes:

    16h + 4·q_dim + 4·kv_dim + 8I + 4a + 8            bf16 layers (FSDP2 mixed precision), c = 2
    + 6·(q_dim + kv_dim) + 4·(a + kv_heads)            with per-head q/k RMSNorm (Qwen3)
    + 10h                                              fp32 weights under bf16 autocast (one unsharded rank)

16h: the two RMSNorms' float32 upcast of their input, their bf16 output and its bf16 product with the
weight (8h each; (4 + 2c)·h in general: in fp32 the upcast is the input itself, 12h each); 4·q_dim:
the rotary-embedded queries and the attention output; 4·kv_dim: the rotary-embedded keys and the
values, at the kv heads (SDPA's native GQA: transformers passes `enable_gqa` when there is no mask,
`integrations/sdpa_attention.use_gqa_in_sdpa`, and the fused kernels keep k and v unexpanded); 8I the
SwiGLU gate, up, SiLU and product; 4a flash's fp32 log-sum-exp per head; 8 bytes of bookkeeping (the
fp32 unsharded rank on the cpu pseudo-device traced exactly too: 24h + 2·(4·q_dim + 4·kv_dim + 8I) +
4a + 8). An earlier trace counted 8·q_dim (k and v repeated to every query head) and a per-layer mask:
on fake tensors transformers cannot read the position ids and builds a causal mask, which turns native
GQA off; on a GPU there is none (verify/fake_trace.py `gpu_attention_masks` makes the trace see what
the GPU sees). On the cpu pseudo-device (fp32) the 2-byte terms other than the norms' scale by c/2.

Under autocast (the unsharded rank's fp32 weights, engine/actor.py) the residual stream is float32 (the
embedding of an fp32 weight is not autocast, and `residual + bf16 output` promotes), so each RMSNorm
keeps its fp32 input and fp32 normalised copy (+2h each over the bf16 layer), and each projection casts
the fp32 norm output to bf16 itself (autocast caches casts of leaf weights only): q, k and v keep three
copies, gate and up two (+6h): +10h in all. The weights' bf16 casts are `memory/autocast.py`'s.

Attention mask: HF builds one boolean (block-)causal mask per forward (1 byte per element, B · S²
for B rows of S tokens) and its SDPA path turns it into an additive mask in the compute dtype in
every layer, which the layer keeps for backward: c · B · S² bytes per layer (traced: exactly 2·S
bytes per token per layer at bf16, and S bytes per token once per forward). TRL pads [B, S] rows
with a padding mask; verl runs flash-attention varlen on unpadded tokens and has no mask; our
engine has none either: it right-pads length-sorted rows and runs SDPA with `is_causal` (no mask
tensor; the padding's own activations are counted, since token budgets bound the padded rows), or
packs one varlen row under flash-attention (engine/actor.py). Its unsharded shared-prompt layout has
one mask of its own (`memory/shared_prompts.py`).

With activation checkpointing each layer keeps only its input (c·h per token per layer) and one
layer's full activations (and mask) live while it is recomputed in backward. The final hidden state
and its normalised copy (2·c·h per token) feed the lm_head in either case.
"""

from __future__ import annotations

from grpo_pilot.units import FP32_BYTES

FLASH_LSE_BYTES_PER_HEAD = 4  # fp32 log-sum-exp per query head (attention forward output)
PER_TOKEN_BOOKKEEPING_BYTES = 8  # traced constant per token per layer
QK_NORM_RSQRT_BYTES = 4  # fp32 rsqrt per head row of the per-head q/k RMSNorm
AUTOCAST_LAYER_HIDDEN_BYTES = 10  # fp32 residual + per-projection casts under autocast, per hidden unit (traced)


def layer_activation_bytes_per_token(
    *,
    hidden: int,
    q_dim: int,
    kv_dim: int,
    intermediate: int,
    num_heads: int,
    compute_bytes: int,
    qk_norm: bool = False,
    num_kv_heads: int = 0,
    autocast: bool = False,
) -> int:
    """Bytes one decoder layer saves for backward per token (no checkpointing, mask excluded); `autocast`:
    fp32 weights computing in bf16 under autocast (module docstring)."""
    two_byte_terms = 4 * q_dim + 4 * kv_dim + 8 * intermediate
    if qk_norm:
        two_byte_terms += 6 * (q_dim + kv_dim)
    norms = 2 * (FP32_BYTES + 2 * compute_bytes) * hidden  # per RMSNorm: fp32 input, normalised copy, output
    fixed = FLASH_LSE_BYTES_PER_HEAD * num_heads + PER_TOKEN_BOOKKEEPING_BYTES
    if qk_norm:
        fixed += QK_NORM_RSQRT_BYTES * (num_heads + num_kv_heads)
    if autocast:
        fixed += AUTOCAST_LAYER_HIDDEN_BYTES * hidden
    return two_byte_terms * compute_bytes // 2 + norms + fixed


def attention_mask_bytes(tokens: int, row_tokens: int, compute_bytes: int) -> int:
    """One layer's saved attention mask: c · (rows × S²) = c · tokens · S for rows of S tokens (0 if S = 0)."""
    return compute_bytes * tokens * row_tokens


def boolean_mask_bytes(tokens: int, row_tokens: int) -> int:
    """The forward's boolean causal mask, built once: tokens · S bytes (0 if S = 0)."""
    return tokens * row_tokens


def saved_activation_bytes(
    *,
    tokens: int,
    num_layers: int,
    per_layer_per_token: int,
    mask_per_layer: int,
    bool_mask: int,
    hidden: int,
    compute_bytes: int,
    checkpointing: bool,
    head_side: int | None = None,
    layer_input_bytes: int | None = None,
) -> int:
    """Activations kept for backward (the checkpointed layer inputs, or everything) + the boolean mask.
    `head_side` (default: the bf16 layers' `head_side_activation_bytes`) and `layer_input_bytes` (bytes per
    element of a layer's input, default c; 4 under autocast: the fp32 residual stream)."""
    if head_side is None:
        head_side = head_side_activation_bytes(tokens, hidden, compute_bytes)
    if checkpointing:
        per_input = compute_bytes if layer_input_bytes is None else layer_input_bytes
        return num_layers * per_input * hidden * tokens + head_side + bool_mask
    return num_layers * (per_layer_per_token * tokens + mask_per_layer) + head_side + bool_mask


def head_side_activation_bytes(
    tokens: int,
    hidden: int,
    compute_bytes: int,
    *,
    scored: int = 0,
    normed: int | None = None,
    autocast: bool = False,
    head_input_bytes: int = 2,
) -> int:
    """The final hidden state, its normalised copy and the float32 upcast the final RMSNorm saves (HF
    Qwen2/Llama RMSNorm: `hidden_states.to(torch.float32)`): saved for the LM head's backward and freed by
    it, so part of the logits moment but not of the layers' backward (traced, verify/traced.py: the
    activations before the last layer's backward are exactly the layer inputs). `normed`: positions the
    final norm runs on (default all `tokens`; the shared-prompt layout normalises the `scored` ones only).
    Under autocast (traced): the norm's fp32 input and fp32 normalised copy and its fp32 statistic,
    (8h + 4) per normed position, and the LM head's input, `head_input_bytes`·h per scored position (its
    bf16 cast; the fp32 hidden states themselves when our fused kernel runs the head in fp32)."""
    normed = tokens if normed is None else normed
    if autocast:
        return (8 * hidden + 4) * normed + head_input_bytes * hidden * scored
    return (2 * compute_bytes + 4) * hidden * normed


def recompute_activation_bytes(tokens: int, per_layer_per_token: int, mask_per_layer: int, checkpointing: bool) -> int:
    """One layer's full activations recreated during backward (0 without checkpointing)."""
    return per_layer_per_token * tokens + mask_per_layer if checkpointing else 0


def layer_backward_temporary_bytes(
    tokens: int, hidden: int, intermediate: int, compute_bytes: int, *, autocast: bool = False
) -> int:
    """Gradients flowing through one layer's backward: c · (3I + h) per token (traced: the SwiGLU
    gradients of gate, up and their product plus the hidden-state gradient); under autocast the
    hidden-state gradient is float32, as the residual stream is."""
    return (compute_bytes * 3 * intermediate + (FP32_BYTES if autocast else compute_bytes) * hidden) * tokens


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
    *,
    tokens: int,
    hidden: int,
    intermediate: int,
    compute_bytes: int,
    mask_per_layer: int,
    bool_mask: int,
    hidden_bytes: int | None = None,
) -> int:
    """Peak of a forward-only (no-grad) pass inside a layer: the SwiGLU's act, up and product
    (3·c·I per token), the FORWARD_HIDDEN_COPIES hidden-sized tensors held beside them (c·h each, or
    `hidden_bytes`·h: 4 under autocast, where the residual stream and the norm outputs are float32 —
    traced through the engine's actor, Qwen2.5-1.5B shape, 16 rows × 381 tokens: (4·4h + 2·3I)·T to
    within 0.1%), plus the masks. The earlier c·(3I + h) (one residual) was 5% under the traced
    log-prob phase for 7B–32B."""
    per_hidden = compute_bytes if hidden_bytes is None else hidden_bytes
    per_token = compute_bytes * 3 * intermediate + per_hidden * FORWARD_HIDDEN_COPIES * hidden
    return per_token * tokens + mask_per_layer + bool_mask
