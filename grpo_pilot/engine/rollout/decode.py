"""A lean batched decode loop for a transformers causal LM: one prefill, then one forward per token.

    decode_batch(model, prompts, max_new_tokens=, eos_ids=, pad_id=, temperature=, top_p=,
                 generator=, stop=None, stop_window=None) -> list[list[int]]   raw generated ids per prompt

What it does (and what `generate` does on top of it that we do not need here):
- prompts are LEFT-padded to the longest, W tokens; a boolean key mask [B, W + max_new] marks
  the real prompt tokens and every generated slot; position ids count real tokens only;
- prefill: one forward over the U ≤ B distinct prompts [U, W] with the model's KV cache
  (`DynamicCache`), logits of the last position only (`logits_to_keep=1`); cache and logits are
  then expanded to the B rows — GRPO samples each prompt n times, so a prompt is encoded once;
- decode: one forward per token over [B, 1] with the cached keys/values and the mask prefix of the
  current length — for SDPA a ready boolean 4-D mask, so transformers builds none per step (other
  kernels get the 2-D mask: eager would add a boolean mask, flash wants 2-D). Llama-family models
  (llama, qwen2, qwen3 with SDPA) step through `llama_step.LlamaDecodeStep`: the same computation
  on the same parameters without transformers' per-token wrapping (in fp32 with fewer, fused ops and
  a hand-written one-query attention), into a KV cache allocated once, given the key mask once;
  any other model runs its own forward (with `Cache.reorder_cache` expanding the prefill's cache);
- sampling: greedy (`temperature == 0`) is argmax; otherwise softmax(logits / temperature),
  optionally cut to the top-p nucleus, and one categorical draw per row by inverse CDF with B
  uniforms from the caller's `torch.Generator` (the caller's seed fixes the completions; the global
  RNG is never touched). Nucleus rule (as transformers' TopPLogitsWarper and vLLM): tokens sorted by
  probability are kept while the mass before them is < top_p; the most likely is always kept;
- a row is finished at its first EOS id or, with a `stop` check, once the check says so for its
  last `stop_window` generated ids (None: all); the exact cut is `completion.finish_completion`'s
  job. Finished rows are fed `pad_id` (outputs ignored); the loop exits once every row is done.
Per token: one model forward, ~10 small tensor ops, and one host sync (`finished.all()`).

Memory beyond the weights (B rows, U distinct prompts, W prompt and N new tokens, c compute bytes,
V vocab): the KV cache B·(W + N)·2·L·kv_dim·c (Llama step: allocated once, the prefill's U-row
cache gathered in and freed layer by layer; its fp32 variant adds an additive mask of
B·kv_heads·(W + N)·4 bytes, negligible beside the cache; no weight matrix is copied;
DynamicCache: grows by concatenation, so while a layer's cache is extended its old and new copies
coexist for that layer), the prefill's forward over U·W tokens, and the sampling tensors B·V·(c + 4 + 4)
(logits, fp32 probabilities, their cumulative sum; top-p adds a sorted copy and its int64
indices) — planner/memory/hf_generate.py models these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from grpo_pilot.engine.rollout.llama_step import LlamaDecodeStep, unsupported_reason

StopCheck = Callable[[list[list[int]]], list[bool]]  # tails of the running rows -> "stop here" per row


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(ids [B, W], real-token mask [B, W] bool) with each prompt right-aligned in W = longest prompt."""
    width = max(len(p) for p in prompts)
    rows = [[pad_id] * (width - len(p)) + [int(t) for t in p] for p in prompts]
    real = [[False] * (width - len(p)) + [True] * len(p) for p in prompts]
    return torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(real, dtype=torch.bool, device=device)


