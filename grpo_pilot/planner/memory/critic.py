"""PPO's critic (GAE) and an optional reward model: a second (and third) model beside the actor.

What verl's critic is (volcengine/verl b178a3cd):
- the actor's architecture as `AutoModelForTokenClassification` with `num_labels = 1`
  (utils/model.py `load_valuehead_model` L621–L632; fsdp_workers.py `_build_critic_model_optimizer`):
  the lm_head is replaced by a value head `score = nn.Linear(h, 1)` with a bias (transformers
  modeling_layers.py `GenericForTokenClassification`, `token_classification_bias` default True);
  `classifier_dropout = 0.0`. Its parameters: the actor's minus an untied lm_head, plus h + 1.
- stored in `critic.model.fsdp_config.model_dtype` (fp32 by default) with its own FSDP sharding over
  the critic's ranks, fp32 grads and Adam: 16 bytes per parameter over D (the actor's 16Ψ).
  `critic.model.fsdp_config.param_offload` / `optimizer_offload`: load-use-offload as verl's actor
  (compute_values loads params; update_critic loads params and optimizer; both offload after).
  `update_critic` ends with `critic_optimizer.zero_grad()` (critic/dp_critic.py L262): no grads outside it.
- its token budgets: `critic.ppo_max_token_len_per_gpu` defaults to 32768, twice the actor's 16384
  (trainer/config/critic/critic.yaml), `forward_max_token_len_per_gpu` to the same; the perf tuning
  guide (docs/perf/perf_tuning.rst L155–L159): "Critic and Reward parameters can be set at least 2× the
  Actor's limits", because a critic has no vocab-sized logits (L117–L118: "the actor model has much larger
  vocab size in the final layer").
- a forward yields one value per token: the head's [T, 1] output in the compute dtype and its fp32 copy;
  the value loss (clipped, `cliprange_value`) works on a few fp32 per-token tensors.

verl's PPO step (trainer/ppo/ray_trainer.py `fit`, L1302–L1610): generate → reward → old log-probs
(actor) → reference log-probs → `compute_values` (critic forward) → `compute_advantage` (GAE,
core_algos.py `compute_gae_advantage_return` L215–L262, run by the driver on CPU tensors: values,
returns, advantages, token-level scores and rewards, log-probs per response token, fp32) →
`update_critic` → `update_actor` (once `trainer.critic_warmup` steps have passed). Colocated, the critic's
resident states (params + Adam unless offloaded) sit on every GPU during the actor's phases.

Reward model (legacy `RewardModelWorker`, trainer/config/reward_model/dp_reward_model.yaml): also a
token-classification model, in bf16 (non-actor roles load in bf16), FSDP-sharded,
`reward_model.model.fsdp_config.param_offload` between its forward passes; forward only.
"""

from __future__ import annotations

from grpo_pilot.planner.memory.activations import (
    forward_activation_bytes,
    head_side_activation_bytes,
    layer_activation_bytes_per_token,
    layer_backward_temporary_bytes,
    recompute_activation_bytes,
    saved_activation_bytes,
)
from grpo_pilot.planner.memory.fsdp import gathered_layers_bytes, layer_reduce_scatter_bytes, root_grad_bytes
from grpo_pilot.planner.memory.model_states import actor_state_bytes
from grpo_pilot.planner.memory.moments import log_prob_peak_items, update_peak_items
from grpo_pilot.planner.memory.optimizer import adam_step_temporary_bytes
from grpo_pilot.planner.memory.shape import TransformerShape
from grpo_pilot.units import FP32_BYTES

VERL_ACTOR_TOKEN_BUDGET = 16384  # actor.ppo_max_token_len_per_gpu default (actor.yaml)
VERL_CRITIC_TOKEN_BUDGET = 32768  # critic.ppo_max_token_len_per_gpu default (critic.yaml)
CRITIC_BUDGET_FACTOR = VERL_CRITIC_TOKEN_BUDGET // VERL_ACTOR_TOKEN_BUDGET  # "at least 2×" (perf_tuning.rst)
VALUE_LOSS_FP32_PER_TOKEN = 6  # vpreds, values, returns, clipped vpreds, two squared errors (dp_critic / core_algos)
# per response token in the driver's batch at compute_advantage: token_level_scores, token_level_rewards,
# values, old_log_probs, ref_log_prob, advantages, returns (fp32)
GAE_FP32_FIELDS = 7
GAE_TRANSIENT_FP32 = 2  # advantages_reversed (one [B] tensor per position) and its torch.stack
CRITIC_PHASES = ("rollout", "log_prob", "ref_log_prob", "values", "critic_update", "actor_update", "weight_sync")


def critic_params(shape: TransformerShape) -> int:
    """The critic's parameters: the actor's without an untied lm_head, plus the h·1 + 1 value head."""
    return shape.num_params - shape.output_layer_params + shape.hidden + 1


def critic_token_budget(actor_token_budget: int) -> int:
    """verl's critic token budget relative to the actor's (2× by default)."""
    return CRITIC_BUDGET_FACTOR * actor_token_budget


def critic_state_items(
    num_params: int, shard_degree: int, phase: str, *, param_offload: bool, optimizer_offload: bool
) -> dict[str, int]:
    """The critic's fp32 shard on one GPU during `phase` (module docstring)."""
    if phase not in CRITIC_PHASES:
        raise ValueError(f"phase must be one of {CRITIC_PHASES}, got {phase!r}")
    master, grads, adam = actor_state_bytes(
        num_params=num_params,
        shard_degree=shard_degree,
        master_bytes=FP32_BYTES,
        grad_bytes=FP32_BYTES,
        adam_bytes=2 * FP32_BYTES,
    )
    params_on = not param_offload or phase in ("values", "critic_update")
    return {
        "critic_params": master if params_on else 0,
        "critic_grads": grads if phase == "critic_update" else 0,
        "critic_optimizer_states": adam if (not optimizer_offload or phase == "critic_update") else 0,
    }


