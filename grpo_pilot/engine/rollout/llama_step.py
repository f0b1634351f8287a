"""One decode step of a Llama-family decoder with little Python around the kernels.

    reason = unsupported_reason(model)          None when `LlamaDecodeStep` applies to `model`
    step = LlamaDecodeStep(model, cache, rows, key_mask [B, total_len] bool)   takes over a prefilled DynamicCache
    logits = step(tokens [B], positions [B, 1])    [B, V]; appends to its cache
    step.keep_rows(rows [R] int64)                  drops every other row (finished completions): B -> R

transformers' own forward of one token costs more Python than arithmetic for a small model: per
step it prepares the mask and wraps outputs, per layer it dispatches through the attention-interface
registry, repeats the KV heads (`repeat_kv`) and concatenates the cache (`torch.cat`). This step
runs the same computation directly on the model's own parameters:

    h = embed(tokens); cos, sin = rows of a [total_len, head_dim] table the model's rotary_emb built
      once (default RoPE; other RoPE types call rotary_emb(h, positions) every step)
    per layer: x = input_layernorm(h); q, k, v = q/k/v_proj(x) [+ q_norm, k_norm on the head dim
      (Qwen3)]; rotate q, k: q·cos + rotate_half(q)·sin, computed as q·cos + roll(q, D/2)·sin± (sin±:
      sin with its first half negated, in the table); write k, v into the preallocated cache at the
      current slot; o = softmax(scaling · q·Kᵀ + mask) · V over the filled slots;
      h += o_proj(o); h += down_proj(act_fn(gate_proj(x')) · up_proj(x')), x' = post_attention_layernorm(h)
    logits = lm_head(norm(h))

Two variants of that arithmetic, chosen once per step object:
- lean (every parameter and the cache fp32, no autocast): [B, features] activations; one
  `F.rms_norm` per norm (the module's fp32 arithmetic, bit for bit); q and k rotated together; the
  one-query attention by hand — GQA as [B·kv_heads, group, D] @ [B·kv_heads, D, L] (`baddbmm` onto an
  additive 0 / -inf mask [B·kv_heads, 1, total_len] fp32 built once), softmax, @ V; the residual adds
  fused into the o_proj / down_proj matmuls (`addmm_` into h);
- modules (bf16 / fp16 weights, or autocast as in the CUDA rollout): the model's own norm modules
  (fp32 statistics; `F.rms_norm` where input and weight are fp32) and SDPA on the boolean mask, as
  transformers computes them.

Supported: model types llama, qwen2, qwen3 (the families of profiles/configs) with SDPA attention,
every layer full attention (no sliding window), plain (not FSDP-sharded) parameters and no peft adapter
layers (a LoRA run's policy decodes with its own forward) — the step
calls the layers' parts directly, so per-layer module hooks do not run. Anything else is reported by
`unsupported_reason` and decoded with the model's own forward instead. The KV cache here is one
[B, kv_heads, total_len, head_dim] tensor per layer for keys and one for values (what the
DynamicCache would grow to), allocated once; the prefill's cache (U ≤ B distinct prompts) is
gathered into it (`rows`: the prefill row of every decoded row) and released layer by layer as it
is copied. No weight matrix is copied (the planner counts none for the hf rollout); only Qwen3's
q_norm / k_norm vectors are tiled into a [heads + kv_heads, head_dim] table per layer.

`keep_rows` shrinks the batch to the rows that still decode: every layer's K and V buffer is
replaced by its `index_select` of those rows (a new [R, kv_heads, total_len, head_dim] tensor; the
old one is freed as soon as it is replaced, so the transient is one layer's K or V of R rows on top
of the cache), and so is the per-row mask (additive fp32 or boolean). The rotary table is per
position, not per row, and stays. Later calls take R tokens and positions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo_pilot.kernels import LLAMA_FAMILY_MODEL_TYPES as SUPPORTED_MODEL_TYPES

_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")
_MLP_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")


def unsupported_reason(model: Any, *, allow_sharded: bool = False, allow_adapters: bool = False) -> str | None:
    """Why `LlamaDecodeStep` cannot stand in for `model`'s forward (None: it can). `allow_sharded` / `allow_adapters`:
    for callers that call the decoder's modules (whose FSDP hooks, or peft LoRA layers, then run), not their
    parameters: a LoRA projection's `.weight` is its base layer's, so reading it would skip the adapter."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(config, '_attn_implementation', None)!r} is not sdpa"
    layer_types = getattr(config, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        return "sliding-window attention layers"
    if not allow_sharded and any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return "sharded (DTensor) parameters: FSDP gathers them in module hooks this step would bypass"
    decoder = getattr(model, "model", None)
    if (
        decoder is None
        or not all(hasattr(decoder, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm"))
        or not hasattr(model, "lm_head")
    ):
        return "not the embed_tokens / rotary_emb / layers / norm / lm_head layout"
    for layer in decoder.layers:
        if not all(hasattr(layer, a) for a in _LAYER_PARTS):
            return "a decoder layer without the Llama layout"
        if not all(hasattr(layer.self_attn, a) for a in _ATTN_PARTS) or not all(
            hasattr(layer.mlp, a) for a in _MLP_PARTS
        ):
            return "an attention or MLP block without the Llama layout"
        if (
            not allow_adapters
            and any(
                hasattr(getattr(block, part), "base_layer")  # peft tuner layers wrap the projection (engine/lora.py)
                for block, parts in ((layer.self_attn, _ATTN_PARTS[:4]), (layer.mlp, _MLP_PARTS[:3]))
                for part in parts
            )
        ):
            return "peft adapter layers in the projections (the step reads base weights directly)"
    return None


def _norm_args(norm: Any) -> tuple[tuple[int, ...], Tensor, float]:
    """(normalized shape, weight, eps) of a Llama/Qwen RMSNorm module, the arguments of `F.rms_norm`."""
    weight, eps = getattr(norm, "weight", None), getattr(norm, "variance_epsilon", None)
    if weight is None or eps is None:
        raise ValueError(f"{type(norm).__name__} is not an RMSNorm with weight and variance_epsilon")
    return tuple(weight.shape), weight, float(eps)


def _rms_norm(norm: Any, x: Tensor) -> Tensor:
    """`norm(x)`; for fp32 `x` and weight as one `F.rms_norm` call (the same arithmetic, one kernel on CUDA)."""
    weight = getattr(norm, "weight", None)
    if (
        x.dtype != torch.float32
        or weight is None
        or weight.dtype != torch.float32
        or getattr(norm, "variance_epsilon", None) is None
    ):
        return norm(x)
    return F.rms_norm(x, weight.shape, weight, norm.variance_epsilon)


def _act(act_fn: Any) -> Any:
    """`F.silu` for transformers' SiLU activation modules (whose forward is exactly that), else the module."""
    return F.silu if type(act_fn).__name__ in ("SiLUActivation", "SiLU") else act_fn


def _linear(x: Tensor, weight_t: Tensor, bias: Tensor | None) -> Tensor:
    return torch.addmm(bias, x, weight_t) if bias is not None else torch.mm(x, weight_t)


class _LeanLayer:
    """One layer's parameters as the lean step uses them: transposed views, no copies."""

    def __init__(self, layer: Any, heads: int, kv_heads: int, dim: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.in_norm, self.post_norm = _norm_args(layer.input_layernorm), _norm_args(layer.post_attention_layernorm)
        self.q, self.k, self.v = ((p.weight.t(), p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        self.o_t, self.o_bias = attn.o_proj.weight.t(), attn.o_proj.bias
        self.gate, self.up = ((p.weight.t(), p.bias) for p in (mlp.gate_proj, mlp.up_proj))
        self.down_t, self.down_bias = mlp.down_proj.weight.t(), mlp.down_proj.bias
        self.act, self.scaling = _act(mlp.act_fn), float(attn.scaling)
        # Qwen3: RMSNorm over each head of q and of k, as one normalisation of the q|k heads times a
        # per-head weight table [heads + kv_heads, D] (2 ops instead of 2 norm calls and a cat)
        self.qk_norm: tuple[Tensor, float] | None = None
        if hasattr(attn, "q_norm"):
            (_, q_weight, eps), (_, k_weight, k_eps) = _norm_args(attn.q_norm), _norm_args(attn.k_norm)
            if eps != k_eps:
                raise ValueError("q_norm and k_norm with different eps")
            self.qk_norm = (torch.cat((q_weight.expand(heads, dim), k_weight.expand(kv_heads, dim))), eps)


class LlamaDecodeStep:
    """Decodes one token per call for B rows; owns the KV cache from the prefill on (module docstring).

    `key_mask` [B, total_len] bool marks the slots each row may attend to (False: left padding)."""

    def __init__(self, model: Any, cache: Any, rows: Tensor, key_mask: Tensor) -> None:
        self.model = model
        self.decoder = model.model
        self.layers = list(self.decoder.layers)
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.length = int(cache.layers[0].keys.shape[2])
        batch, total = key_mask.shape
        for layer_cache in cache.layers:
            k, v = layer_cache.keys, layer_cache.values  # [U, kv_heads, prompt, head_dim]
            _, heads, filled, dim = k.shape
            keys = k.new_empty((batch, heads, total, dim))
            values = v.new_empty((batch, heads, total, dim))
            keys[:, :, :filled] = k.index_select(0, rows)
            values[:, :, :filled] = v.index_select(0, rows)
            layer_cache.keys = layer_cache.values = None  # this layer of the prefill cache is no longer needed
            self.keys.append(keys)
            self.values.append(values)
        self.head_dim = self.keys[0].shape[-1]
        self.num_heads = self.layers[0].self_attn.q_proj.out_features // self.head_dim
        self.num_kv_heads = self.keys[0].shape[1]
        # rotary cos/sin of every position this decode can reach, computed once by the model's own
        # rotary module (elementwise in the position: the same values as a per-step call) and
        # gathered per step by the rows' positions
        # (default RoPE only: dynamic variants rescale with the longest position seen so far)
        embed = self.decoder.embed_tokens.weight
        self.table: Tensor | None = None
        if getattr(self.decoder.rotary_emb, "rope_type", None) == "default":
            cos, sin = self.decoder.rotary_emb(
                embed, torch.arange(total, device=embed.device)[None]
            )  # [1, total, D] each
            self.table = torch.cat((cos[0], self._signed(sin[0])), dim=-1)  # [total, 2D]: cos | sin±
        self.lean = (
            all(p.dtype == torch.float32 for p in model.parameters())
            and self.keys[0].dtype == torch.float32
            and not torch.is_autocast_enabled(embed.device.type)
        )
        self.lean_layers: list[_LeanLayer] = []
        if self.lean:
            try:
                self.lean_layers = [
                    _LeanLayer(layer, self.num_heads, self.num_kv_heads, self.head_dim) for layer in self.layers
                ]
                self.final_norm = _norm_args(self.decoder.norm)
            except ValueError:  # norms of another kind: the modules variant calls them as they are
                self.lean = False
        if self.lean:  # additive mask, one row per (row, kv head) of the batched matmul: B·kv_heads·total·4 bytes
            bias = torch.zeros((batch, total), dtype=torch.float32, device=embed.device).masked_fill_(
                ~key_mask, float("-inf")
            )
            self.mask = bias.repeat_interleave(self.num_kv_heads, dim=0)[:, None, :]
        else:
            self.mask = key_mask[:, None, None, :]  # SDPA's boolean mask [B, 1, 1, total]

    @property
    def num_rows(self) -> int:
        """Rows B (or R after `keep_rows`) each call decodes."""
        return int(self.keys[0].shape[0])

    def keep_rows(self, rows: Tensor) -> None:
        """Keep only `rows` [R] (int64 indices into the current rows, in the order given) of the cache and mask."""
        for i in range(len(self.keys)):  # one layer's K or V at a time: the old tensor is freed on reassignment
            self.keys[i] = self.keys[i].index_select(0, rows)
            self.values[i] = self.values[i].index_select(0, rows)
        if self.lean:  # [B·kv_heads, 1, total]: the kv_heads rows of a batch row are adjacent (repeat_interleave)
            total = self.mask.shape[-1]
            self.mask = self.mask.view(-1, self.num_kv_heads, total).index_select(0, rows).view(-1, 1, total)
        else:
            self.mask = self.mask.index_select(0, rows)  # [B, 1, 1, total] bool

    def _signed(self, sin: Tensor) -> Tensor:
        """sin± [..., D]: sin with its first half negated, so that rotate_half(x)·sin == roll(x, D/2)·sin±."""
        half = sin.shape[-1] // 2
        return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    def _rope(self, h: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin±) of each row's position, [B, 1, D] each."""
        if self.table is not None:
            rows = self.table.index_select(0, positions.reshape(-1))[:, None]
            return rows[..., : self.head_dim], rows[..., self.head_dim :]
        cos, sin = self.decoder.rotary_emb(h, positions)  # [B, 1, D]
        return cos, self._signed(sin)

    def __call__(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Logits [B, V] of the next token after `tokens` [B] at `positions` [B, 1]."""
        logits = self._lean(tokens, positions) if self.lean else self._modules(tokens, positions)
        self.length += 1
        return logits

    def _lean(self, tokens: Tensor, positions: Tensor) -> Tensor:
        batch, slot = tokens.shape[0], self.length
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        end = slot + 1
        h = F.embedding(tokens, self.decoder.embed_tokens.weight)  # [B, hidden], the residual stream (updated in place)
        cos, sin = self._rope(h, positions)
        mask = self.mask[..., :end]  # [B·kv_heads, 1, end]
        for lay, keys, values in zip(self.lean_layers, self.keys, self.values):
            x = F.rms_norm(h, *lay.in_norm)
            qk = torch.cat((_linear(x, *lay.q), _linear(x, *lay.k)), dim=-1).view(batch, heads + kv_heads, dim)
            if lay.qk_norm is not None:
                qk = F.rms_norm(qk, (dim,), None, lay.qk_norm[1]).mul_(lay.qk_norm[0])
            qk = torch.addcmul(qk * cos, qk.roll(dim // 2, -1), sin)
            keys[:, :, slot] = qk[:, heads:]
            values[:, :, slot] = _linear(x, *lay.v).view(batch, kv_heads, dim)
            # [B·kv_heads, group, D] @ [B·kv_heads, D, end]: each KV head's group of query heads (repeat_kv's order)
            scores = torch.baddbmm(
                mask,
                qk[:, :heads].reshape(batch * kv_heads, heads // kv_heads, dim),
                keys[:, :, :end].view(batch * kv_heads, end, dim).transpose(1, 2),
                alpha=lay.scaling,
            )
            o = torch.bmm(torch.softmax(scores, dim=-1), values[:, :, :end].view(batch * kv_heads, end, dim))
            h.addmm_(o.view(batch, heads * dim), lay.o_t)
            if lay.o_bias is not None:
                h.add_(lay.o_bias)
            x = F.rms_norm(h, *lay.post_norm)
            h.addmm_(lay.act(_linear(x, *lay.gate)).mul_(_linear(x, *lay.up)), lay.down_t)
            if lay.down_bias is not None:
                h.add_(lay.down_bias)
        head = self.model.lm_head
        return F.linear(F.rms_norm(h, *self.final_norm), head.weight, head.bias)

    def _modules(self, tokens: Tensor, positions: Tensor) -> Tensor:
        batch, slot = tokens.shape[0], self.length
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        mask = self.mask[..., : slot + 1]  # [B, 1, 1, slot + 1] bool
        h = self.decoder.embed_tokens(tokens[:, None])  # [B, 1, hidden]
        cos, sin = self._rope(h, positions)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, D]: broadcast over heads
        for layer, keys, values in zip(self.layers, self.keys, self.values):
            attn, mlp = layer.self_attn, layer.mlp
            x = _rms_norm(layer.input_layernorm, h)
            q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(batch, 1, heads, dim)
            k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(batch, 1, kv_heads, dim)
            v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(batch, 1, kv_heads, dim)
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before the rotation
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            q, k = q * cos + q.roll(dim // 2, -1) * sin, k * cos + k.roll(dim // 2, -1) * sin
            keys[:, :, slot : slot + 1] = k
            values[:, :, slot : slot + 1] = v.transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q,
                keys[:, :, : slot + 1],
                values[:, :, : slot + 1],
                attn_mask=mask,
                scale=attn.scaling,
                enable_gqa=heads != kv_heads,
            )
            h = h + F.linear(o.transpose(1, 2).reshape(batch, 1, -1), attn.o_proj.weight, attn.o_proj.bias)
            x = _rms_norm(layer.post_attention_layernorm, h)
            h = h + F.linear(
                mlp.act_fn(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias))
                * F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias),
                mlp.down_proj.weight,
                mlp.down_proj.bias,
            )
        head = self.model.lm_head
        return F.linear(_rms_norm(self.decoder.norm, h), head.weight, head.bias)[:, -1]
