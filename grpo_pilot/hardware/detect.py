"""Detect local GPUs (only when torch with CUDA is importable; the planner never needs it)."""

from __future__ import annotations

from grpo_pilot.hardware.cluster import Cluster, parse_cluster
from grpo_pilot.hardware.gpus import CATALOG, alias_key


def detect_local_cluster() -> Cluster | None:
    """The local node as a `Cluster` (matched to the catalog by name and memory), or None without CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    props = torch.cuda.get_device_properties(0)
    name = alias_key(props.name)
    total = props.total_memory
    best = None
    for spec in CATALOG.values():
        core = alias_key(spec.name.split("-")[0])
        if core in name and (best is None or abs(spec.memory_bytes - total) < abs(best.memory_bytes - total)):
            best = spec
    if best is None:
        return None
    return parse_cluster(f"{torch.cuda.device_count()}x{best.name}")
