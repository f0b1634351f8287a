"""Rollout on the policy itself (rollout_backend = "hf": engine/rollout/decode.py's loop).

No second copy of the weights and no vLLM budget: the policy generates for a batch of
B = min(max_num_seqs, responses this rank owns per step) sequences. Per GPU:
- KV cache of the batch: B × (prompt + response) × 2·L·kv_dim·c (the Llama-family step's buffers,
  allocated once; transformers' DynamicCache otherwise, no paging);
- prefill working set: B × prompt tokens through one layer at a time (forward only, nothing saved),
  per token as in `vllm_budget.forward_bytes_per_token` with t = 1 — an upper bound: the engine
  prefills each distinct prompt once (B / n rows for GRPO groups of n) and copies its cache to the
  B rows;
- sampling: only the last position's logits (logits_to_keep = 1), softmax in fp32:
  B × V × (c + 4 + 4) bytes (logits, fp32 probabilities, their cumulative sum; top-p < 1 adds the
  sort, not counted here).
"""

from __future__ import annotations

from grpo_pilot.units import FP32_BYTES

from typing import NamedTuple

FP32 = FP32_BYTES


class HfGenerate(NamedTuple):
    batch_seqs: int
    kv_cache_bytes: int
    kv_cache_tokens: int
    prefill_bytes: int
    sampling_bytes: int


def hf_generate_memory(
    batch_seqs: int,
    prompt_tokens: int,
    response_tokens: int,
    kv_bytes_per_token: int,
    prefill_bytes_per_token: int,
    vocab: int,
    compute_bytes: int,
) -> HfGenerate:
    """Memory of one HF `generate` call over `batch_seqs` sequences on one GPU."""
    tokens = batch_seqs * (prompt_tokens + response_tokens)
    return HfGenerate(
        batch_seqs=batch_seqs,
        kv_cache_bytes=tokens * kv_bytes_per_token,
        kv_cache_tokens=tokens,
        prefill_bytes=batch_seqs * prompt_tokens * prefill_bytes_per_token,
        sampling_bytes=batch_seqs * vocab * (compute_bytes + 2 * FP32),
    )
