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
    # The most specific model name that appears in the device name wins ("H200" over "H20" for an
    # "NVIDIA H200"), then the variant of the nearest memory size (H20 96 GB vs 141 GB, A100 40 vs 80 GB).
    matches = [spec for spec in CATALOG.values() if alias_key(spec.name.split("-")[0]) in name]
    if not matches:
        return None
    best = max(matches, key=lambda spec: (len(spec.name.split("-")[0]), -abs(spec.memory_bytes - total)))
    return parse_cluster(f"{torch.cuda.device_count()}x{best.name}")


def local_cluster(host_ram_bytes_per_node: int | None = None) -> Cluster:
    """`--gpus local`: this node's GPUs, or an `InputError` saying how to name them instead."""
    found = detect_local_cluster()
    if found is None:
        raise InputError(
            "--gpus local found no CUDA GPU here "
            "(torch with CUDA is not importable, or no device matches the catalog).",
            "Name the cluster instead, e.g. --gpus 8xA100-80G, or --gpus 1xcpu for this machine.",
        )
    return (
        found
        if host_ram_bytes_per_node is None
        else found.model_copy(update={"host_ram_bytes_per_node": host_ram_bytes_per_node})
    )