def sample_next(logits: Tensor, *, temperature: float, top_p: float, generator: torch.Generator | None) -> Tensor:
    """One token id per row [B] from last-position logits [B, V] (see the module docstring)."""
    if temperature == 0.0:
        return logits.argmax(-1)
    scaled = logits.float()  # a copy for bf16/fp16 logits (divided in place), the same tensor for fp32
    if temperature != 1.0:  # x / 1.0 == x exactly: skip the op
        scaled = scaled.div_(temperature) if scaled is not logits else scaled / temperature
    probs = torch.softmax(scaled, dim=-1)
    del scaled  # at most logits + two fp32 [B, V] tensors live at a time
    order: Tensor | None = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        mass_before = probs.cumsum(-1) - probs
        probs = probs.masked_fill(mass_before >= top_p, 0.0)  # column 0 has mass_before 0: always kept
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype) * total
    # u < total strictly, so the first index with cdf > u exists and has non-zero probability
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    picked = torch.searchsorted(cdf, u, right=True)
    return (order.gather(-1, picked) if order is not None else picked).squeeze(-1)


def decode_batch(model: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_ids: Sequence[int], pad_id: int,
                 temperature: float, top_p: float, generator: torch.Generator | None, stop: StopCheck | None = None,
                 stop_window: int | None = None) -> list[list[int]]:
    """Generated ids per prompt (up to `max_new_tokens`; after a row finishes, `pad_id`s follow).

    `model` is a transformers causal LM in eval mode, called under no-grad by the caller. `stop`
    maps the last `stop_window` (None: all) generated ids of each still-running row to "stop here" flags.
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    # identical prompts (a GRPO group's n copies) share one prefill row; the cache is expanded after
    first: dict[tuple[int, ...], int] = {}
    inverse = torch.tensor([first.setdefault(tuple(p), len(first)) for p in prompts], dtype=torch.long, device=device)
    ids, unique_real = left_pad(list(first), pad_id, device)
    unique_positions = (unique_real.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    # prefill: causal + padding mask from the 2-D real-token mask (built once by transformers)
    logits = model(input_ids=ids, attention_mask=unique_real.long(), position_ids=unique_positions, past_key_values=cache, use_cache=True,
                   logits_to_keep=1).logits[:, -1]
    real, positions = unique_real[inverse], unique_positions[inverse]
    if len(first) < len(prompts):
        logits = logits[inverse]
    batch, width = real.shape
    key_mask = torch.ones((batch, width + max_new_tokens), dtype=torch.bool, device=device)
    key_mask[:, :width] = real
    step_mask = key_mask[:, None, None, :] if getattr(model.config, "_attn_implementation", None) == "sdpa" else key_mask.long()
    # Llama-family decoders step without transformers' per-token wrapping (llama_step.py); it
    # gathers the prefill's keys and values into its own buffers
    fast = LlamaDecodeStep(model, cache, inverse, key_mask) if unsupported_reason(model) is None else None
    if fast is None and len(first) < len(prompts):
        cache.reorder_cache(inverse)  # index_select on the batch dim of every layer's keys and values
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device)
    out = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    last = positions[:, -1:]
    steps = 0  # max_new_tokens >= 1 (SamplingConfig), so at least one token is drawn
    for step in range(max_new_tokens):
        token = sample_next(logits, temperature=temperature, top_p=top_p, generator=generator)
        token = token.masked_fill(finished, pad_id)
        out[:, step] = token
        steps = step + 1
        finished |= torch.isin(token, eos)
        if stop is not None:
            running = (~finished).nonzero().flatten().tolist()
            hits = stop(out[running, max(0, steps - (stop_window or steps)) : steps].tolist()) if running else []
            for row, hit in zip(running, hits):
                if hit:
                    finished[row] = True
        if steps == max_new_tokens or bool(finished.all()):
            break
        last = last + 1
        if fast is not None:
            logits = fast(token, last)
        else:
            logits = model(input_ids=token[:, None], attention_mask=step_mask[..., : width + steps], position_ids=last, past_key_values=cache,
                           use_cache=True).logits[:, -1]
    return out[:, :steps].tolist()
