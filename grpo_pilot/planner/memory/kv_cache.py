"""KV cache arithmetic (vLLM paged attention and HF generate).

Bytes per token per GPU = 2 (K and V) · L · ceil(kv_heads / t) · d · bytes, where t is the tensor-
parallel size: once t exceeds kv_heads every rank holds one (replicated) kv head (memory-model.md
§3). Concurrent sequences = KV tokens // (prompt + response), capped by max_num_seqs.
"""

from __future__ import annotations

from grpo_pilot.profiles.spec import ModelSpec, kv_bytes_per_token
from grpo_pilot.units import BF16_BYTES

__all__ = ["concurrent_sequences", "kv_bytes_per_token", "kv_bytes_per_token_per_gpu", "kv_tokens"]


def kv_bytes_per_token_per_gpu(spec: ModelSpec, tp: int, kv_bytes: int = BF16_BYTES) -> int:
    """`kv_bytes_per_token` of a model's shape on one of `tp` tensor-parallel ranks."""
    return kv_bytes_per_token(
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        tensor_parallel=tp,
        kv_bytes=kv_bytes,
    )


def kv_tokens(kv_cache_bytes: int, bytes_per_token: int) -> int:
    """Tokens that fit in `kv_cache_bytes` (0 when the budget is not positive)."""
    return max(0, kv_cache_bytes) // bytes_per_token


def concurrent_sequences(tokens: int, seq_len_tokens: int, max_num_seqs: int) -> int:
    """Full-length sequences that can decode at once, capped by the scheduler limit."""
    return min(max_num_seqs, tokens // seq_len_tokens)
