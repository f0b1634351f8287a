"""A lean batched decode loop for a transformers causal LM: one prefill, then one forward per token.

    decode_batch(model, prompts, max_new_tokens=, eos_ids=, pad_id=, temperature=, top_p=,
                 generator=, stop=None, stop_window=None, compact_fraction=COMPACT_FRACTION)
        -> list[list[int]]   raw generated ids per prompt

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
- sampling (sampling.py): greedy (`temperature == 0`) is argmax; otherwise softmax(logits / temperature),
  optionally cut to the top-k and the top-p nucleus, and one categorical draw per row by inverse CDF,
  with the call's uniforms drawn at once ([max_new_tokens, B] from the caller's `torch.Generator`; each
  row keeps its own after a compaction; the global RNG is never touched);
- a row is finished at its first EOS id or, with a `stop` check, once the check says so for its
  last `stop_window` generated ids (None: all); the exact cut is `completion.finish_completion`'s
  job. A finished row's later slots in the [B, N] result hold `pad_id`; the loop exits once every
  row is done;
- compaction: GRPO completion lengths are long-tailed, so most rows finish long before the last
  one. Finished rows still in the batch are fed `pad_id` (outputs ignored) until they are at least
  `compact_fraction` (default 1/4) of the batch; then the batch keeps only its running rows (the
  Llama step's `keep_rows`, or `Cache.reorder_cache` on the DynamicCache — defined for every cache
  layer type, unlike `batch_select_indices` — plus the step mask), and `alive` maps each batch row to
  its row of the result. Why 1/4: a compaction copies the running rows' cache once (an index_select
  of each layer's K and V; the Llama step's whole preallocated W + N slots), about what a decode
  step's attention reads anyway, while every later
  step saves the dropped rows' share of its per-row work (q/k/v/o and MLP rows, attention over their
  cache, the sampling over V). Each compaction shrinks the batch by >= 4/3, so there are at most
  log_{4/3} B of them (12 for B = 32, 24 for B = 1024) and their copies total < 3x the starting
  cache (3/4 + (3/4)^2 + ...), and no step computes more than 1/4 dead rows.
  Reproducibility: every op is per row, but a BLAS picks its matmul kernel by the number of rows
  (MKL here: fp32 rows of a 3-row and a 5-row product differ in the last bits), so after a
  compaction a row's logits can differ from the uncompacted loop's by rounding — as they already
  differ between batch sizes without compaction. Each running row keeps its own uniforms, so the
  random stream is unchanged: the completions equal those of
  `compact_fraction=None` (never compact) except where a draw lands within that rounding of a
  CDF step or an argmax is tied to the last bit, and such a flip changes that row only. The tests
  check identical completions on vs off for greedy and sampling.
Per token: one model forward, ~10 small tensor ops, and one host sync (the finished count); a stop
check adds one more (its running rows' tails).

Memory beyond the weights (B rows, U distinct prompts, W prompt and N new tokens, c compute bytes,
V vocab): the KV cache B·(W + N)·2·L·kv_dim·c (Llama step: allocated once, the prefill's U-row
cache gathered in and freed layer by layer; its fp32 variant adds an additive mask of
B·kv_heads·(W + N)·4 bytes, negligible beside the cache; no weight matrix is copied;
DynamicCache: grows by concatenation, so while a layer's cache is extended its old and new copies
coexist for that layer), the prefill's forward over U·W tokens, and the sampling tensors B·V·(c + 4 + 4)
(logits, fp32 probabilities, their cumulative sum; top-p adds a sorted copy and its int64
indices) — planner/memory/hf_generate.py models these. Compaction only shrinks this: each
layer's K (then V) is replaced by its index_select of the R running rows and the old tensor freed
right after, so the transient is one layer's K or V of R rows (< 1/(2L) of the cache) on top of
the cache. The call's uniforms take N·B·4 bytes (sampling), the EOS table V + 1 bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from grpo_pilot.engine.rollout.llama_step import LlamaDecodeStep, unsupported_reason
from grpo_pilot.engine.rollout.sampling import draw_uniforms, ends, eos_table, sample_next

__all__ = [
    "COMPACT_FRACTION",
    "Prefill",
    "StopCheck",
    "decode_batch",
    "left_pad",
    "prefill",
    "sample_next",
    "should_compact",
]

COMPACT_FRACTION = 0.25  # drop finished rows once they are >= 1/4 of the batch (rule in the module docstring)
StopCheck = Callable[[list[list[int]]], list[bool]]  # tails of the running rows -> "stop here" per row


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(ids [B, W], real-token mask [B, W] bool) with each prompt right-aligned in W = longest prompt."""
    width = max(len(p) for p in prompts)
    rows = [[pad_id] * (width - len(p)) + [int(t) for t in p] for p in prompts]
    real = [[False] * (width - len(p)) + [True] * len(p) for p in prompts]
    return torch.tensor(rows, dtype=torch.long, device=device), torch.tensor(real, dtype=torch.bool, device=device)


