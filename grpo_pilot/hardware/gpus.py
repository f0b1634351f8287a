"""`GPUSpec` and the catalog of accelerators users rent.

Figures are vendor datasheet numbers (dense, i.e. without 2:4 sparsity) unless noted:
- memory_bytes: the total the driver reports (nvidia-smi "MiB" total; datasheet GB for the rest).
- bf16_flops: dense BF16 tensor-core peak with FP32 accumulate.
- hbm_bytes_per_s: peak memory bandwidth.
- link_bytes_per_s: one direction of the GPU's intra-node link (NVLink/xGMI aggregate ÷ 2, or PCIe x16).
"""

from __future__ import annotations

import os

from pydantic import Field

from grpo_pilot.models import Frozen

GiB = 1 << 30
MiB = 1 << 20
GB = 10**9
TFLOPS = 10**12
PCIE4_X16 = 32 * GB  # PCIe 4.0 x16, one direction
PCIE5_X16 = 64 * GB  # PCIe 5.0 x16, one direction


class GPUSpec(Frozen):
    """One accelerator model."""

    name: str = Field(description="Canonical catalog name, e.g. 'A100-80G'.")
    memory_bytes: int = Field(gt=0, description="Device memory the driver reports.")
    bf16_flops: float = Field(gt=0, description="Dense BF16 peak, FLOP/s.")
    hbm_bytes_per_s: float = Field(gt=0, description="Peak device-memory bandwidth, bytes/s.")
    link_bytes_per_s: float = Field(gt=0, description="Intra-node GPU-GPU bandwidth, one direction, bytes/s.")
    source: str = Field(description="Where the figures come from.")
    is_cpu: bool = Field(default=False, description="The `cpu` pseudo-device (local runs, fp32).")


def _g(name: str, mem: int, tflops: float, hbm_gb_s: float, link: float, source: str) -> GPUSpec:
    return GPUSpec(name=name, memory_bytes=mem, bf16_flops=tflops * TFLOPS, hbm_bytes_per_s=hbm_gb_s * GB, link_bytes_per_s=link, source=source)


CATALOG: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        _g("A100-40G", 40960 * MiB, 312, 1555, 300 * GB, "NVIDIA A100 datasheet (SXM4 40GB): 312 TF BF16, 1555 GB/s, NVLink3 600 GB/s bidirectional"),
        _g("A100-80G", 81920 * MiB, 312, 2039, 300 * GB, "NVIDIA A100 datasheet (SXM4 80GB): 312 TF BF16, 2039 GB/s, NVLink3 600 GB/s bidirectional"),
        _g("H100-80G", 81559 * MiB, 989, 3350, 450 * GB, "NVIDIA H100 datasheet (SXM5): 989 TF BF16 dense, 3.35 TB/s, NVLink4 900 GB/s bidirectional"),
        _g("H100-PCIE", 81559 * MiB, 756, 2000, PCIE5_X16, "NVIDIA H100 datasheet (PCIe): 756 TF BF16 dense, 2.0 TB/s, PCIe 5.0 x16"),
        _g("H800", 81559 * MiB, 989, 3350, 200 * GB, "NVIDIA H800 SXM: H100 compute, NVLink 400 GB/s bidirectional"),
        _g("H20", 97871 * MiB, 148, 4000, 450 * GB, "NVIDIA H20 product brief: 148 TF BF16, 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s"),
        _g("H200", 143771 * MiB, 989, 4800, 450 * GB, "NVIDIA H200 datasheet (SXM): 989 TF BF16 dense, 141 GB at 4.8 TB/s, NVLink 900 GB/s"),
        _g("B200", 183359 * MiB, 2250, 8000, 900 * GB, "NVIDIA HGX B200 datasheet: 2.25 PF BF16 dense per GPU, 180 GB at 8 TB/s, NVLink5 1.8 TB/s"),
        _g("L40S", 46068 * MiB, 362, 864, PCIE4_X16, "NVIDIA L40S datasheet: 362 TF BF16 dense, 48 GB GDDR6 at 864 GB/s, PCIe 4.0"),
        _g("L4", 23034 * MiB, 121, 300, PCIE4_X16, "NVIDIA L4 datasheet: 121 TF BF16 dense, 24 GB at 300 GB/s, PCIe 4.0"),
        _g("A10G", 23028 * MiB, 70, 600, PCIE4_X16, "AWS G5 (A10G): 24 GB at 600 GB/s; ~70 TF BF16 dense (A10's 125 TF at A10G clocks)"),
        _g("A6000", 49140 * MiB, 155, 768, PCIE4_X16, "NVIDIA RTX A6000 datasheet: 309.7 TF BF16 sparse = 154.8 dense, 768 GB/s"),
        _g("RTX3090", 24576 * MiB, 71, 936, PCIE4_X16, "NVIDIA Ampere GA102 whitepaper: 71 TF BF16 (FP32 acc) dense, 936 GB/s"),
        _g("RTX4090", 24564 * MiB, 165, 1008, PCIE4_X16, "NVIDIA Ada whitepaper: 165.2 TF BF16 (FP32 acc) dense, 1008 GB/s"),
        _g("RTX5090", 32607 * MiB, 209, 1792, PCIE5_X16, "NVIDIA Blackwell GeForce whitepaper: 209.5 TF BF16 (FP32 acc) dense, 1792 GB/s"),
        _g("MI300X", 196592 * MiB, 1307, 5300, 448 * GB, "AMD Instinct MI300X datasheet: 1307 TF BF16 dense, 192 GB at 5.3 TB/s, Infinity Fabric 896 GB/s"),
    ]
}

