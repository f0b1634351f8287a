"""The CUDA caching allocator of a run: its setting, where the run empties its cache, and what a phase held.

    alloc_conf(setting, current) -> str | None       the PYTORCH_CUDA_ALLOC_CONF a setting asks for (pure)
    apply_allocator(setting, device) -> str | None   set it in this process before CUDA allocates (CUDA only)
    release_points(policy) -> tuple[str, ...]        where `torch.cuda.empty_cache()` runs (pure)
    release_cache(policy, point, device)             empty the cache at `point` when the policy names it
    cuda_phase_peaks(device) -> (allocated, reserved, device) peak bytes since the phase's peak reset
    allocator_report(...) -> AllocatorReport         what profile.json says about both

Allocator settings (run config `allocator`):
- "expandable": `expandable_segments:True` — the caching allocator maps physical memory into one growing
  virtual segment (per stream) instead of cudaMalloc-ing fixed segments, so blocks freed by one phase can
  serve another phase's differently sized tensors and the reserve above the live tensors stays small
  (PyTorch docs, notes/cuda.rst "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF": expandable_segments).
  It is set in the environment before CUDA allocates (a Ray worker process starts clean) and, as verl does
  it at run time, through `torch.cuda.memory._set_allocator_settings` (verl/utils/device.py
  `set_expandable_segments`, volcengine/verl@b178a3cd5), so it also holds where CUDA was already
  initialised. Other options the user set in PYTORCH_CUDA_ALLOC_CONF (e.g. max_split_size_mb) are kept.
  vLLM's sleep-mode pool switches expandable segments off around its own allocations itself
  (vllm/device_allocator/cumem.py), so the setting is safe beside the vllm backend.
- "default": the environment as it is (PyTorch's default: fixed segments) — what the measured H200 runs
  of 2026-11-26 used.

Cache release (run config `release_cache`): `torch.cuda.empty_cache()` returns the allocator's cached,
unused blocks to the driver, so the next phase starts from the live tensors alone.
- "verl": where verl's hybrid engine does it (verl/workers/fsdp_workers.py @ b178a3cd5): `rollout_mode()`
  starts with `aggressive_empty_cache` (after the update, before the weights go to the rollout engine) and
  calls it again after `update_weights`; `generate_sequences` ends with `empty_cache()` ("clear kv cache")
  — here: before and after the weight sync, and after the rollout;
- "before_sync_after_rollout": before the weight sync and after the rollout, not after the sync — verl from
  3fc3e2b7 (#575) to 58840419 (#1081), v0.3.0: sharding_manager/fsdp_vllm.py@3fc3e2b7 `__enter__` empties the cache
  before `state_dict()` only, `__exit__` after `sleep`;
- "each_phase": those three and after every log-prob pass — verl before 51a5ff99 (#556, 2025-03-12), whose
  worker methods each ended with `torch.cuda.empty_cache()` (fsdp_workers.py@v0.2: update_actor,
  generate_sequences, compute_log_prob, compute_ref_log_prob; the release after the update is the next
  step's "before_weight_sync");
- "after_rollout": only after the rollout (what the hf backend's `sleep` did before this setting existed,
  so the measured H200 runs);
- "never".
On CPU every one of these is a no-op (profile.json says so).

Device footprint of a phase: `max_memory_reserved` (the allocator's peak reserve) plus what the device
holds outside the allocator at the phase end (total − free from `torch.cuda.mem_get_info`, minus
`memory_reserved`: CUDA context, cuBLAS workspaces, NCCL buffers). Within a phase the part outside the
allocator barely moves, so this is the phase's peak of what nvidia-smi shows, without a poller thread.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field

from grpo_pilot.models import Frozen

ENV_VAR = "PYTORCH_CUDA_ALLOC_CONF"  # read first by c10 CUDAAllocatorConfig::instance (PYTORCH_ALLOC_CONF after it)
EXPANDABLE = "expandable_segments"
RELEASE_POINTS: dict[str, tuple[str, ...]] = {
    "verl": ("before_weight_sync", "after_weight_sync", "after_rollout"),
    "before_sync_after_rollout": ("before_weight_sync", "after_rollout"),
    "each_phase": ("before_weight_sync", "after_weight_sync", "after_rollout", "after_log_prob"),
    "after_rollout": ("after_rollout",),
    "never": (),
}


class AllocatorReport(Frozen):
    """profile.json: the allocator and cache-release policy the run used."""

    setting: str = Field(description="Run config `allocator`: expandable | default.")
    alloc_conf: str | None = Field(
        description="PYTORCH_CUDA_ALLOC_CONF in effect in the workers (None: unset, PyTorch's defaults)."
    )
    release_cache: str = Field(
        description="Run config `release_cache`: verl | before_sync_after_rollout | each_phase | after_rollout | never."
    )
    release_points: tuple[str, ...] = Field(description="Where torch.cuda.empty_cache() ran.")
    applies: str = Field(description="'cuda', or why the settings did nothing (CPU runs).")


def alloc_conf(setting: str, current: str | None) -> str | None:
    """The allocator configuration `setting` asks for, given the environment's `current` one (pure).

    "default" leaves `current` as it is; "expandable" sets expandable_segments:True and keeps every other
    option of `current`."""
    if setting == "default":
        return current
    kept = [part.strip() for part in (current or "").split(",") if part.strip()]
    kept = [part for part in kept if part.split(":", 1)[0].strip() != EXPANDABLE]
    return ",".join(kept + [f"{EXPANDABLE}:True"])


def apply_allocator(setting: str, device: Any) -> str | None:
    """Put `setting` into effect in this process (CUDA devices only); returns the configuration in effect."""
    current = os.environ.get(ENV_VAR)
    if getattr(device, "type", str(device)) != "cuda":
        return current
    wanted = alloc_conf(setting, current)
    if wanted is not None and wanted != current:
        os.environ[ENV_VAR] = wanted
    if setting == "expandable":
        import torch

        torch.cuda.memory._set_allocator_settings(f"{EXPANDABLE}:True")
    return wanted


def release_points(policy: str) -> tuple[str, ...]:
    if policy not in RELEASE_POINTS:
        raise ValueError(f"unknown release_cache policy {policy!r}; known: {sorted(RELEASE_POINTS)}")
    return RELEASE_POINTS[policy]


def release_cache(policy: str, point: str, device: Any) -> bool:
    """`torch.cuda.empty_cache()` when `policy` releases at `point` and `device` is CUDA; whether it ran."""
    if point not in release_points(policy) or getattr(device, "type", str(device)) != "cuda":
        return False
    import torch

    torch.cuda.empty_cache()
    return True


def cuda_phase_peaks(device: Any) -> tuple[int, int, int]:
    """(max_memory_allocated, max_memory_reserved, device footprint) since the last peak reset, in bytes; the
    footprint as the module docstring defines it."""
    import torch

    allocated = int(torch.cuda.max_memory_allocated(device))
    reserved_peak = int(torch.cuda.max_memory_reserved(device))
    free, total = torch.cuda.mem_get_info(device)
    outside = max(0, int(total - free) - int(torch.cuda.memory_reserved(device)))
    return allocated, reserved_peak, reserved_peak + outside


def allocator_report(setting: str, policy: str, *, device_type: str, conf: str | None) -> AllocatorReport:
    on_cuda = device_type == "cuda"
    return AllocatorReport(
        setting=setting,
        alloc_conf=conf,
        release_cache=policy,
        release_points=release_points(policy) if on_cuda else (),
        applies="cuda" if on_cuda else f"no-op on {device_type}: the CUDA caching allocator is not used",
    )
