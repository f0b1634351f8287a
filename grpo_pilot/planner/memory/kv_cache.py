"""KV cache arithmetic (vLLM paged attention and HF generate).

Bytes per token per GPU = 2 (K and V) · L · ceil(kv_heads / t) · d · bytes, where t is the tensor-
parallel size: once t exceeds kv_heads every rank holds one (replicated) kv head (memory-model.md
§3). Concurrent sequences = KV tokens // (prompt + response), capped by max_num_seqs.
"""

from __future__ import annotations


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, tensor_parallel: int, kv_bytes: int) -> int:
    """KV-cache bytes one token occupies on one GPU of a t-way tensor-parallel replica."""
    heads_per_gpu = max(1, -(-num_kv_heads // tensor_parallel))
    return 2 * num_layers * heads_per_gpu * head_dim * kv_bytes


def kv_tokens(kv_cache_bytes: int, bytes_per_token: int) -> int:
    """Tokens that fit in `kv_cache_bytes` (0 when the budget is not positive)."""
    return max(0, kv_cache_bytes) // bytes_per_token


def concurrent_sequences(tokens: int, seq_len_tokens: int, max_num_seqs: int) -> int:
    """Full-length sequences that can decode at once, capped by the scheduler limit."""
    return min(max_num_seqs, tokens // seq_len_tokens)
