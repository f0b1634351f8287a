"""`Cluster`: nodes × GPUs per node of one GPU model, parsed from strings like `8xA100-80G`.

Accepted forms (case-insensitive): `8xA100-80G` (one node of 8), `8xH100` (default variant),
`2x8xH100-80G` (2 nodes × 8), `16xH20` (more than 8 ⇒ nodes of 8), `Nxcpu` (N CPU worker processes on
this machine: `1xcpu` is one local process, `2xcpu` two workers over gloo — how CI and laptops run the
multi-worker engine).
"""

from __future__ import annotations

import re

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.hardware.device_traits import DeviceTraits, device_traits
from grpo_pilot.hardware.gpus import CATALOG, GiB, GPUSpec, lookup_gpu
from grpo_pilot.models import Frozen

DEFAULT_GPUS_PER_NODE = 8
MAX_COUNT_DIGITS = 7  # GPUs per node or nodes: up to 9,999,999 (int() of thousands of digits is refused)
# Host RAM assumed per node when the user does not say (--host-ram): DGX A100 ships 1 TB,
# DGX H100 2 TB; 1 TiB is the conservative common value for 8-GPU cloud nodes.
DEFAULT_HOST_RAM_BYTES = 1024 * GiB

ACCEPTED_FORMS = (
    "GPUSxNAME (8xA100-80G, 8xH100, 16xH20) or NODESxGPUSxNAME (2x8xH100-80G); Nxcpu for N CPU workers on this machine"
)


class Cluster(Frozen):
    """The machines a plan runs on."""

    gpu: GPUSpec = Field(description="The accelerator model (all GPUs alike).")
    num_nodes: int = Field(ge=1, description="Nodes.")
    gpus_per_node: int = Field(ge=1, description="GPUs per node.")
    host_ram_bytes_per_node: int = Field(gt=0, description="Host RAM per node (offload, pinned buffers).")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def device(self) -> DeviceTraits:
        """What this cluster's device kind does differently (GPU or the cpu pseudo-device)."""
        return device_traits(self.gpu)

    @property
    def device_memory_bytes(self) -> int:
        """Memory one device offers: the GPU's, or on the cpu pseudo-device the host RAM shared by its worker
        processes (`Nxcpu`: each worker gets RAM / N; `1xcpu`: the whole RAM)."""
        if self.device.offload_meaningful:
            return self.gpu.memory_bytes
        return self.host_ram_bytes_per_node // max(1, self.gpus_per_node)

    def label(self) -> str:
        nodes = f"{self.num_nodes}x" if self.num_nodes > 1 else ""
        return f"{nodes}{self.gpus_per_node}x{self.gpu.name}"


_PATTERN = re.compile(r"^\s*(?:(\d+)\s*[x×*]\s*)?(\d+)\s*[x×*]\s*([A-Za-z0-9][A-Za-z0-9_\- ]*?)\s*$", re.IGNORECASE)


def _largest_divisor(count: int) -> int:
    return max(d for d in range(1, DEFAULT_GPUS_PER_NODE + 1) if count % d == 0)


def parse_cluster(text: str, host_ram_bytes_per_node: int | None = None) -> Cluster:
    """Parse `8xA100-80G`-style strings into a `Cluster`; raises `InputError` naming accepted forms."""
    match = _PATTERN.match(text or "")
    if not match:
        raise InputError(
            f"Cannot read the cluster '{text}'.", f"Accepted forms: {ACCEPTED_FORMS}. GPU names: {', '.join(CATALOG)}."
        )
    nodes_txt, gpus_txt, name = match.groups()
    gpu = lookup_gpu(name)
    if gpu is None:
        raise InputError(
            f"Unknown GPU '{name}' in '{text}'.",
            f"Known GPUs: {', '.join(CATALOG)}, cpu. Accepted forms: {ACCEPTED_FORMS}.",
        )
    if max(len(gpus_txt), len(nodes_txt or "")) > MAX_COUNT_DIGITS:
        raise InputError(
            f"The cluster '{text[:40]}{'…' if len(text) > 40 else ''}' asks for more than "
            f"{10**MAX_COUNT_DIGITS - 1:,} GPUs or nodes.",
            f"Give real counts. Accepted forms: {ACCEPTED_FORMS}.",
        )
    count = int(gpus_txt)
    if count < 1 or (nodes_txt is not None and int(nodes_txt) < 1):
        raise InputError(
            f"The cluster '{text}' has no GPUs.", f"Use a positive count. Accepted forms: {ACCEPTED_FORMS}."
        )
    if nodes_txt is not None:
        num_nodes, per_node = int(nodes_txt), count
    elif count > DEFAULT_GPUS_PER_NODE and not gpu.is_cpu:
        if count % DEFAULT_GPUS_PER_NODE:
            raise InputError(
                f"{count} GPUs do not split into nodes of {DEFAULT_GPUS_PER_NODE}.",
                f"Say the layout explicitly, e.g. "
                f"{count // _largest_divisor(count)}x{_largest_divisor(count)}x{gpu.name}.",
            )
        num_nodes, per_node = count // DEFAULT_GPUS_PER_NODE, DEFAULT_GPUS_PER_NODE
    else:
        num_nodes, per_node = 1, count
    if gpu.is_cpu and num_nodes != 1:
        raise InputError(
            f"'{text}': cpu workers run on this one machine.", "Use Nxcpu (e.g. 2xcpu for two worker processes)."
        )
    default_host = gpu.memory_bytes if gpu.is_cpu else DEFAULT_HOST_RAM_BYTES
    host = default_host if host_ram_bytes_per_node is None else host_ram_bytes_per_node
    return Cluster(gpu=gpu, num_nodes=num_nodes, gpus_per_node=per_node, host_ram_bytes_per_node=host)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(TIB|TB|GIB|GB|MIB|MB)?\s*$", re.IGNORECASE)
_UNITS = {"TIB": 1 << 40, "TB": 10**12, "GIB": GiB, "GB": 10**9, "MIB": 1 << 20, "MB": 10**6, None: GiB}
MAX_SIZE_BYTES = 1 << 60  # 1 EiB: far beyond any node's RAM; a larger size is a typo


def parse_size_bytes(text: str, *, flag: str = "") -> int:
    """'512GiB', '2TB', '768' (GiB) → bytes; a size that is not a positive number of at most 1 EiB is an
    `InputError` naming `flag`."""
    where = f"{flag} " if flag else ""
    match = _SIZE.match(text or "")
    if not match:
        raise InputError(f"Cannot read the size {where}'{text}'.", "Write e.g. 512GiB, 2TiB or 1.5TB.")
    value, unit = match.groups()
    size = float(value) * _UNITS[unit.upper() if unit else None]  # digits only: finite, or inf past 1e308
    if not 1 <= size <= MAX_SIZE_BYTES:
        raise InputError(
            f"The size {where}'{text}' is {'zero' if size < 1 else 'larger than 1 EiB'}.",
            "Give the RAM per node, e.g. 512GiB or 2TiB.",
        )
    return int(size)
