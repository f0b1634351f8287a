"""verl's activation offload (`actor_rollout_ref.model.enable_activation_offload`, `critic.model.*`; FSDP
and FSDP2 only) — verl/utils/activation_offload.py, volcengine/verl b178a3cd.

Mechanism (`enable_activation_offloading` L500–L540, `AsyncDoubleBufferGroupOffloadHandler` L180–L330):
- one offload group per FSDP-wrapped child module that is not an embedding: the decoder layers. The
  handler is built with `num_offload_group = layers − 1`: the last layer's saved tensors are never
  offloaded.
- saved-for-backward tensors (a `saved_tensors_hooks` context entered in each layer's forward) are copied,
  one group behind, to freshly allocated *pinned* host tensors on a side stream (`bulk_offload_group`);
  a group's GPU copies are dropped once the next group commits (`layer_window_map`: group i is released
  at the end of layer i + 1's forward). Parameters are filtered out (`FSDPParameterFilter`). The
  docstring's own words: "there are at most two activation groups in GPU memory".
- backward reloads group i − 1 while group i is back-propagated (`bulk_reload_group`), again two groups.
- with gradient checkpointing (`enable_ckpt`) verl disables transformers' checkpointing and wraps each
  layer in its own reentrant `torch.utils.checkpoint`: the saved (and offloaded) tensors of a layer are
  then its checkpoint inputs (the hidden state, c·h per token), and the layer recomputed in backward
  keeps its full activations on the GPU (the recompute runs outside the offload context).
- host memory: `torch.empty(..., pin_memory=True)` goes through PyTorch's caching host allocator, which
  rounds every allocation up to the next power of two and keeps freed blocks cached
  (aten/src/ATen/core/CachingHostAllocator.h `allocate`: `roundSize = c10::llvm::PowerOf2Ceil(size)`).
  Per rank: every offloaded tensor of one micro-batch, each rounded up; the cache holds the largest
  micro-batch's set across steps.
Time: each offloaded byte crosses the host link twice (D2H in forward, H2D in backward) on side streams;
it is hidden when a layer's compute outlasts its transfer (`family_time.activation_offload_time_s`).
"""

from __future__ import annotations

from typing import NamedTuple

PINNED_ROUNDING = "power_of_two"  # CachingHostAllocator rounds pinned allocations up to a power of two
GPU_RESIDENT_GROUPS = 2  # the group being computed and the one in transfer (handler docstring)


def power_of_two_ceil(n: int) -> int:
    """Smallest power of two ≥ n (0 for 0): PyTorch's pinned-allocation size."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def hf_layer_saved_tensor_bytes(
    hidden: int, q_dim: int, intermediate: int, num_heads: int, *, kv_dim: int, compute_bytes: int
) -> tuple[int, ...]:
    """Per-token bytes of each tensor an HF decoder layer saves (the split of `activations.py`'s traced
    per-layer bytes, 16h + 4·q + 4·kv + 8I + 4a + 8 at c = 2): per RMSNorm its fp32 input, the normalised
    copy and the output (two norms), the rotated queries and the attention output (query-sized), the keys
    and values at their kv width (SDPA's native GQA), four intermediate-sized (gate, up, SiLU, product),
    the fp32 log-sum-exp, eight bytes of bookkeeping."""
    c = compute_bytes
    norm = (4 * hidden, c * hidden, c * hidden)
    return norm * 2 + (c * q_dim,) * 2 + (c * kv_dim,) * 2 + (c * intermediate,) * 4 + (4 * num_heads, 8)


class ActivationOffload(NamedTuple):
    """Per-rank bytes of one micro-batch's update under activation offload."""

    gpu_saved_bytes: int  # saved activations still on the GPU at the peak
    gpu_recompute_bytes: int  # a layer recomputed in backward (with checkpointing)
    host_bytes: int  # pinned host memory for the offloaded groups (power-of-two rounded)
    transfer_bytes: int  # bytes offloaded per micro-batch (each crosses the link twice)


def activation_offload_bytes(
    *,
    num_layers: int,
    tokens: int,
    layer_tensor_bytes_per_token: tuple[int, ...],
    checkpoint_input_bytes_per_token: int,
    checkpointing: bool,
) -> ActivationOffload:
    """Activation offload for `tokens` tokens per rank (module docstring).

    `layer_tensor_bytes_per_token`: per-token bytes of each tensor one layer saves without checkpointing;
    `checkpoint_input_bytes_per_token`: what a checkpointed layer saves (its input, c·h)."""
    saved = (checkpoint_input_bytes_per_token,) if checkpointing else layer_tensor_bytes_per_token
    per_layer = tokens * sum(saved)
    offloaded_layers = max(0, num_layers - 1)
    on_gpu_layers = min(num_layers, GPU_RESIDENT_GROUPS)
    if offloaded_layers < 2:  # verl refuses to enable it with fewer than 3 FSDP layers: nothing moves
        return ActivationOffload(num_layers * per_layer, 0, 0, 0)
    host = offloaded_layers * sum(power_of_two_ceil(tokens * b) for b in saved)
    recompute = tokens * sum(layer_tensor_bytes_per_token) if checkpointing else 0
    return ActivationOffload(on_gpu_layers * per_layer, recompute, host, offloaded_layers * per_layer)


def host_bytes_per_node(offload: ActivationOffload, ranks_on_node: int) -> int:
    """Pinned host memory of a node's training ranks."""
    return ranks_on_node * offload.host_bytes
