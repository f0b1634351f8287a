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


def _g(name: str, mem: int, tflops: float, hbm_gb_s: float, link: float, source: str) -> GPUSpec:
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
            40960 * MiB,
            312,
            1555,
            300 * GB,
            "NVIDIA A100 datasheet, SXM4 40GB: BF16 312 TF dense (624 sparse), HBM2 1,555 GB/s, NVLink3 600 GB/s "
            "bidirectional; nvidia-smi 40960 MiB",
        ),
        _g(
            "A100-80G",
            81920 * MiB,
            312,
            2039,
            300 * GB,
            "NVIDIA A100 datasheet, SXM4 80GB: BF16 312 TF dense (624 sparse), HBM2e 2,039 GB/s, NVLink3 600 GB/s "
            "bidirectional; nvidia-smi 81920 MiB",
        ),
        _g(
            "A800-80G",
            81920 * MiB,
            312,
            2039,
            200 * GB,
            "NVIDIA A800 80GB SXM4 (A100 for export markets): A100 80GB compute and memory (BF16 312 TF dense, "
            "HBM2e 2,039 GB/s), NVLink reduced to 400 GB/s bidirectional; nvidia-smi 81920 MiB",
        ),
        _g(
            "H100-80G",
            81559 * MiB,
            989,
            3350,
            450 * GB,
            "NVIDIA H100 datasheet, SXM5: BF16 989 TF dense (1,979 sparse), HBM3 3.35 TB/s, NVLink4 900 GB/s "
            "bidirectional; nvidia-smi 81559 MiB",
        ),
        _g(
            "H100-PCIE",
            81559 * MiB,
            756,
            2000,
            PCIE5_X16,
            "NVIDIA H100 datasheet, PCIe: BF16 756 TF dense (1,513 sparse), HBM2e 2.0 TB/s, PCIe 5.0 x16 "
            "(128 GB/s bidirectional; NVLink bridge not assumed); nvidia-smi 81559 MiB",
        ),
        _g(
            "H800",
            81559 * MiB,
            989,
            3350,
            200 * GB,
            "NVIDIA H800 SXM5: H100 SXM5 compute and memory (BF16 989 TF dense, 3.35 TB/s), NVLink 400 GB/s "
            "bidirectional; nvidia-smi 81559 MiB",
        ),
        _g(
            "H20",
            97871 * MiB,
            148,
            4000,
            450 * GB,
            "NVIDIA H20 product brief: BF16/FP16 148 TF dense (296 INT8 TOPS), 96 GB HBM3 at 4.0 TB/s, NVLink "
            "900 GB/s bidirectional; nvidia-smi 97871 MiB",
        ),
        _g(
            "H20-141G",
            143771 * MiB,
            148,
            4800,
            450 * GB,
            "NVIDIA H20 141 GB variant (the H20 ships with 96 GB or 141 GB HBM3e): H20 compute (BF16 148 TF dense), "
            "NVLink 900 GB/s bidirectional; memory as the H200's six HBM3e stacks, 143771 MiB. The vendor publishes "
            "no bandwidth for this variant: 4.8 TB/s (the H200's, same stacks) is an assumption",
        ),
        _g(
            "H200",
            143771 * MiB,
            989,
            4800,
            450 * GB,
            "NVIDIA H200 datasheet, SXM: BF16 989 TF dense (1,979 sparse), 141 GB HBM3e at 4.8 TB/s, NVLink4 "
            "900 GB/s bidirectional; nvidia-smi 143771 MiB",
        ),
        _g(
            "B200",
            183359 * MiB,
            2250,
            7700,
            900 * GB,
            "NVIDIA HGX B200 spec table, per GPU at 1,000 W: FP16/BF16 4.5 PF with sparsity = 2.25 PF dense, "
            "180 GB HBM3e at 7.7 TB/s, NVLink5 1.8 TB/s bidirectional; nvidia-smi 183359 MiB",
        ),
        _g(
            "L40S",
            46068 * MiB,
            362,
            864,
            PCIE4_X16,
            "NVIDIA L40S datasheet: BF16 362 TF dense (733 sparse), 48 GB GDDR6 at 864 GB/s, PCIe 4.0 x16; "
            "nvidia-smi 46068 MiB (ECC on)",
        ),
        _g(
            "L4",
            23034 * MiB,
            121,
            300,
            PCIE4_X16,
            "NVIDIA L4 datasheet: BF16 121 TF dense (242 sparse), 24 GB GDDR6 at 300 GB/s, PCIe 4.0 x16; "
            "nvidia-smi 23034 MiB",
        ),
        _g(
            "A10G",
            23028 * MiB,
            70,
            600,
            PCIE4_X16,
            "AWS G5 / A10G: 24 GB GDDR6 at 600 GB/s, PCIe 4.0 x16; nvidia-smi 23028 MiB. BF16 dense is not "
            "published by NVIDIA: 70 TF = 80 SMs x 1.71 GHz x 512 FLOP/clk (GA102 rate with FP32 accumulate, "
            "Ampere GA102 whitepaper); the A10's 125 TF is not reached (uncertain, calibrate by measurement)",
        ),
        _g(
            "A6000",
            49140 * MiB,
            155,
            768,
            PCIE4_X16,
            "NVIDIA RTX A6000 datasheet: tensor 309.7 TF with sparsity = 154.8 TF BF16 dense, 48 GB GDDR6 at "
            "768 GB/s, PCIe 4.0 x16; nvidia-smi 49140 MiB (ECC off)",
        ),
        _g(
            "RTX3090",
            24576 * MiB,
            71,
            936,
            PCIE4_X16,
            "NVIDIA Ampere GA102 whitepaper, RTX 3090: BF16 tensor with FP32 accumulate 71 TF dense, 936 GB/s; "
            "PCIe 4.0 x16",
        ),
        _g(
            "RTX4090",
            24564 * MiB,
            165,
            1008,
            PCIE4_X16,
            "NVIDIA Ada Lovelace whitepaper, RTX 4090: BF16 tensor with FP32 accumulate 165.2 TF dense, "
            "1,008 GB/s; PCIe 4.0 x16",
        ),
        _g(
            "RTX5090",
            32607 * MiB,
            209,
            1792,
            PCIE5_X16,
            "NVIDIA RTX Blackwell whitepaper, RTX 5090: BF16 tensor with FP32 accumulate 209.5 TF dense "
            "(170 SMs), 32 GB GDDR7 at 1,792 GB/s, PCIe 5.0 x16; nvidia-smi 32607 MiB",
        ),
        _g(
            "L20",
            46068 * MiB,
            119.5,
            864,
            PCIE4_X16,
            "NVIDIA L20 (AD102, 92 SMs, 48 GB GDDR6 at 864 GB/s, PCIe 4.0 x16; the corpus's CI runner 'L20x8'): "
            "nvidia-smi total taken as the L40S's 46068 MiB (same 48 GB ECC part). BF16 dense 119.5 TF = 92 SMs x "
            "2.52 GHz x 512 FLOP/clk: NVIDIA publishes no datasheet figure here; uncertain, calibrate by measurement",
        ),
        _g(
            "T4",
            15095 * MiB,
            65,
            320,
            16 * GB,
            "NVIDIA T4 datasheet: FP16/FP32 mixed-precision tensor 65 TF dense (no BF16: the 2-byte compute dtype is "
            "fp16), 16 GB GDDR6 at 320 GB/s, PCIe 3.0 x16 (16 GB/s); memory as torch reports it on Colab's T4, "
            "'Max memory = 14.741 GB' (huggingface/trl examples/notebooks/grpo_trl_lora_qlora.ipynb output)",
        ),
        _g(
            "MI300X",
            196592 * MiB,
            1307,
            5300,
            448 * GB,
            "AMD Instinct MI300X datasheet: BF16 1,307.4 TF dense (2,614.9 sparse), 192 GB HBM3 at 5.3 TB/s, "
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
