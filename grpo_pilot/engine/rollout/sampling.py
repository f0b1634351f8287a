"""Next-token sampling on the device, shared by every decode loop of the hf backend.

    uniforms = draw_uniforms(steps, rows, generator, device)        [steps, rows, 1] fp32, drawn once per call
    token = sample_next(logits [R, V], temperature=, top_p=, top_k=, generator=, uniforms=[R, 1])    [R]
    is_end = eos_table(eos_ids, vocab, device)[token]               bool per row, without torch.isin

Rule (what transformers' warpers and vLLM's sampler compute): greedy (`temperature == 0`) is argmax;
otherwise softmax(logits / temperature), then top-k (tokens whose probability is at least the k-th
largest, ties kept: transformers' TopKLogitsWarper; 0 = off), then top-p over what top-k kept (sorted by
probability, a token is kept while the mass before it is < top_p of the kept mass; the most likely is
always kept: TopPLogitsWarper and vLLM), and one categorical draw per row by inverse CDF with one
uniform per row. No op here reads a value back to the host, so the sampler can run inside a captured
CUDA graph (static_decode.py).

Randomness: a decode call draws all its uniforms at once, `[max_new_tokens, rows]` from the caller's
`torch.Generator` (step t uses row t). On the CPU generator this is the same stream as one draw of
`rows` per step (mt19937 fills a tensor element by element; tests/engine/test_rollout_static.py checks it),
so the eager loop kept its completions when it moved to it; the eager and the static loop use the same
draws on every device, and a compacted batch keeps each row's own draw (the caller's seed fixes the
completions; the global RNG is never touched).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def sample_next(
    logits: Tensor,
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None = None,
    uniforms: Tensor | None = None,
    top_k: int = 0,
) -> Tensor:
    """One token id per row [R] from last-position logits [R, V] (rule in the module docstring).

    `uniforms` [R, 1] fp32 in [0, 1): the draws to use (None: R fresh ones from `generator`)."""
    if temperature == 0.0:
        return logits.argmax(-1)
    scaled = logits.float()  # a copy for bf16/fp16 logits (divided in place), the same tensor for fp32
    if temperature != 1.0:  # x / 1.0 == x exactly: skip the op
        scaled = scaled.div_(temperature) if scaled is not logits else scaled / temperature
    probs = torch.softmax(scaled, dim=-1)
    del scaled  # at most logits + two fp32 [B, V] tensors live at a time
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[:, -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
    order: Tensor | None = None
    if top_p < 1.0:
        kept_mass = probs.sum(-1, keepdim=True) if top_k else None  # 1 up to rounding without top-k
        probs, order = probs.sort(dim=-1, descending=True)
        mass_before = probs.cumsum(-1) - probs
        limit = top_p * kept_mass if kept_mass is not None else top_p
        probs = probs.masked_fill(mass_before >= limit, 0.0)  # column 0 has mass_before 0: always kept
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    if uniforms is None:
        uniforms = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=torch.float32)
    u = uniforms.to(cdf.dtype) * total
    # u < total strictly, so the first index with cdf > u exists and has non-zero probability
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    picked = torch.searchsorted(cdf, u, right=True)
    return (order.gather(-1, picked) if order is not None else picked).squeeze(-1)


def draw_uniforms(steps: int, rows: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """[steps, rows, 1] fp32 uniforms in [0, 1) from `generator`: one per row and token, the sampler's whole use
    of randomness in one decode call."""
    return torch.rand((steps, rows, 1), generator=generator, device=device, dtype=torch.float32)


def eos_table(eos_ids: Sequence[int], vocab_size: int, device: torch.device) -> Tensor:
    """A bool [vocab_size + 1] lookup table, True at the ids that end a completion (the extra last entry absorbs
    ids at or past the vocabulary, e.g. a pad id the model never emits)."""
    table = torch.zeros(vocab_size + 1, dtype=torch.bool)
    table[[i for i in eos_ids if 0 <= i < vocab_size]] = True
    return table.to(device)


def ends(table: Tensor, tokens: Tensor) -> Tensor:
    """`tokens` [R] that end a completion, from `eos_table` (ids past it count as not ending)."""
    return table[tokens.clamp(max=table.shape[0] - 1)]
