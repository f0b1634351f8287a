"""The critic a PPO (GAE) job trains beside the actor: what the user (or the launch) fixes about it.

verl's critic (trainer/config/critic/critic.yaml and dp_critic.yaml, volcengine/verl b178a3cd): the actor's
architecture as a token classifier (`critic.model.path`, usually the actor's), fp32 FSDP states over every
training GPU, its own micro-batches — `critic.ppo_micro_batch_size_per_gpu` sequences, or with
`critic.use_dynamic_bsz` (defaults to the actor's flag) packed into `critic.ppo_max_token_len_per_gpu`
tokens (32768 = twice the actor's default 16384; the perf guide, docs/perf/perf_tuning.rst L155–L159:
"Critic and Reward parameters can be set at least 2× the Actor's limits") — for `update_critic`, and
`critic.forward_micro_batch_size_per_gpu` / `forward_max_token_len_per_gpu` (default: the update's) for
`compute_values`; `critic.model.enable_gradient_checkpointing` (True since verl 0.4; False in verl 0.1's
ppo_trainer.yaml, which TinyZero-era launches run). Its offloads (`critic.model.fsdp_config.param_offload`,
`optimizer_offload`) are search knobs (`Knobs.critic_param_offload`, `critic_optimizer_offload`).

A field left None follows the actor's setting: verl's defaults give the critic twice the actor's token budget
(32768 beside 16384; memory/critic.py `CRITIC_BUDGET_FACTOR`), and a plan keeps that ratio as the search moves
the actor's budget (`--emit verl` writes the critic's budget explicitly); with fixed micro-batches the
critic takes the actor's micro-batch.
"""

from __future__ import annotations

from pydantic import Field

from grpo_pilot.models import Frozen


class CriticSettings(Frozen):
    """The critic's batching and memory settings (module docstring); None = derived from the actor's."""

    micro_batch_size_per_gpu: int | None = Field(
        default=None, ge=1, description="Sequences per critic update micro-batch (critic.ppo_micro_batch_size_per_gpu)."
    )
    max_token_len_per_gpu: int | None = Field(
        default=None,
        ge=1,
        description="Token budget per critic update micro-batch (critic.ppo_max_token_len_per_gpu with "
        "use_dynamic_bsz); None with micro_batch_size_per_gpu None: twice the actor's budget or micro-batch.",
    )
    forward_micro_batch_size_per_gpu: int | None = Field(
        default=None, ge=1, description="Sequences per compute_values micro-batch (None: the update's)."
    )
    forward_max_token_len_per_gpu: int | None = Field(
        default=None, ge=1, description="Token budget per compute_values micro-batch (None: the update's)."
    )
    gradient_checkpointing: bool = Field(
        default=True, description="critic.model.enable_gradient_checkpointing (verl default True since 0.4)."
    )
    reward_model: bool = Field(
        default=False,
        description="A model-based reward (verl reward_model.enable): a bf16 token classifier of the actor's "
        "architecture, FSDP-sharded, forward only.",
    )
    reward_model_param_offload: bool = Field(
        default=False, description="reward_model.model.fsdp_config.param_offload between its passes."
    )
