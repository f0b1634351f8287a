"""Sharded model states under FSDP / ZeRO-3 over D ranks (ZeRO paper's 16Ψ for mixed-precision Adam).

Per GPU: master params `m·P/D`, grads `g·P/D`, Adam moments `8·P/D` (m = g = 4 bytes in every target
here, see `precision`). Reference params `r·P/D` (bf16 or fp32 by target). Shards are rounded up:
FSDP pads every flat parameter to a multiple of D, so a rank never holds less than ceil(P/D).
"""

from __future__ import annotations


def shard_elements(num_elements: int, shard_degree: int) -> int:
    """Elements one rank holds of a tensor (or model) sharded D ways: ceil(n / D)."""
    return -(-num_elements // shard_degree)


def sharded_bytes(num_params: int, bytes_per_param: int, shard_degree: int) -> int:
    """Bytes one rank holds of `num_params` elements of `bytes_per_param` sharded D ways."""
    return shard_elements(num_params, shard_degree) * bytes_per_param


def actor_state_bytes(
    *, num_params: int, shard_degree: int, master_bytes: int, grad_bytes: int, adam_bytes: int
) -> tuple[int, int, int]:
    """(master params, grads, Adam states) bytes of one rank's shard; offload is decided by the caller."""
    shard = shard_elements(num_params, shard_degree)
    return shard * master_bytes, shard * grad_bytes, shard * adam_bytes
