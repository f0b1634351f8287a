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
from grpo_pilot.units import GB, TFLOPS, GiB, MiB

__all__ = ["CATALOG", "GB", "TFLOPS", "GiB", "MiB", "GPUSpec", "cpu_spec", "lookup_gpu"]

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


def _g(name: str, *, mem: int, tflops: float, hbm_gb_s: float, link: float, source: str) -> GPUSpec:
    return GPUSpec(
        name=name,
        memory_bytes=mem,
        bf16_flops=tflops * TFLOPS,
        hbm_bytes_per_s=hbm_gb_s * GB,
        link_bytes_per_s=link,
        source=source,
    )


# Each entry's `source` names its datasheet or whitepaper (FLOP/s, bandwidth, link) and, where
# checked against public logs, the total the driver reports (nvidia-smi "MiB" column, rocm-smi
# "VRAM Total Memory (B)"), which is what memory_bytes holds.
# Datasheets quote BF16 "with sparsity" for Hopper/Ada/Blackwell; dense = sparse / 2.
CATALOG: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        _g(
            "A100-40G",
            mem=40960 * MiB,
            tflops=312,
            hbm_gb_s=1555,
            link=300 * GB,
            source="NVIDIA A100 datasheet, SXM4 40GB: BF16 312 TF dense (624 sparse), HBM2 1,555 GB/s, "
            "NVLink3 600 GB/s bidirectional; nvidia-smi 40960 MiB",
        ),
        _g(
            "A100-80G",
            mem=81920 * MiB,
            tflops=312,
            hbm_gb_s=2039,
            link=300 * GB,
            source="NVIDIA A100 datasheet, SXM4 80GB: BF16 312 TF dense (624 sparse), HBM2e 2,039 GB/s, "
            "NVLink3 600 GB/s bidirectional; nvidia-smi 81920 MiB",
        ),
        _g(
            "A800-80G",
            mem=81920 * MiB,
            tflops=312,
            hbm_gb_s=2039,
            link=200 * GB,
            source="NVIDIA A800 80GB SXM4 (A100 for export markets): A100 80GB compute and memory (BF16 312 TF dense, "
            "HBM2e 2,039 GB/s), NVLink reduced to 400 GB/s bidirectional; nvidia-smi 81920 MiB",
        ),
        _g(
            "H100-80G",
            mem=81559 * MiB,
            tflops=989,
            hbm_gb_s=3350,
            link=450 * GB,
            source="NVIDIA H100 datasheet, SXM5: BF16 989 TF dense (1,979 sparse), HBM3 3.35 TB/s, NVLink4 900 GB/s "
            "bidirectional; nvidia-smi 81559 MiB",
        ),
        _g(
            "H100-PCIE",
            mem=81559 * MiB,
            tflops=756,
            hbm_gb_s=2000,
            link=PCIE5_X16,
            source="NVIDIA H100 datasheet, PCIe: BF16 756 TF dense (1,513 sparse), HBM2e 2.0 TB/s, PCIe 5.0 x16 "
            "(128 GB/s bidirectional; NVLink bridge not assumed); nvidia-smi 81559 MiB",
        ),
        _g(
            "H800",
            mem=81559 * MiB,
            tflops=989,
            hbm_gb_s=3350,
            link=200 * GB,
            source="NVIDIA H800 SXM5: H100 SXM5 compute and memory (BF16 989 TF dense, 3.35 TB/s), NVLink 400 GB/s "
            "bidirectional; nvidia-smi 81559 MiB",
        ),
        _g(
            "H20",
            mem=97871 * MiB,
            tflops=148,
            hbm_gb_s=4000,
            link=450 * GB,
            source="NVIDIA H20 product brief: BF16/FP16 148 TF dense (296 INT8 TOPS), 96 GB HBM3 at 4.0 TB/s, NVLink "
            "900 GB/s bidirectional; nvidia-smi 97871 MiB",
        ),
        _g(
            "H20-141G",
            mem=143771 * MiB,
            tflops=148,
            hbm_gb_s=4800,
            link=450 * GB,
            source="NVIDIA H20 141 GB variant (the H20 ships with 96 GB or 141 GB HBM3e): H20 compute "
            "(BF16 148 TF dense), NVLink 900 GB/s bidirectional; memory as the H200's six HBM3e stacks, 143771 MiB. "
            "The vendor publishes no bandwidth for this variant: 4.8 TB/s (the H200's, same stacks) is an assumption",
        ),
        _g(
            "H200",
            mem=143771 * MiB,
            tflops=989,
            hbm_gb_s=4800,
            link=450 * GB,
            source="NVIDIA H200 datasheet, SXM: BF16 989 TF dense (1,979 sparse), 141 GB HBM3e at 4.8 TB/s, NVLink4 "
            "900 GB/s bidirectional; nvidia-smi 143771 MiB",
        ),
        _g(
            "B200",
            mem=183359 * MiB,
            tflops=2250,
            hbm_gb_s=7700,
            link=900 * GB,
            source="NVIDIA HGX B200 spec table, per GPU at 1,000 W: FP16/BF16 4.5 PF with sparsity = 2.25 PF dense, "
            "180 GB HBM3e at 7.7 TB/s, NVLink5 1.8 TB/s bidirectional; nvidia-smi 183359 MiB",
        ),
        _g(
            "L40S",
            mem=46068 * MiB,
            tflops=362,
            hbm_gb_s=864,
            link=PCIE4_X16,
            source="NVIDIA L40S datasheet: BF16 362 TF dense (733 sparse), 48 GB GDDR6 at 864 GB/s, PCIe 4.0 x16; "
            "nvidia-smi 46068 MiB (ECC on)",
        ),
        _g(
            "L4",
            mem=23034 * MiB,
            tflops=121,
            hbm_gb_s=300,
            link=PCIE4_X16,
            source="NVIDIA L4 datasheet: BF16 121 TF dense (242 sparse), 24 GB GDDR6 at 300 GB/s, PCIe 4.0 x16; "
            "nvidia-smi 23034 MiB",
        ),
        _g(
            "A10G",
            mem=23028 * MiB,
            tflops=70,
            hbm_gb_s=600,
            link=PCIE4_X16,
            source="AWS G5 / A10G: 24 GB GDDR6 at 600 GB/s, PCIe 4.0 x16; nvidia-smi 23028 MiB. BF16 dense is not "
            "published by NVIDIA: 70 TF = 80 SMs x 1.71 GHz x 512 FLOP/clk (GA102 rate with FP32 accumulate, "
            "Ampere GA102 whitepaper); the A10's 125 TF is not reached (uncertain, calibrate by measurement)",
        ),
        _g(
            "A6000",
            mem=49140 * MiB,
            tflops=155,
            hbm_gb_s=768,
            link=PCIE4_X16,
            source="NVIDIA RTX A6000 datasheet: tensor 309.7 TF with sparsity = 154.8 TF BF16 dense, 48 GB GDDR6 at "
            "768 GB/s, PCIe 4.0 x16; nvidia-smi 49140 MiB (ECC off)",
        ),
        _g(
            "RTX3090",
            mem=24576 * MiB,
            tflops=71,
            hbm_gb_s=936,
            link=PCIE4_X16,
            source="NVIDIA Ampere GA102 whitepaper, RTX 3090: BF16 tensor with FP32 accumulate 71 TF dense, 936 GB/s; "
            "PCIe 4.0 x16",
        ),
        _g(
            "RTX4090",
            mem=24564 * MiB,
            tflops=165,
            hbm_gb_s=1008,
            link=PCIE4_X16,
            source="NVIDIA Ada Lovelace whitepaper, RTX 4090: BF16 tensor with FP32 accumulate 165.2 TF dense, "
            "1,008 GB/s; PCIe 4.0 x16",
        ),
        _g(
            "RTX5090",
            mem=32607 * MiB,
            tflops=209,
            hbm_gb_s=1792,
            link=PCIE5_X16,
            source="NVIDIA RTX Blackwell whitepaper, RTX 5090: BF16 tensor with FP32 accumulate 209.5 TF dense "
            "(170 SMs), 32 GB GDDR7 at 1,792 GB/s, PCIe 5.0 x16; nvidia-smi 32607 MiB",
        ),
        _g(
            "L20",
            mem=46068 * MiB,
            tflops=119.5,
            hbm_gb_s=864,
            link=PCIE4_X16,
            source="NVIDIA L20 (AD102, 92 SMs, 48 GB GDDR6 at 864 GB/s, PCIe 4.0 x16; the corpus's CI runner 'L20x8'): "
            "nvidia-smi total taken as the L40S's 46068 MiB (same 48 GB ECC part). BF16 dense 119.5 TF = 92 SMs x "
            "2.52 GHz x 512 FLOP/clk: NVIDIA publishes no datasheet figure here; uncertain, calibrate by measurement",
        ),
        _g(
            "T4",
            mem=15095 * MiB,
            tflops=65,
            hbm_gb_s=320,
            link=16 * GB,
            source="NVIDIA T4 datasheet: FP16/FP32 mixed-precision tensor 65 TF dense (no BF16: the 2-byte compute "
            "dtype is fp16), 16 GB GDDR6 at 320 GB/s, PCIe 3.0 x16 (16 GB/s); memory as torch reports it on Colab's "
            "T4, 'Max memory = 14.741 GB' (huggingface/trl examples/notebooks/grpo_trl_lora_qlora.ipynb output)",
        ),
        _g(
            "MI300X",
            mem=196592 * MiB,
            tflops=1307,
            hbm_gb_s=5300,
            link=448 * GB,
            source="AMD Instinct MI300X datasheet: BF16 1,307.4 TF dense (2,614.9 sparse), 192 GB HBM3 at 5.3 TB/s, "
            "Infinity Fabric 7 links, 896 GB/s aggregate bidirectional; rocm-smi 206141652992 B",
        ),
    ]
}

