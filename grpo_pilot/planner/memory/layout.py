"""Which GPUs train and which roll out: colocated (hybrid engine) vs split pools.

- colocated: every GPU trains (FSDP degree D = world size) and hosts a vLLM shard.
- split: per node, `split_rollout_gpus_per_node` GPUs (0 = half the node, rounded down, at least 1)
  serve rollout only; the rest train, so D = nodes × (gpus_per_node − rollout GPUs per node).
  A split that leaves no training GPU is reported with D = 1 (the divisibility constraints flag it;
  the estimator never divides by zero).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple


class Layout(NamedTuple):
    trainer_gpus: int  # D: FSDP shard degree of actor and reference
    trainer_gpus_per_node: int
    rollout_gpus_per_node: int  # GPUs per node that hold a vLLM shard
    split: bool


@lru_cache(maxsize=256)  # pure and called several times per assessment (the search's inner loop)
def layout_for(num_nodes: int, gpus_per_node: int, placement: str, split_rollout_gpus_per_node: int) -> Layout:
    """Resolve the placement knob into GPU counts (see module docstring)."""
    if placement != "split":
        return Layout(num_nodes * gpus_per_node, gpus_per_node, gpus_per_node, False)
    rollout = split_rollout_gpus_per_node or max(1, gpus_per_node // 2)
    rollout = min(rollout, gpus_per_node)
    trainer_per_node = gpus_per_node - rollout
    return Layout(max(1, num_nodes * trainer_per_node), max(1, trainer_per_node), rollout, True)
