"""PPO's critic (and a reward model) on the FSDP path: the leaves of memory/critic.py combined once per estimate.

`CriticPlan` holds one rank's critic numbers; the phase estimators read it:
- every phase of the actor (rollout, log-prob, update, weight sync) carries the critic's resident fp32
  shard (params and Adam, unless `critic_param_offload` / `critic_optimizer_offload`: verl's
  load-use-offload, critic.model.fsdp_config), colocated on the same GPUs (verl's fused worker);
- `values` (verl `compute_values`): the critic's forward over every sequence of the step with the value
  head in place of the vocab logits, at its forward micro-batch;
- `critic_update` (verl `update_critic`): the critic's update at its own micro-batch (token budget 2× the
  actor's by default), its grads alive only inside it;
- host RAM: the critic's offloaded shards on every node, and GAE's per-token tensors in the driver
  (`gae_host_bytes`, on the head node).
The critic's micro-batches come from `CriticSettings` (None fields follow the actor's knobs as verl
derives them: the actor's dynamic flag, twice its token budget, its micro-batch); the critic has no Ulysses
degree of its own here (verl critic.ulysses_sequence_parallel_size defaults to 1).
A reward model (`CriticSettings.reward_model`) is the same architecture in bf16, forward only: its shard is
resident unless offloaded, loaded for its pass, which is counted in the `values` phase (its working set is
the critic's forward at the same micro-batch).
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.memory.critic import (
    CRITIC_BUDGET_FACTOR,
    critic_host_bytes,
    critic_params,
    critic_state_items,
    critic_update_items,
    critic_values_items,
    gae_host_bytes,
    reward_model_items,
)
from grpo_pilot.planner.memory.shape import TransformerShape
from grpo_pilot.units import BF16_BYTES

# the planner's phases → memory/critic.py's names for them
_CRITIC_PHASE = {
    "rollout": "rollout",
    "rollout_hf": "rollout",
    "log_prob": "log_prob",
    "values": "values",
    "critic_update": "critic_update",
    "update": "actor_update",
    "weight_sync": "weight_sync",
}


class CriticPlan(NamedTuple):
    """One rank's critic numbers (module docstring)."""

    shape: TransformerShape
    num_params: int
    shard_degree: int
    update_tokens: int  # tokens per rank of one update_critic micro-batch
    forward_tokens: int  # tokens per rank of one compute_values micro-batch
    checkpointing: bool
    param_offload: bool
    optimizer_offload: bool
    reward_model: bool
    reward_model_offload: bool
    compute_bytes: int


def critic_knobs(workload: Workload, knobs: Knobs) -> Knobs:
    """The actor's knobs with the critic's batching in place (module docstring), for the token helpers."""
    s = workload.critic_settings
    if s.micro_batch_size_per_gpu is not None:
        micro, budget = s.micro_batch_size_per_gpu, None
    elif s.max_token_len_per_gpu is not None:
        micro, budget = None, s.max_token_len_per_gpu
    elif knobs.dynamic_batching:
        micro, budget = None, CRITIC_BUDGET_FACTOR * (knobs.max_token_len_per_gpu or 0)
    else:
        micro, budget = knobs.micro_batch_size_per_gpu, None
    if s.forward_micro_batch_size_per_gpu is not None:
        fwd_micro, fwd_budget = s.forward_micro_batch_size_per_gpu, knobs.log_prob_max_token_len_per_gpu
    elif s.forward_max_token_len_per_gpu is not None:
        fwd_micro, fwd_budget = None, s.forward_max_token_len_per_gpu
    elif budget is not None:
        fwd_micro, fwd_budget = None, budget
    else:
        fwd_micro, fwd_budget = micro, knobs.log_prob_max_token_len_per_gpu
    return knobs.model_copy(
        update={
            "micro_batch_size_per_gpu": micro if micro is not None else knobs.micro_batch_size_per_gpu,
            "max_token_len_per_gpu": budget,
            "log_prob_micro_batch_size_per_gpu": fwd_micro,
            "log_prob_max_token_len_per_gpu": fwd_budget,
            "ulysses_sp": 1,
        }
    )


def critic_plan(
    shape: TransformerShape,
    workload: Workload,
    knobs: Knobs,
    *,
    shard_degree: int,
    update_tokens: int,
    forward_tokens: int,
    compute_bytes: int,
) -> CriticPlan:
    """The critic of a PPO job on one rank (tokens from `critic_knobs` through the context's token helpers)."""
    s = workload.critic_settings
    return CriticPlan(
        shape=shape,
        num_params=critic_params(shape),
        shard_degree=shard_degree,
        update_tokens=update_tokens,
        forward_tokens=forward_tokens,
        checkpointing=s.gradient_checkpointing,
        param_offload=knobs.critic_param_offload,
        optimizer_offload=knobs.critic_optimizer_offload,
        reward_model=s.reward_model,
        reward_model_offload=s.reward_model_param_offload,
        compute_bytes=compute_bytes,
    )


def critic_resident_items(plan: CriticPlan | None, phase: str) -> dict[str, int]:
    """The critic's (and reward model's) shards on a training GPU during `phase` (empty without a critic)."""
    if plan is None:
        return {}
    name = _CRITIC_PHASE[phase]
    items = critic_state_items(
        plan.num_params,
        plan.shard_degree,
        name,
        param_offload=plan.param_offload,
        optimizer_offload=plan.optimizer_offload,
    )
    if plan.reward_model:
        rm_phase = "reward" if name == "values" else name
        items.update(
            reward_model_items(plan.num_params, plan.shard_degree, rm_phase, param_offload=plan.reward_model_offload)
        )
    return items


def critic_values_work(plan: CriticPlan) -> dict[str, int]:
    """`compute_values`' working set at its peak (memory/critic.py `critic_values_items`)."""
    return critic_values_items(plan.shape, plan.forward_tokens, plan.compute_bytes)


def critic_update_work(plan: CriticPlan) -> dict[str, int]:
    """`update_critic`'s working set at its peak (memory/critic.py `critic_update_items`)."""
    return critic_update_items(
        plan.shape,
        plan.update_tokens,
        plan.compute_bytes,
        plan.shard_degree,
        checkpointing=plan.checkpointing,
        optimizer_offload=plan.optimizer_offload,
    )


def critic_host_items(plan: CriticPlan | None, workload: Workload, ranks_on_node: int) -> dict[str, int]:
    """Host RAM of a node: the critic's offloaded shards, the reward model's offloaded shard, and (the head
    node's driver) GAE's per-token tensors of the step."""
    if plan is None:
        return {}
    items = {
        "critic_offloaded": critic_host_bytes(
            plan.num_params,
            plan.shard_degree,
            ranks_on_node,
            param_offload=plan.param_offload,
            optimizer_offload=plan.optimizer_offload,
        ),
        "gae_driver_tensors": gae_host_bytes(workload.responses_per_step, workload.response_len_tokens),
    }
    if plan.reward_model and plan.reward_model_offload:
        items["reward_model_offloaded"] = ranks_on_node * -(-plan.num_params // plan.shard_degree) * BF16_BYTES
    return items


def critic_engine_start_bytes(plan: CriticPlan | None) -> int:
    """The critic's shard on the GPU when the rollout engine measures memory: verl initialises the critic
    (and reward model) before the actor and its rollout (ray_trainer.py `init_workers`: critic_wg, ref, rm,
    then actor_rollout_wg 'at the end so that vllm can have a better estimation of kv cache memory');
    Adam states are created at the first step."""
    if plan is None:
        return 0
    params = critic_resident_items(plan, "rollout")
    return params.get("critic_params", 0) + params.get("reward_model_params", 0)
