"""A shape-stable decode step for Llama-family decoders: preallocated buffers, no host reads, CUDA-graph-ready.

    weights = DecodeWeights(model, dtype)      the step's weights: the model's own tensors, or a copy in `dtype`
    weights.refresh(model)                     copy the model's current values in place (addresses kept)
    step = StaticStep(model, weights, rows=B, total_len=T)      K/V buffers [B, kv_heads, T, D] per layer (zeros)
    step.load_prefill(cache, rows, key_mask [B, T], positions [B])   the prefill's DynamicCache gathered in
    logits = step.forward(length)              [B, V]; feeds `step.tokens` at `step.positions` into cache slot
                                               `step.slot` (device scalars), attends over the first `length`
                                               slots, then advances positions and slot by one
    step.keep_rows(rows [R])                   new buffers with those rows only (finished rows dropped)

The computation is `llama_step.LlamaDecodeStep`'s (the same formulas on the same parameters; see that
module for what a layer does), with what a captured CUDA graph needs (static_decode.py): every tensor the
step reads or writes is a buffer allocated once (tokens, positions, the slot index, the key mask, K and V)
and updated in place; the cache slot is a device index (`index_copy_`), not a Python int; attention runs
over a fixed `length` of slots (a multiple of the caller's length bucket) with the slots past the current
one masked out (their K and V are zeros, so the masked products are exact zeros); nothing reads a
value back to the host. Two arithmetic variants, as in llama_step:
- lean (fp32 weights): `F.rms_norm`, q and k rotated together, the one-query GQA attention by hand on an
  additive mask, residual adds fused into `addmm_` — on the CPU bit for bit the eager lean step whenever
  `length` equals the filled slots;
- half (bf16 / fp16 weights): transformers' own RMSNorm arithmetic (fp32 statistics, the weight times the
  input-dtype result: Qwen2RMSNorm / LlamaRMSNorm.forward) and SDPA on a boolean mask, with GQA as SDPA over
  the KV heads and each head's group of query heads as its query length — transformers' `enable_gqa` /
  `repeat_kv` would copy every layer's K and V group-size times per step (8x for Qwen2.5-3B), which at
  decode time reads more memory than the weights do. Equal to transformers' bf16 forward up to bf16
  rounding (another kernel shape), not bit for bit.

RoPE: a [total_len, 2·D] cos | sin± table from the model's rotary module, built once for every rope type
whose cos / sin depend on the position only (every type but the dynamic ones, which rescale with the
longest position seen: `transformers.modeling_rope_utils.dynamic_rope_update`); `table_unsupported` names
the others, which the caller decodes eagerly.

Weights (`DecodeWeights`): on CUDA the rollout decodes from a bf16 copy of the fp32 master weights
(2 bytes per parameter, `copy_bytes`) instead of casting every weight under autocast at every step
(6 bytes read and written per parameter and step, beside the 2 the matmul reads); `refresh` copies the
trainer's new values into the same tensors at each weight sync, so captured graphs stay valid. With the
weights already in `dtype` (CPU fp32, or a bf16 replica) nothing is copied. Tied embeddings share one
tensor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo_pilot.engine.rollout.llama_step import unsupported_reason

DYNAMIC_ROPE = ("dynamic", "longrope")  # rope types whose inv_freq changes with the sequence length


def table_unsupported(model: Any) -> str | None:
    """Why `StaticStep` cannot decode `model` (None: it can)."""
    reason = unsupported_reason(model)
    if reason is not None:
        return reason
    rope_type = str(getattr(model.model.rotary_emb, "rope_type", "default"))
    if any(kind in rope_type for kind in DYNAMIC_ROPE):
        return f"rope type {rope_type!r} rescales with the sequence length (no fixed cos/sin table)"
    return None


class DecodeWeights:
    """The decode step's weight tensors, keyed by the identity of the model's parameters (module docstring)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._by_id: dict[int, Tensor] = {}
        self.copy_bytes = 0
        with torch.no_grad():
            for param in model.parameters():  # tied parameters are one object: one copy
                tensor = param.detach()
                if tensor.dtype != dtype:
                    tensor = tensor.to(dtype)
                    self.copy_bytes += tensor.numel() * tensor.element_size()
                self._by_id[id(param)] = tensor

    def __call__(self, param: Tensor | None) -> Tensor | None:
        return None if param is None else self._by_id[id(param)]

    def refresh(self, model: torch.nn.Module) -> None:
        """Copy the model's current parameter values into the copies (in place; aliases need nothing)."""
        with torch.no_grad():
            for param in model.parameters():
                mine = self._by_id[id(param)]
                if mine.data_ptr() != param.data_ptr():
                    mine.copy_(param.detach())