def critic_host_bytes(
    num_params: int, shard_degree: int, ranks_on_node: int, *, param_offload: bool, optimizer_offload: bool
) -> int:
    """Host RAM of a node's offloaded critic shards."""
    master, _, adam = actor_state_bytes(
        num_params=num_params,
        shard_degree=shard_degree,
        master_bytes=FP32_BYTES,
        grad_bytes=FP32_BYTES,
        adam_bytes=2 * FP32_BYTES,
    )
    return ranks_on_node * ((master if param_offload else 0) + (adam if optimizer_offload else 0))


def value_head_bytes(tokens: int, compute_bytes: int, *, training: bool) -> int:
    """The value head's output ([T, 1] in the compute dtype) and its fp32 copy; in training also the
    value-loss temporaries and the head's output gradient."""
    forward = tokens * (compute_bytes + FP32_BYTES)
    if not training:
        return forward
    return forward + tokens * (VALUE_LOSS_FP32_PER_TOKEN * FP32_BYTES + compute_bytes)


def _per_layer_per_token(shape: TransformerShape, c: int) -> int:
    head_dim = shape.qk_norm_dim or 1
    return layer_activation_bytes_per_token(
        hidden=shape.hidden,
        q_dim=shape.q_dim,
        kv_dim=shape.kv_dim,
        intermediate=shape.ffn,
        num_heads=shape.num_heads,
        compute_bytes=c,
        qk_norm=shape.qk_norm_dim > 0,
        num_kv_heads=shape.kv_dim // head_dim,
    )


def critic_values_items(shape: TransformerShape, tokens: int, compute_bytes: int) -> dict[str, int]:
    """Working set of `compute_values` on one rank (FSDP, forward only): the actor's log-prob pass with
    the value head instead of vocab logits (memory/moments.py `log_prob_peak_items`)."""
    c, h = compute_bytes, shape.hidden
    root = c * (shape.embedding_params + h + 1)
    return log_prob_peak_items(
        root_gathered=root,
        gathered_layers=gathered_layers_bytes(shape.params_per_layer, c, unsharded=False),
        layer_forward=forward_activation_bytes(
            tokens=tokens, hidden=h, intermediate=shape.ffn, compute_bytes=c, mask_per_layer=0, bool_mask=0
        ),
        head_side=2 * c * h * tokens,
        logits=value_head_bytes(tokens, c, training=False),
        all_to_all=0,
        embedding_output=c * h * tokens,
    )


def critic_update_items(
    shape: TransformerShape,
    tokens: int,
    compute_bytes: int,
    shard_degree: int,
    *,
    checkpointing: bool,
    optimizer_offload: bool,
) -> dict[str, int]:
    """Working set of `update_critic` on one rank at its peak moment (memory/moments.py `update_peak_items`):
    the actor's update with the value head in place of the logits."""
    c, h = compute_bytes, shape.hidden
    head = h + 1
    per_layer = _per_layer_per_token(shape, c)
    root_grads, root_rs = root_grad_bytes(
        shape.embedding_params, head, compute_bytes=c, reduce_bytes=FP32_BYTES, unsharded=False
    )
    largest = max(shape.embedding_params, h * shape.ffn, h * shape.q_dim)
    return update_peak_items(
        root_gathered=c * (shape.embedding_params + head),
        root_tied=False,
        gathered_layers=gathered_layers_bytes(shape.params_per_layer, c, unsharded=False),
        saved_activations=saved_activation_bytes(
            tokens=tokens,
            num_layers=shape.num_layers,
            per_layer_per_token=per_layer,
            mask_per_layer=0,
            bool_mask=0,
            hidden=h,
            compute_bytes=c,
            checkpointing=checkpointing,
        ),
        head_side_activations=head_side_activation_bytes(tokens, h, c),
        prefetched_layer=c * shape.params_per_layer,
        recompute_activations=recompute_activation_bytes(tokens, per_layer, 0, checkpointing),
        logits=value_head_bytes(tokens, c, training=True),
        layer_backward_temporaries=layer_backward_temporary_bytes(tokens, h, shape.ffn, c),
        head_grad=c * head,
        root_grads=root_grads,
        root_reduce_scatter=root_rs,
        layer_reduce_scatter=layer_reduce_scatter_bytes(shape.params_per_layer, FP32_BYTES, unsharded=False),
        all_to_all=0,
        optimizer_step=adam_step_temporary_bytes(
            -(-critic_params(shape) // shard_degree), largest, on_host=False, single_tensor=False
        )
        if not optimizer_offload
        else 0,
    )


def gae_host_bytes(num_responses: int, response_tokens: int) -> int:
    """Driver host memory of the per-token tensors at `compute_advantage` (module docstring), with GAE's
    transients."""
    return (GAE_FP32_FIELDS + GAE_TRANSIENT_FP32) * FP32_BYTES * num_responses * response_tokens


def reward_model_items(
    num_params: int, shard_degree: int, phase: str, *, param_offload: bool, param_bytes: int = 2
) -> dict[str, int]:
    """The reward model's bf16 shard on one GPU: resident unless offloaded, loaded for its own pass."""
    shard = -(-num_params // shard_degree) * param_bytes
    return {"reward_model_params": shard if (not param_offload or phase == "reward") else 0}
