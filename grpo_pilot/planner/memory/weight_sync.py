"""Trainer → rollout-engine weight sync working set.

verl (fsdp_workers.rollout_mode) walks the sharded state dict and calls `full_tensor()` on one
parameter at a time, casting it for vLLM and packing it into a transfer bucket (2 GiB); vLLM's
weights are resumed first. So beyond what both sides hold, the sync needs the bucket plus the
largest full tensor in the master dtype and its compute-dtype copy (memory-model.md §3).
The largest tensor of a decoder LM is the embedding / lm_head (V·h), else an MLP matrix (h·I) or
the query projection (h·q_dim).
"""

from __future__ import annotations


def largest_param_elements(vocab: int, hidden: int, intermediate: int, q_dim: int) -> int:
    """Elements of the largest single parameter tensor."""
    return max(vocab * hidden, hidden * intermediate, hidden * q_dim)


def largest_gathered_bytes(elements: int, master_bytes: int, compute_bytes: int) -> int:
    """The largest parameter gathered in full (master dtype) plus its cast for the engine."""
    cast = compute_bytes * elements if compute_bytes != master_bytes else 0
    return master_bytes * elements + cast
