"""Host RAM per node: offloaded states of every training rank on the node plus process RSS.

- actor params (param_offload): each rank's fp32 shard; FSDP2 `CPUOffloadPolicy(pin_memory=True)`
  pins the shard itself, so the pinned buffer *is* this item (no second copy).
- actor grads (param_offload, grpo-pilot and trl): FSDP2 CPU offload / ZeRO-3 offload keep the
  sharded grads on the host too. verl frees grads (`zero_grad()` at the end of update_policy)
  before `offload_fsdp_model_to_cpu`, so it has none on the host.
- Adam states (optimizer_offload) and the reference shard (ref_param_offload).
- one process per GPU on the node (trainer or rollout worker), each with a baseline RSS.
On the cpu pseudo-device host RAM *is* the device: there is nothing to offload to, so only the
process baseline is reported here (the phases already count every tensor).
"""

from __future__ import annotations


def host_items(
    trainer_ranks_on_node: int,
    processes_on_node: int,
    master_shard_bytes: int,
    grad_shard_bytes: int,
    adam_shard_bytes: int,
    ref_shard_bytes: int,
    param_offload: bool,
    optimizer_offload: bool,
    ref_param_offload: bool,
    grads_follow_params: bool,
    rss_bytes_per_process: int,
) -> dict[str, int]:
    """Itemised host bytes of one node (items sum to the node's total)."""
    n = trainer_ranks_on_node
    return {
        "actor_params_offloaded": n * master_shard_bytes if param_offload else 0,
        "actor_grads_offloaded": n * grad_shard_bytes if (param_offload and grads_follow_params) else 0,
        "optimizer_states_offloaded": n * adam_shard_bytes if optimizer_offload else 0,
        "ref_params_offloaded": n * ref_shard_bytes if ref_param_offload else 0,
        "process_rss": processes_on_node * rss_bytes_per_process,
    }
