"""What a machine is: GPU catalog, cluster strings, local detection."""

from grpo_pilot.hardware.cluster import ACCEPTED_FORMS, Cluster, parse_cluster, parse_size_bytes
from grpo_pilot.hardware.gpus import CATALOG, GPUSpec, cpu_spec, lookup_gpu

__all__ = [
    "ACCEPTED_FORMS",
    "CATALOG",
    "Cluster",
    "GPUSpec",
    "cpu_spec",
    "lookup_gpu",
    "parse_cluster",
    "parse_size_bytes",
]
