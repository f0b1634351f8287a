"""Trainer → rollout weights as named tensors, gathered from FSDP2 shards and moved in buckets.

    full_weights(model) -> iterator of (HF name, full tensor)       one parameter gathered at a time
    policy_weights(model) -> the same, adapters merged when the policy has them (engine/lora.py)
    buckets(weights, bucket_bytes, dtype=) -> iterator of [(name, tensor), ...]
    stream(buckets) -> iterator of (name, tensor)                   what a rollout backend's sync_weights takes

A rollout backend never sees the trainer's module: `sync_weights` takes (name, tensor) pairs. How they
travel depends on the placement (engine/workers.py):
- colocated: every training rank gathers each parameter (`DTensor.full_tensor()`, an all-gather over
  the training group) and loads it into its own rollout engine, bucket by bucket, lazily: the engine
  pulls the next bucket only when it has loaded the previous one, so at most one bucket (plus the
  parameter being gathered) is in flight;
- split: every training rank takes part in the gathers, training rank 0 puts each bucket into the
  Ray object store, and every rollout worker pulls the buckets in order.
Bucket size: the plan's `execution.weight_sync_bucket_bytes` (planner/overheads.py, verl's 2 GiB), so the
measured weight_sync peak is comparable with the plan's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from grpo_pilot.engine.lora import is_adapted, merged_weights

WeightBucket = list[tuple[str, torch.Tensor]]


def full_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every parameter name, tied ones under each name; DTensor shards gathered.

    Lazy: an FSDP2-sharded parameter is gathered only when the consumer reaches it (a collective: every
    training rank must walk the parameters in the same order).
    """
    for name, param in model.named_parameters(remove_duplicate=False):
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):  # FSDP2 / DTensor: gather the full parameter
            tensor = tensor.full_tensor()
        yield name, tensor


def policy_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What a rollout engine serving the plain model loads: `full_weights`, or for a policy with peft adapters the
    merged weights (engine/lora.py `merged_weights`: W + s·B·A per adapted linear, the trainer's parameters
    untouched), under the same HF names."""
    return merged_weights(model) if is_adapted(model) else full_weights(model)


def buckets(
    weights: Iterable[tuple[str, torch.Tensor]], size_bytes: int, *, dtype: torch.dtype | None = None
) -> Iterator[WeightBucket]:
    """Consecutive (name, tensor) pairs, cast to `dtype` when given, in lists of at most `size_bytes`
    (a tensor larger than that travels alone)."""
    bucket: WeightBucket = []
    used = 0
    for name, tensor in weights:
        if dtype is not None and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and used + nbytes > size_bytes:
            yield bucket
            bucket, used = [], 0
        bucket.append((name, tensor))
        used += nbytes
    if bucket:
        yield bucket


def stream(parts: Iterable[WeightBucket]) -> Iterator[tuple[str, torch.Tensor]]:
    """The pairs of every bucket in order; a bucket is requested only once the previous one is consumed."""
    for bucket in parts:
        yield from bucket


def to_host(bucket: WeightBucket) -> WeightBucket:
    """CPU copies (what goes into the Ray object store)."""
    return [(name, tensor.detach().to("cpu")) for name, tensor in bucket]


def from_object_store(refs: Iterable[Any]) -> Iterator[WeightBucket]:
    """Buckets fetched from the Ray object store one at a time (split placement's receiving side)."""
    import ray

    for ref in refs:
        yield ray.get(ref)