# Names users type, mapped to catalog names (case-insensitive; '-', '_' and spaces ignored).
ALIASES: dict[str, str] = {
    "A100": "A100-80G",
    "A10080G": "A100-80G",
    "A10040G": "A100-40G",
    "A10080GB": "A100-80G",
    "A10040GB": "A100-40G",
    "H100": "H100-80G",
    "H10080G": "H100-80G",
    "H10080GB": "H100-80G",
    "H100SXM": "H100-80G",
    "H100SXM80G": "H100-80G",
    "H100PCIE": "H100-PCIE",
    "H100PCIE80G": "H100-PCIE",
    "A800": "A800-80G",
    "A80080G": "A800-80G",
    "A80080GB": "A800-80G",
    "H800": "H800",
    "H80080G": "H800",
    "H20": "H20",
    "H2096G": "H20",
    "H20141G": "H20-141G",
    "H20141GB": "H20-141G",
    "H200": "H200",
    "H200141G": "H200",
    "B200": "B200",
    "B200180G": "B200",
    "B200192G": "B200",
    "L40S": "L40S",
    "L40S48G": "L40S",
    "L4": "L4",
    "L424G": "L4",
    "A10G": "A10G",
    "A10G24G": "A10G",
    "A6000": "A6000",
    "RTXA6000": "A6000",
    "3090": "RTX3090",
    "RTX3090": "RTX3090",
    "4090": "RTX4090",
    "RTX4090": "RTX4090",
    "5090": "RTX5090",
    "RTX5090": "RTX5090",
    "MI300X": "MI300X",
    "MI300X192G": "MI300X",
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
        name="cpu",
        memory_bytes=int(ram),
        bf16_flops=cores * 3e9 * 64,
        hbm_bytes_per_s=20 * GB,
        link_bytes_per_s=10 * GB,
        source=f"this machine: {cores} cores, {ram / GiB:.1f} GiB RAM (see cpu_spec docstring)",
        is_cpu=True,
    )


def lookup_gpu(name: str) -> GPUSpec | None:
    key = alias_key(name)
    if key == "CPU":
        return cpu_spec()
    canonical = ALIASES.get(key) or next((n for n in CATALOG if alias_key(n) == key), None)
    return CATALOG.get(canonical) if canonical else None
