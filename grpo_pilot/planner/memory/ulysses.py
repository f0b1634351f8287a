"""Ulysses sequence parallelism (degree s): all-to-all buffers.

Tokens are split across s ranks (handled in `tokens`: activations and logits scale with T / s).
Around attention each rank exchanges q, k, v (before) and the attention output (after) with an
all-to-all; the send and receive buffers of the q/k/v exchange are live together: 2 × c × T_rank ×
(q_dim + 2·kv_dim) bytes (DeepSpeed-Ulysses, arXiv 2309.14509, §3: activations re-partitioned from
sequence to heads). Zero when s = 1.
"""

from __future__ import annotations


def all_to_all_buffer_bytes(
    *, tokens_per_rank: int, q_dim: int, kv_dim: int, compute_bytes: int, ulysses_sp: int
) -> int:
    """Send + receive buffers of the q/k/v all-to-all of one layer (0 without sequence parallelism)."""
    if ulysses_sp <= 1:
        return 0
    return 2 * compute_bytes * tokens_per_rank * (q_dim + 2 * kv_dim)