# Names users type, mapped to catalog names (case-insensitive; '-', '_' and spaces ignored).
ALIASES: dict[str, str] = {
    "A100": "A100-80G", "A10080G": "A100-80G", "A10040G": "A100-40G", "A10080GB": "A100-80G", "A10040GB": "A100-40G",
    "H100": "H100-80G", "H10080G": "H100-80G", "H10080GB": "H100-80G", "H100SXM": "H100-80G", "H100SXM80G": "H100-80G",
    "H100PCIE": "H100-PCIE", "H100PCIE80G": "H100-PCIE",
    "H800": "H800", "H80080G": "H800", "H20": "H20", "H2096G": "H20",
    "H200": "H200", "H200141G": "H200", "B200": "B200", "B200180G": "B200", "B200192G": "B200",
    "L40S": "L40S", "L40S48G": "L40S", "L4": "L4", "L424G": "L4", "A10G": "A10G", "A10G24G": "A10G",
    "A6000": "A6000", "RTXA6000": "A6000", "3090": "RTX3090", "RTX3090": "RTX3090", "4090": "RTX4090", "RTX4090": "RTX4090",
    "5090": "RTX5090", "RTX5090": "RTX5090", "MI300X": "MI300X", "MI300X192G": "MI300X",
}


def alias_key(text: str) -> str:
    return "".join(ch for ch in text.upper() if ch.isalnum())


def cpu_spec() -> GPUSpec:
    """The `cpu` pseudo-device: this machine's RAM and a peak from its cores.

    Peak fp32 FLOP/s = cores × 3 GHz × 64 FLOP/cycle (two AVX-512 FMA units × 16 fp32 lanes × 2);
    memory bandwidth 20 GB/s is a typical single-socket share for a small VM. Real CPU runs reach a
    small fraction of that: the engine's measurements, not these numbers, are what count on CPU.
    """
    cores = os.cpu_count() or 1
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 16 * GiB
    return GPUSpec(
        name="cpu", memory_bytes=int(ram), bf16_flops=cores * 3e9 * 64, hbm_bytes_per_s=20 * GB,
        link_bytes_per_s=10 * GB, source=f"this machine: {cores} cores, {ram / GiB:.1f} GiB RAM (see cpu_spec docstring)", is_cpu=True,
    )


def lookup_gpu(name: str) -> GPUSpec | None:
    key = alias_key(name)
    if key == "CPU":
        return cpu_spec()
    canonical = ALIASES.get(key) or next((n for n in CATALOG if alias_key(n) == key), None)
    return CATALOG.get(canonical) if canonical else None
