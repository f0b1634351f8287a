"""The torch plumbing of the traced method (verify/traced.py): HF config from a spec, the fake process
group, the three tracker adjustments torch 2.13 needs, a fake mode that answers host syncs, and reading
and steering tracker snapshots.

Adjustments (all undone on exit of `tracker_adjustments`):
- DTensor's sharding propagation runs its shape inference under `detect_fake_mode()`, which inside our
  FakeTensorMode is the tracker's own mode, so the tracker counted those metadata-only ops as memory
  (+9% to +195% on optimizer steps, reference/memory-model.md §7). Patching
  `_sharding_prop.detect_fake_mode` to return None gives the propagation a private mode, which the
  tracker skips by identity (`active_fake_mode() is self._fake_mode_on_entry`).
- The tracker rounds to the CUDA caching allocator's 512-byte block only for `cuda` tensors; fake `cuda`
  tensors cannot run backward on a CPU build, so we trace on `cpu` and apply the rounding to all.
- The trackers' ModTracker registers gradient hooks on a module's inputs that require grad, in no-grad
  passes too. With gradient checkpointing transformers makes the embedding output require grad
  (`enable_input_require_grads`, modeling_utils `gradient_checkpointing_enable`), so in a log-prob pass
  it is a leaf, and a view of it made under no_grad (the shared-prompt forward's `h[None]`) has no
  gradient edge: torch asserts. Nothing runs backward through a no-grad pass, so the hook is skipped
  while grad mode is off (`mod_tracker.register_multi_grad_hook`).

Attention masks (`gpu_attention_masks`): transformers decides from the *values* of the position ids
and of the padding mask whether it can leave the causal mask to SDPA's `is_causal` (masking_utils
`find_packed_sequence_indices`, `_ignore_causal_mask_sdpa`); a fake tensor has no values, so it treats
it as a traced graph and builds a boolean [B, 1, S, S] mask, which turns off SDPA's native GQA
(`use_gqa_in_sdpa`: k and v are then repeated to every query head) and is converted and kept for
backward in every layer. On a GPU (and on real cpu tensors) the engine's right-padded rows with
default positions and the rollout's unpadded prompts get no mask at all. The context answers those two
questions as real tensors would: no packed sequences, and a padding mask that masks nothing.

Host syncs: the engine's actor reads a few numbers back from tensors (loss metrics, the grad norm,
the micro-batch count agreed across ranks). A fake tensor has no value, so `HostSyncFakeMode` answers
`aten._local_scalar_dense` with the tensor's tracked constant when it has one (small tensors made
from Python numbers, e.g. the micro-batch count, keep theirs through the fake all-reduce: every rank
of the fake group is rank 0, so the reduction of equal values is the value), else 1 (True for a
boolean): those are metrics, which never decide what is allocated, and the finiteness checks before an
optimizer step (engine/finite.py), which then pass as they do on real data.

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
    """The three torch 2.13 adjustments of the module docstring, undone on exit."""
    import torch
    import torch.distributed._tools.mem_tracker as mem_tracker
    import torch.distributed._tools.mod_tracker as mod_tracker
    import torch.distributed.tensor._sharding_prop as sharding_prop

    saved_detect = sharding_prop.detect_fake_mode
    saved_calc = mem_tracker._WeakRefInfo._calculate_mem_consumed
    saved_grad_hook = mod_tracker.register_multi_grad_hook

    class _NoHook:
        def remove(self) -> None:
            """Nothing was registered: nothing to remove."""

    def grad_hook_when_grad_enabled(tensors: Any, fn: Any, **kwargs: Any) -> Any:
        return saved_grad_hook(tensors, fn, **kwargs) if torch.is_grad_enabled() else _NoHook()

    def rounded(self: Any) -> int:
        raw = self.size * self.element_size
        return -(-raw // CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES

    sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    mem_tracker._WeakRefInfo._calculate_mem_consumed = rounded
    mod_tracker.register_multi_grad_hook = grad_hook_when_grad_enabled
    try:
        yield
    finally:
        sharding_prop.detect_fake_mode = saved_detect
        mem_tracker._WeakRefInfo._calculate_mem_consumed = saved_calc
        mod_tracker.register_multi_grad_hook = saved_grad_hook


@contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """A `"fake"` process group of `world_size` ranks (we are rank 0) and its 1-D cpu device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RunError(
            "A torch.distributed process group is already initialised in this process.",
            "Run the trace in its own process (e.g. `python benchmarks/estimator_accuracy.py`).",
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


@contextmanager
def gpu_attention_masks() -> Iterator[None]:
    """transformers' mask decisions for the traced inputs taken as on real tensors (module docstring)."""
    import transformers.masking_utils as masking

    saved = masking.find_packed_sequence_indices, masking._ignore_causal_mask_sdpa
    original_ignore = saved[1]

    def ignore_unpadded(padding_mask: Any, *args: Any, **kwargs: Any) -> bool:
        return original_ignore(None, *args, **kwargs)

    masking.find_packed_sequence_indices = lambda position_ids: None
    masking._ignore_causal_mask_sdpa = ignore_unpadded
    try:
        yield
    finally:
        masking.find_packed_sequence_indices, masking._ignore_causal_mask_sdpa = saved


def host_sync_fake_mode() -> Any:
    """A FakeTensorMode (allow_non_fake_inputs) whose host syncs return a placeholder (module docstring)."""
    import torch
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    local_scalar = torch.ops.aten._local_scalar_dense.default

    class HostSyncFakeMode(FakeTensorMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is local_scalar:
                try:
                    return super().__torch_dispatch__(func, types, args, kwargs)
                except DataDependentOutputException:
                    dtype = args[0].dtype
                    return True if dtype == torch.bool else (1.0 if dtype.is_floating_point else 1)
            return super().__torch_dispatch__(func, types, args, kwargs)

    return HostSyncFakeMode(allow_non_fake_inputs=True)


def reset_module_stats_on_root_forward(tracker: Any, roots: tuple[Any, ...]) -> Any:
    """Clear the tracker's per-module stats at every forward of one of `roots` (a global pre-hook, so it
    runs before the tracker's own): the memory tracker otherwise refuses a second forward of a root, and
    the actor runs one per micro-batch. Returns the hook handle (remove it when done)."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    ids = {id(r) for r in roots}

    def hook(module: Any, args: Any) -> None:
        if id(module) in ids:
            tracker.reset_mod_stats()

    return register_module_forward_pre_hook(hook)


def instrument_extra_root(tracker: Any, root: Any) -> None:
    """Make an FSDPMemTracker of one FSDP root also label the FSDP units of `root` (the reference model):
    its sharded parameters, gathers and reduce-scatters then carry their labels, not 'Activation'."""
    own = tracker._root_mod
    tracker._root_mod = root
    try:
        tracker._instrument_fsdp_module()
    finally:
        tracker._root_mod = own


def rounded_storage_bytes(tensors: Any) -> int:
    """Σ of each tensor's storage (a DTensor's local shard) rounded up to the CUDA block (512 B)."""
    total = 0
    for t in tensors:
        local = getattr(t, "_local_tensor", t)
        total += -(-(local.numel() * local.element_size()) // CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES
    return total


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
