"""One decode step of a Llama-family decoder with little Python around the kernels.

    reason = unsupported_reason(model)          None when `LlamaDecodeStep` applies to `model`
    step = LlamaDecodeStep(model, cache, rows, total_len_tokens=)   takes over a prefilled DynamicCache
    logits = step(tokens [B], positions [B, 1], key_mask [B, 1, 1, L])    [B, V]; appends to its cache

transformers' own forward of one token costs more Python than arithmetic for a small model: per
step it prepares the mask and wraps outputs, per layer it dispatches through the attention-interface
registry, repeats the KV heads (`repeat_kv`) and concatenates the cache (`torch.cat`). This step
runs the same computation directly on the model's own modules and parameters:

    h = embed(tokens); cos, sin = rows of a [total_len, head_dim] table the model's rotary_emb built
      once (default RoPE; other RoPE types call rotary_emb(h, positions) every step)
    per layer: x = input_layernorm(h); q, k, v = q/k/v_proj(x) [+ q_norm, k_norm on the head dim
      (Qwen3)]; rotate q, k (q·cos + rotate_half(q)·sin); write k, v into the preallocated cache at
      the current slot; o = SDPA(q, K[:L], V[:L], key_mask, enable_gqa, scale = the module's
      `scaling`); h += o_proj(o); h += down_proj(act_fn(gate_proj(x')) · up_proj(x')), x' =
      post_attention_layernorm(h)
    logits = lm_head(norm(h))
    (fp32 RMSNorms run as one `F.rms_norm` call: the same arithmetic, bit for bit, as the module)

Supported: model types llama, qwen2, qwen3 (the families of profiles/configs) with SDPA attention,
every layer full attention (no sliding window) and plain (not FSDP-sharded) parameters — the step
calls the layers' parts directly, so per-layer module hooks do not run. Anything else is reported by
`unsupported_reason` and decoded with the model's own forward instead. The KV cache here is one
[B, kv_heads, total_len, head_dim] tensor per layer for keys and one for values (what the
DynamicCache would grow to), allocated once; the prefill's cache (U ≤ B distinct prompts) is
gathered into it (`rows`: the prefill row of every decoded row) and released layer by layer as it
is copied.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")
_MLP_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")


def unsupported_reason(model: Any) -> str | None:
    """Why `LlamaDecodeStep` cannot stand in for `model`'s forward (None: it can)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r} is not sdpa"
    layer_types = getattr(config, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        return "sliding-window attention layers"
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return "sharded (DTensor) parameters: FSDP gathers them in module hooks this step would bypass"
    decoder = getattr(model, "model", None)
    if decoder is None or not all(hasattr(decoder, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm")) or not hasattr(model, "lm_head"):
        return "not the embed_tokens / rotary_emb / layers / norm / lm_head layout"
    for layer in decoder.layers:
        if not all(hasattr(layer, a) for a in _LAYER_PARTS):
            return "a decoder layer without the Llama layout"
        if not all(hasattr(layer.self_attn, a) for a in _ATTN_PARTS) or not all(hasattr(layer.mlp, a) for a in _MLP_PARTS):
            return "an attention or MLP block without the Llama layout"
    return None


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding (the Llama / Qwen `apply_rotary_pos_emb` convention, halves rotated)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _rms_norm(norm: Any, x: Tensor) -> Tensor:
    """`norm(x)` for a Llama/Qwen RMSNorm module as one `F.rms_norm` call (x · rsqrt(mean(x²) + eps) · w,
    fp32 inputs: the module's own arithmetic, bit for bit, without its Python and dtype round trips)."""
    eps = getattr(norm, "variance_epsilon", None)
    if x.dtype != torch.float32 or eps is None or getattr(norm, "weight", None) is None or norm.weight.dtype != torch.float32:
        return norm(x)
    return F.rms_norm(x, norm.weight.shape, norm.weight, eps)


class LlamaDecodeStep:
    """Decodes one token per call for B rows; owns the KV cache from the prefill on (module docstring)."""

    def __init__(self, model: Any, cache: Any, rows: Tensor, *, total_len_tokens: int) -> None:
        self.model = model
        self.decoder = model.model
        self.layers = list(self.decoder.layers)
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.length = int(cache.layers[0].keys.shape[2])
        for layer_cache in cache.layers:
            k, v = layer_cache.keys, layer_cache.values  # [U, kv_heads, prompt, head_dim]
            _, heads, filled, dim = k.shape
            keys = k.new_empty((rows.numel(), heads, total_len_tokens, dim))
            values = v.new_empty((rows.numel(), heads, total_len_tokens, dim))
            keys[:, :, :filled] = k.index_select(0, rows)
            values[:, :, :filled] = v.index_select(0, rows)
            layer_cache.keys = layer_cache.values = None  # this layer of the prefill cache is no longer needed
            self.keys.append(keys)
            self.values.append(values)
        # rotary cos/sin of every position this decode can reach, computed once by the model's own
        # rotary module (elementwise in the position: the same values as a per-step call) and
        # gathered per step by the rows' positions
        # (default RoPE only: dynamic variants rescale with the longest position seen so far)
        self.cos_table: Tensor | None = None
        self.sin_table: Tensor | None = None
        if getattr(self.decoder.rotary_emb, "rope_type", None) == "default":
            embed = self.decoder.embed_tokens.weight  # the rotary module takes only device and dtype from it
            cos, sin = self.decoder.rotary_emb(embed, torch.arange(total_len_tokens, device=embed.device)[None])
            self.cos_table, self.sin_table = cos[0], sin[0]  # [total_len, head_dim]
        first = self.layers[0].self_attn
        self.head_dim = self.keys[0].shape[-1]
        self.num_heads = first.q_proj.out_features // self.head_dim
        self.num_kv_heads = self.keys[0].shape[1]

    def __call__(self, tokens: Tensor, positions: Tensor, key_mask: Tensor) -> Tensor:
        """Logits [B, V] of the next token after `tokens` [B] at `positions` [B, 1]; `key_mask`
        [B, 1, 1, ≥ length + 1] marks the cache slots each row may attend to (bool)."""
        batch = tokens.shape[0]
        slot = self.length
        end = slot + 1
        mask = key_mask[..., :end]
        h = self.decoder.embed_tokens(tokens[:, None])  # [B, 1, hidden]
        if self.cos_table is not None and self.sin_table is not None:
            cos, sin = self.cos_table[positions], self.sin_table[positions]
        else:
            cos, sin = self.decoder.rotary_emb(h, positions)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, head_dim]: broadcast over heads
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = _rms_norm(layer.input_layernorm, h)
            q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(batch, 1, self.num_heads, self.head_dim)
            k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(batch, 1, self.num_kv_heads, self.head_dim)
            v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(batch, 1, self.num_kv_heads, self.head_dim)
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before the rotation
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = _rotate(q.transpose(1, 2), cos, sin)
            k = _rotate(k.transpose(1, 2), cos, sin)
            self.keys[i][:, :, slot:end] = k
            self.values[i][:, :, slot:end] = v.transpose(1, 2)
            o = F.scaled_dot_product_attention(q, self.keys[i][:, :, :end], self.values[i][:, :, :end], attn_mask=mask,
                                               scale=attn.scaling, enable_gqa=self.num_heads != self.num_kv_heads)
            h = h + F.linear(o.transpose(1, 2).reshape(batch, 1, -1), attn.o_proj.weight, attn.o_proj.bias)
            x = _rms_norm(layer.post_attention_layernorm, h)
            h = h + F.linear(mlp.act_fn(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)) * F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias),
                             mlp.down_proj.weight, mlp.down_proj.bias)
        self.length = end
        head = self.model.lm_head
        return F.linear(_rms_norm(self.decoder.norm, h), head.weight, head.bias)[:, -1]