def should_compact(num_finished: int, num_rows: int, compact_fraction: float | None) -> bool:
    """The compaction rule: drop the finished rows once they are at least `compact_fraction` of the batch."""
    return compact_fraction is not None and num_finished > 0 and num_finished >= compact_fraction * num_rows


def _step_mask(model: Any, key_mask: Tensor) -> Tensor:
    """The mask transformers' forward gets per step: SDPA a ready boolean [R, 1, 1, total], other kernels
    the 2-D mask."""
    return (
        key_mask[:, None, None, :] if getattr(model.config, "_attn_implementation", None) == "sdpa" else key_mask.long()
    )


@dataclass
class Prefill:
    """The prefill of a decode call: next-token logits [B, V] of every row, the U-row DynamicCache of the distinct
    prompts, the prefill row of every row (`inverse` [B]), the real-token mask [B, W] and positions [B, W] of the
    left-padded prompts, and the key mask [B, W + N] (prompt tokens and every generated slot)."""

    logits: Tensor
    cache: Any
    inverse: Tensor
    real: Tensor
    positions: Tensor
    key_mask: Tensor
    num_unique: int


def prefill(model: Any, prompts: Sequence[Sequence[int]], *, pad_id: int, max_new_tokens: int) -> Prefill:
    """One forward over the distinct prompts (a GRPO group's n copies share one row), with the model's own cache."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    first: dict[tuple[int, ...], int] = {}
    inverse = torch.tensor([first.setdefault(tuple(p), len(first)) for p in prompts], dtype=torch.long, device=device)
    ids, unique_real = left_pad(list(first), pad_id, device)
    unique_positions = (unique_real.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    # causal + padding mask from the 2-D real-token mask (built once by transformers)
    logits = model(
        input_ids=ids,
        attention_mask=unique_real.long(),
        position_ids=unique_positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    real, positions = unique_real[inverse], unique_positions[inverse]
    if len(first) < len(prompts):
        logits = logits[inverse]
    batch, width = real.shape
    key_mask = torch.ones((batch, width + max_new_tokens), dtype=torch.bool, device=device)
    key_mask[:, :width] = real
    return Prefill(logits, cache, inverse, real, positions, key_mask, len(first))


def decode_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    stop: StopCheck | None = None,
    stop_window: int | None = None,
    compact_fraction: float | None = COMPACT_FRACTION,
    top_k: int = 0,
) -> list[list[int]]:
    """Generated ids per prompt (up to `max_new_tokens`; after a row finishes, `pad_id`s follow).

    `model` is a transformers causal LM in eval mode, called under no-grad by the caller. `stop`
    maps the last `stop_window` (None: all) generated ids of each still-running row to "stop here" flags.
    `compact_fraction` in (0, 1]: drop finished rows from the batch once they are that share of it
    (None: never; the outputs are the same either way, see the module docstring).
    """
    if compact_fraction is not None and not 0.0 < compact_fraction <= 1.0:
        raise ValueError(f"compact_fraction must be in (0, 1] or None, got {compact_fraction}")
    device = next(model.parameters()).device
    pre = prefill(model, prompts, pad_id=pad_id, max_new_tokens=max_new_tokens)
    logits, cache, inverse, key_mask, positions = pre.logits, pre.cache, pre.inverse, pre.key_mask, pre.positions
    batch, width = pre.real.shape
    num_unique = pre.num_unique
    del pre  # it would hold the prefill's logits [B, V] through the whole loop
    step_mask = _step_mask(model, key_mask)
    # Llama-family decoders step without transformers' per-token wrapping (llama_step.py); it
    # gathers the prefill's keys and values into its own buffers
    fast = LlamaDecodeStep(model, cache, inverse, key_mask) if unsupported_reason(model) is None else None
    if fast is None and num_unique < len(prompts):
        cache.reorder_cache(inverse)  # index_select on the batch dim of every layer's keys and values
    eos = eos_table(eos_ids, logits.shape[-1], device)
    # every draw of the call at once, [max_new_tokens, B, 1] (sampling.py): each row keeps its own after compaction
    draws = draw_uniforms(max_new_tokens, batch, generator, device) if temperature != 0.0 else None
    out = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    alive = torch.arange(batch, device=device)  # the row of `out` of each row in the (compacted) batch
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    last = positions[:, -1:]
    steps = 0  # max_new_tokens >= 1 (SamplingConfig), so at least one token is drawn
    for step in range(max_new_tokens):
        compacted = len(alive) < batch
        uniforms = None if draws is None else draws[step].index_select(0, alive) if compacted else draws[step]
        token = sample_next(logits, temperature=temperature, top_p=top_p, top_k=top_k, uniforms=uniforms).masked_fill(
            finished, pad_id
        )
        if compacted:
            out[:, step].index_copy_(0, alive, token)  # a view of out's column: written in place
        else:
            out[:, step] = token
        steps = step + 1
        finished |= ends(eos, token)
        if stop is not None:
            _apply_stop(stop, out[:, max(0, steps - (stop_window or steps)) : steps], alive, finished)
        if steps == max_new_tokens:
            break
        num_finished = int(finished.sum())  # the step's one host sync
        if num_finished == len(alive):
            break
        if should_compact(num_finished, len(alive), compact_fraction):
            keep = (~finished).nonzero().flatten()
            alive, token, last = alive[keep], token[keep], last[keep]
            finished = torch.zeros(len(keep), dtype=torch.bool, device=device)
            if fast is not None:
                fast.keep_rows(keep)
            else:
                cache.reorder_cache(keep)  # index_select per layer's keys and values, the old ones freed as replaced
                key_mask = key_mask.index_select(0, keep)
                step_mask = _step_mask(model, key_mask)
        last = last + 1
        if fast is not None:
            logits = fast(token, last)
        else:
            logits = _model_step(model, token=token, mask=step_mask[..., : width + steps], positions=last, cache=cache)
    return out[:, :steps].tolist()


def _model_step(model: Any, *, token: Tensor, mask: Tensor, positions: Tensor, cache: Any) -> Tensor:
    """One decode step through the model's own forward (models the Llama step does not cover): logits [B, V]."""
    return model(
        input_ids=token[:, None], attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
    ).logits[:, -1]


def _apply_stop(stop: StopCheck, tails: Tensor, alive: Tensor, finished: Tensor) -> None:
    """Mark `finished` (in place) the running rows whose generated tail (`tails`: the result's last columns, rows
    in result order; `alive` maps batch rows to them) the stop check says to stop at."""
    running = (~finished).nonzero().flatten()
    rows = running.tolist()
    hits = stop(tails[alive[running]].tolist()) if rows else []
    for row, hit in zip(rows, hits):
        if hit:
            finished[row] = True