def _hf_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' Qwen2RMSNorm / LlamaRMSNorm.forward: fp32 statistics, the weight times the input-dtype result."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class _Layer:
    """One layer's tensors and constants, from the model's modules and the decode weights."""

    def __init__(self, layer: Any, w: DecodeWeights, *, heads: int, kv_heads: int, dim: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.in_norm, self.post_norm = w(layer.input_layernorm.weight), w(layer.post_attention_layernorm.weight)
        self.in_eps = float(layer.input_layernorm.variance_epsilon)
        self.post_eps = float(layer.post_attention_layernorm.variance_epsilon)
        self.q, self.k, self.v, self.o = (
            (w(p.weight), w(p.bias)) for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        )
        self.gate, self.up, self.down = ((w(p.weight), w(p.bias)) for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        self.act = F.silu if type(mlp.act_fn).__name__ in ("SiLUActivation", "SiLU") else mlp.act_fn
        self.scaling = float(attn.scaling)
        self.qk_norm: tuple[Tensor, float] | None = None  # Qwen3: [heads + kv_heads, D] weight table, eps
        if hasattr(attn, "q_norm"):
            q_w, k_w = w(attn.q_norm.weight), w(attn.k_norm.weight)
            self.qk_norm = (
                torch.cat((q_w.expand(heads, dim), k_w.expand(kv_heads, dim))),
                float(attn.q_norm.variance_epsilon),
            )
            self.q_norm, self.k_norm = q_w, k_w


def _lin(x: Tensor, wb: tuple[Tensor, Tensor | None]) -> Tensor:
    return F.linear(x, wb[0], wb[1])


class StaticStep:
    """Decodes one token per call for B rows into preallocated buffers (module docstring)."""

    def __init__(self, model: Any, weights: DecodeWeights, *, rows: int, total_len: int) -> None:
        decoder = model.model
        embed = weights(decoder.embed_tokens.weight)
        device, dtype = embed.device, weights.dtype
        first = decoder.layers[0].self_attn
        self.head_dim = int(
            getattr(first, "head_dim", 0) or model.config.hidden_size // model.config.num_attention_heads
        )
        self.num_heads = first.q_proj.out_features // self.head_dim
        self.num_kv_heads = first.k_proj.out_features // self.head_dim
        self.embed, self.final_norm = embed, weights(decoder.norm.weight)
        self.final_eps = float(decoder.norm.variance_epsilon)
        self.head = (weights(model.lm_head.weight), weights(model.lm_head.bias))
        self.layers = [
            _Layer(layer, weights, heads=self.num_heads, kv_heads=self.num_kv_heads, dim=self.head_dim)
            for layer in decoder.layers
        ]
        self.lean = dtype == torch.float32
        self.total_len = total_len
        cos, sin = decoder.rotary_emb(embed, torch.arange(total_len, device=device)[None])  # [1, T, D] each
        half = self.head_dim // 2
        self.table = torch.cat((cos[0], -sin[0, :, :half], sin[0, :, half:]), dim=-1)  # [T, 2D]: cos | sin±
        self.cols = torch.arange(total_len, device=device)
        self._allocate(rows, device, dtype)

    def _allocate(self, rows: int, device: torch.device, dtype: torch.dtype) -> None:
        shape = (rows, self.num_kv_heads, self.total_len, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers]
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.key_mask = torch.ones((rows, self.total_len), dtype=torch.bool, device=device)

    @property
    def num_rows(self) -> int:
        return int(self.tokens.shape[0])

    def load_prefill(self, cache: Any, rows: Tensor, key_mask: Tensor, positions: Tensor) -> None:
        """Gather the prefill's K/V (U distinct prompts, `rows` [B] the prefill row of each decoded row) into the
        buffers, layer by layer (each prefill layer released once copied); the rows' key mask and the position of
        the first token they will be fed; the slot is the prompt width."""
        for i, layer_cache in enumerate(cache.layers):
            k, v = layer_cache.keys, layer_cache.values  # [U, kv_heads, W, D]
            filled = k.shape[2]
            self.keys[i][:, :, :filled] = k.index_select(0, rows)
            self.values[i][:, :, :filled] = v.index_select(0, rows)
            layer_cache.keys = layer_cache.values = None
        self.key_mask.copy_(key_mask)
        self.positions.copy_(positions)
        self.slot.fill_(filled)

    def keep_rows(self, rows: Tensor) -> None:
        """Keep only `rows` [R] of every buffer (new tensors of R rows; each old one freed as it is replaced)."""
        for i in range(len(self.layers)):
            self.keys[i] = self.keys[i].index_select(0, rows)
            self.values[i] = self.values[i].index_select(0, rows)
        self.tokens = self.tokens.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)
        self.key_mask = self.key_mask.index_select(0, rows)

    def forward(self, length: int) -> Tensor:
        """Logits [B, V] after feeding `tokens`; attends over slots [0, length) of which those > slot are masked."""
        valid = self.key_mask[:, :length] & (self.cols[:length] <= self.slot)  # [B, length]
        rope = self.table.index_select(0, self.positions)[:, None]  # [B, 1, 2D]
        cos, sin = rope[..., : self.head_dim], rope[..., self.head_dim :]
        logits = self._lean(valid, cos, sin, length) if self.lean else self._half(valid, cos, sin, length)
        self.positions.add_(1)
        self.slot.add_(1)
        return logits

    def _write(self, keys: Tensor, values: Tensor, k: Tensor, v: Tensor) -> None:
        """K and V [B, kv_heads, D] of the fed token into the cache slot `self.slot`."""
        keys.index_copy_(2, self.slot, k.unsqueeze(2))
        values.index_copy_(2, self.slot, v.unsqueeze(2))

    def _lean(self, valid: Tensor, cos: Tensor, sin: Tensor, length: int) -> Tensor:
        batch, heads, kv_heads, dim = self.num_rows, self.num_heads, self.num_kv_heads, self.head_dim
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device).masked_fill_(~valid, float("-inf"))
        mask = bias.repeat_interleave(kv_heads, dim=0)[:, None, :]  # [B·kv_heads, 1, length]
        h = F.embedding(self.tokens, self.embed)  # [B, hidden], the residual stream (updated in place)
        for lay, keys, values in zip(self.layers, self.keys, self.values):
            x = F.rms_norm(h, (h.shape[-1],), lay.in_norm, lay.in_eps)
            qk = torch.cat((_lin(x, lay.q), _lin(x, lay.k)), dim=-1).view(batch, heads + kv_heads, dim)
            if lay.qk_norm is not None:
                qk = F.rms_norm(qk, (dim,), None, lay.qk_norm[1]).mul_(lay.qk_norm[0])
            qk = torch.addcmul(qk * cos, qk.roll(dim // 2, -1), sin)
            self._write(keys, values, qk[:, heads:], _lin(x, lay.v).view(batch, kv_heads, dim))
            scores = torch.baddbmm(
                mask,
                qk[:, :heads].reshape(batch * kv_heads, heads // kv_heads, dim),
                keys[:, :, :length].view(batch * kv_heads, length, dim).transpose(1, 2),
                alpha=lay.scaling,
            )
            o = torch.bmm(torch.softmax(scores, dim=-1), values[:, :, :length].view(batch * kv_heads, length, dim))
            h.addmm_(o.view(batch, heads * dim), lay.o[0].t())
            if lay.o[1] is not None:
                h.add_(lay.o[1])
            x = F.rms_norm(h, (h.shape[-1],), lay.post_norm, lay.post_eps)
            h.addmm_(lay.act(_lin(x, lay.gate)).mul_(_lin(x, lay.up)), lay.down[0].t())
            if lay.down[1] is not None:
                h.add_(lay.down[1])
        return F.linear(F.rms_norm(h, (h.shape[-1],), self.final_norm, self.final_eps), *self.head)

    def _half(self, valid: Tensor, cos: Tensor, sin: Tensor, length: int) -> Tensor:
        batch, heads, kv_heads, dim = self.num_rows, self.num_heads, self.num_kv_heads, self.head_dim
        mask = valid[:, None, None, :]  # SDPA's boolean mask [B, 1, 1, length]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, D]: broadcast over heads
        h = F.embedding(self.tokens, self.embed)[:, None]  # [B, 1, hidden]
        for lay, keys, values in zip(self.layers, self.keys, self.values):
            x = _hf_rms_norm(h, lay.in_norm, lay.in_eps)
            q = _lin(x, lay.q).view(batch, 1, heads, dim)
            k = _lin(x, lay.k).view(batch, 1, kv_heads, dim)
            v = _lin(x, lay.v).view(batch, 1, kv_heads, dim)
            if lay.qk_norm is not None:  # Qwen3: RMSNorm over each head before the rotation
                eps = lay.qk_norm[1]
                q, k = _hf_rms_norm(q, lay.q_norm, eps), _hf_rms_norm(k, lay.k_norm, eps)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, heads, 1, D]
            q, k = q * cos + q.roll(dim // 2, -1) * sin, k * cos + k.roll(dim // 2, -1) * sin
            self._write(keys, values, k[:, :, 0], v[:, 0])
            # GQA without repeating K/V: each KV head's group of query heads is SDPA's query length (the group's
            # queries share that head's keys and mask), [B, kv_heads, group, D] against [B, kv_heads, length, D]
            o = F.scaled_dot_product_attention(
                q.reshape(batch, kv_heads, heads // kv_heads, dim), keys[:, :, :length], values[:, :, :length],
                attn_mask=mask, scale=lay.scaling,
            )  # fmt: skip
            h = h + _lin(o.reshape(batch, 1, heads * dim), lay.o)
            x = _hf_rms_norm(h, lay.post_norm, lay.post_eps)
            h = h + _lin(lay.act(_lin(x, lay.gate)) * _lin(x, lay.up), lay.down)
        return F.linear(_hf_rms_norm(h, self.final_norm, self.final_eps), *self.head)[:, -1]
