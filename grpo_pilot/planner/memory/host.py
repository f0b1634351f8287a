"""Host RAM per node: offloaded states of every training rank on the node plus process RSS.

- actor params (param_offload): each rank's fp32 shard; FSDP2 `CPUOffloadPolicy(pin_memory=True)`
  pins the shard itself, so the pinned buffer *is* this item (no second copy).
- actor grads (param_offload, grpo-pilot and trl): FSDP2 CPU offload / ZeRO-3 offload keep the
  sharded grads on the host too. verl frees grads (`zero_grad()` at the end of update_policy)
  before `offload_fsdp_model_to_cpu`, so it has none on the host.
- Adam states (optimizer_offload) and the reference shard (ref_param_offload, or verl's FSDP reference, offloaded
  whatever the key since #121: planner/ref_offload.py; FSDP1 pins the local shard, FSDP2 pin_memory=True).
- one process per GPU on the node (trainer or rollout worker), each with a baseline RSS.
On the cpu pseudo-device host RAM *is* the device: there is nothing to offload to, so only the
process baseline is reported here (the phases already count every tensor).
"""

from __future__ import annotations

from typing import NamedTuple


class HostShards(NamedTuple):
    """Bytes of one training rank's shards that offloading would move to the host."""

    master_bytes: int
    grad_bytes: int
    adam_bytes: int
    ref_bytes: int


class HostOffloads(NamedTuple):
    """Which shards live in host RAM."""

    params: bool
    optimizer: bool
    ref: bool
    grads_follow_params: bool  # the grads stay with offloaded params (FSDP2 / ZeRO-3 offload; not verl)


def host_items(
    *,
    trainer_ranks_on_node: int,
    processes_on_node: int,
    shards: HostShards,
    offloads: HostOffloads,
    rss_bytes_per_process: int,
) -> dict[str, int]:
    """Itemised host bytes of one node (items sum to the node's total)."""
    n, off = trainer_ranks_on_node, offloads
    return {
        "actor_params_offloaded": n * shards.master_bytes if off.params else 0,
        "actor_grads_offloaded": n * shards.grad_bytes if (off.params and off.grads_follow_params) else 0,
        "optimizer_states_offloaded": n * shards.adam_bytes if off.optimizer else 0,
        "ref_params_offloaded": n * shards.ref_bytes if off.ref else 0,
        "process_rss": processes_on_node * rss_bytes_per_process,
    }
