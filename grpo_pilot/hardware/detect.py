"""Detect local GPUs (only when torch with CUDA is importable; the planner never needs it)."""

from __future__ import annotations

from grpo_pilot.errors import InputError
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


def local_cluster(host_ram_bytes_per_node: int | None = None) -> Cluster:
    """`--gpus local`: this node's GPUs, or an `InputError` saying how to name them instead."""
    found = detect_local_cluster()
    if found is None:
        raise InputError(
            "--gpus local found no CUDA GPU here (torch with CUDA is not importable, or no device matches the catalog).",
            "Name the cluster instead, e.g. --gpus 8xA100-80G, or --gpus 1xcpu for this machine.",
        )
    return (
        found
        if host_ram_bytes_per_node is None
        else found.model_copy(update={"host_ram_bytes_per_node": host_ram_bytes_per_node})
    )
