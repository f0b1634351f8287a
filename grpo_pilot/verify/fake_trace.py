"""The torch plumbing of the traced method (verify/traced.py): HF config from a spec, the fake process
group, the two tracker adjustments torch 2.13 needs, and reading tracker snapshots.

Adjustments (both undone on exit of `tracker_adjustments`):
- DTensor's sharding propagation runs its shape inference under `detect_fake_mode()`, which inside our
  FakeTensorMode is the tracker's own mode, so the tracker counted those metadata-only ops as memory
  (+9% to +195% on optimizer steps, reference/memory-model.md §7). Patching
  `_sharding_prop.detect_fake_mode` to return None gives the propagation a private mode, which the
  tracker skips by identity (`active_fake_mode() is self._fake_mode_on_entry`).
- The tracker rounds to the CUDA caching allocator's 512-byte block only for `cuda` tensors; fake `cuda`
  tensors cannot run backward on a CPU build, so we trace on `cpu` and apply the rounding to all.

torch is imported inside the functions only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from grpo_pilot.errors import InputError, RunError
from grpo_pilot.profiles.spec import ModelSpec

DTYPES = ("bfloat16", "float16", "float32")
# kMinBlockSize of the CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every allocation is
# rounded up to a multiple of 512 bytes; the same constant as torch's mem_tracker `_PYTORCH_MIN_ALLOCATE`.
CUDA_MIN_BLOCK_BYTES = 512


def torch_dtype(name: str, what: str) -> Any:
    """'bfloat16' -> torch.bfloat16; an InputError naming `what` for anything else."""
    import torch

    if name not in DTYPES:
        raise InputError(f"Unknown {what} '{name}'.", f"Use one of: {', '.join(DTYPES)}.")
    return getattr(torch, name)


def hf_config_from_spec(spec: ModelSpec) -> Any:
    """An HF `PretrainedConfig` with exactly the spec's shape (dense decoder-only models)."""
    from transformers import AutoConfig

    if spec.is_moe:
        raise InputError(
            f"The traced method covers dense models; '{spec.name}' is a mixture of experts.",
            "Compare MoE models with the analytic estimate only.",
        )
    fields: dict[str, Any] = {
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
        "attention_bias": spec.qkv_bias,
        "use_cache": False,
    }
    try:
        return AutoConfig.for_model(spec.model_type, **fields)
    except (KeyError, ValueError) as exc:
        raise InputError(
            f"transformers cannot build a '{spec.model_type}' model ({exc}).", "Trace a qwen2, qwen3 or llama model."
        ) from None


@contextmanager
def tracker_adjustments() -> Iterator[None]:
    """The two torch 2.13 adjustments of the module docstring, undone on exit."""
    import torch.distributed._tools.mem_tracker as mem_tracker
    import torch.distributed.tensor._sharding_prop as sharding_prop

    saved_detect = sharding_prop.detect_fake_mode
    saved_calc = mem_tracker._WeakRefInfo._calculate_mem_consumed

    def rounded(self: Any) -> int:
        raw = self.size * self.element_size
        return -(-raw // CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES

    sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    mem_tracker._WeakRefInfo._calculate_mem_consumed = rounded
    try:
        yield
    finally:
        sharding_prop.detect_fake_mode = saved_detect
        mem_tracker._WeakRefInfo._calculate_mem_consumed = saved_calc


@contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """A `"fake"` process group of `world_size` ranks (we are rank 0) and its 1-D cpu device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RunError(
            "A torch.distributed process group is already initialised in this process.",
            "Run the trace in its own process (e.g. `python benchmarks/traced_vs_analytic.py`).",
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def snapshot_labels(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    """Tracker snapshot of the cpu device -> {label: bytes} without the 'Total' key."""
    out: dict[str, int] = {}
    for dev_snap in snapshot.values():
        for key, value in dev_snap.items():
            label = getattr(key, "value", str(key))
            if label != "Total":
                out[label] = out.get(label, 0) + int(value)
    return out


def reset_peak(tracker: Any) -> None:
    """Restart the tracker's global peak from the current snapshot (MemTracker has no public reset)."""
    tracker._peak_mem_snap = tracker.get_tracker_snapshot("current")
    tracker._peak_mem = {dev: snap["Total"] for dev, snap in tracker._peak_mem_snap.items()}
