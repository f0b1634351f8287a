"""The launch families' part of the memory context (context.py step 1), derived once per estimate.

- `actor_states`: one rank's actor states — a full fine-tune's 16Ψ/D (model_states.py), or under LoRA the
  frozen base, the adapters' params, grads and Adam, no reference module (memory/lora_plan.py) — with the
  autocast caches and the per-layer saved activations that go with them;
- `family_parts`: the LoRA plan (Workload.adapter), the critic (Workload.algorithm 'ppo':
  memory/critic_plan.py) and verl's activation offload (`Knobs.activation_offload`:
  memory/activation_offload.py) of this configuration;
- `engine_budget_with_lora`: vLLM's LoRA slots (verl's `enable_lora`) allocated with the model, inside the
  engine's budget: they count with its weights and come out of the KV cache;
- `update_activations`: the update's saved and recomputed activations on the GPU when verl offloads them.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.memory.activation_offload import (
    ActivationOffload,
    activation_offload_bytes,
    hf_layer_saved_tensor_bytes,
)
from grpo_pilot.planner.memory.activations import layer_activation_bytes_per_token
from grpo_pilot.planner.memory.autocast import autocast_cast_params, autocast_weight_cache_bytes
from grpo_pilot.planner.memory.critic_plan import CriticPlan, critic_knobs, critic_plan
from grpo_pilot.planner.memory.lora_plan import LoraPlan, lora_plan
from grpo_pilot.planner.memory.model_states import actor_state_bytes, sharded_bytes
from grpo_pilot.planner.memory.precision import Precision
from grpo_pilot.planner.memory.shape import shape_of
from grpo_pilot.planner.memory.vllm_budget import VllmBudget
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec

TokensOf = Callable[[Knobs], tuple[int, int]]  # knobs → (update, log-prob) tokens per rank (context.py)


class ActorStates(NamedTuple):
    """One training rank's actor (and reference) bytes and what follows from them (module docstring)."""

    master_bytes: int  # trainable parameters' shard (LoRA: the adapters)
    grad_bytes: int
    adam_bytes: int
    ref_bytes: int  # the reference module's shard (0 under LoRA: the actor with adapters disabled)
    frozen_base_bytes: int  # LoRA's frozen base shard (0 for a full fine-tune)
    policy_cast_bytes: int  # autocast's cache in the policy's passes
    ref_cast_bytes: int  # ... in the reference pass
    layer_activation_bytes_per_token: int


class FamilyParts(NamedTuple):
    lora: LoraPlan | None
    critic: CriticPlan | None
    activation_offload: ActivationOffload | None


def _layer_bytes(model: ModelSpec, compute_bytes: int, autocast: bool) -> int:
    return layer_activation_bytes_per_token(
        hidden=model.hidden_size,
        q_dim=model.q_dim,
        kv_dim=model.kv_dim,
        intermediate=model.intermediate_size,
        num_heads=model.num_attention_heads,
        compute_bytes=compute_bytes,
        qk_norm=model.qk_norm,
        num_kv_heads=model.num_kv_heads,
        autocast=autocast,
    )


def actor_states(
    model: ModelSpec,
    prec: Precision,
    *,
    shards: int,
    sharded: bool,
    has_ref: bool,
    lora: LoraPlan | None,
    autocast: bool,
    casts: int,
) -> ActorStates:
    """The actor's states on one rank (module docstring). `autocast`: fp32 weights used in place under bf16
    autocast; `casts`: the parameters it casts in one forward (memory/autocast.py `autocast_cast_params`)."""
    c, layer = prec.compute_bytes, _layer_bytes(model, prec.compute_bytes, autocast)
    if lora is not None:
        # autocast caches only the casts of leaves that require grad: the adapters (aten `cached_cast`); the
        # frozen LM head's cast is made at the logits as a full fine-tune's is (memory/autocast.py
        # `head_weight_cast`: the moments inside the layers leave it out)
        head = casts - autocast_cast_params(model, lm_head=False)
        cast = autocast_weight_cache_bytes(
            lora.adapter_params, weight_bytes=lora.adapter_bytes, compute_bytes=c, sharded=sharded
        ) + autocast_weight_cache_bytes(head, weight_bytes=prec.master_bytes, compute_bytes=c, sharded=sharded)
        return ActorStates(
            master_bytes=lora.adapter_param_bytes,
            grad_bytes=lora.adapter_grad_bytes,
            adam_bytes=lora.adapter_adam_bytes,
            ref_bytes=0,
            frozen_base_bytes=lora.frozen_base_bytes,
            policy_cast_bytes=cast,
            ref_cast_bytes=0,  # adapters disabled: the frozen base is cast per use, never cached
            layer_activation_bytes_per_token=max(0, layer + lora.activation_delta_per_layer_token),
        )
    master, grads, adam = actor_state_bytes(
        num_params=model.num_params,
        shard_degree=shards,
        master_bytes=prec.master_bytes,
        grad_bytes=prec.grad_bytes,
        adam_bytes=prec.adam_bytes,
    )
    cast = autocast_weight_cache_bytes(casts, weight_bytes=prec.master_bytes, compute_bytes=c, sharded=sharded)
    ref_cast = autocast_weight_cache_bytes(casts, weight_bytes=prec.ref_bytes, compute_bytes=c, sharded=sharded)
    return ActorStates(
        master_bytes=master,
        grad_bytes=grads,
        adam_bytes=adam,
        ref_bytes=sharded_bytes(model.num_params, prec.ref_bytes, shards) if has_ref else 0,
        frozen_base_bytes=0,
        policy_cast_bytes=cast,
        ref_cast_bytes=ref_cast if has_ref else 0,
        layer_activation_bytes_per_token=layer,
    )


def activation_offload_of(
    model: ModelSpec, knobs: Knobs, prec: Precision, *, tokens: int, offload_meaningful: bool
) -> ActivationOffload | None:
    """verl's activation offload of one update micro-batch (None when off, or on the cpu pseudo-device)."""
    if not knobs.activation_offload or knobs.strategy != "fsdp" or not offload_meaningful:
        return None
    c = prec.compute_bytes
    return activation_offload_bytes(
        num_layers=model.num_layers,
        tokens=tokens,
        layer_tensor_bytes_per_token=hf_layer_saved_tensor_bytes(
            model.hidden_size,
            model.q_dim,
            model.intermediate_size,
            model.num_attention_heads,
            kv_dim=model.kv_dim,
            compute_bytes=c,
        ),
        checkpoint_input_bytes_per_token=c * model.hidden_size,
        checkpointing=knobs.gradient_checkpointing,
    )


def family_parts(
    model: ModelSpec,
    workload: Workload,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    precision: Precision,
    shards: int,
    sharded: bool,
    tokens_of: TokensOf,
    offload_meaningful: bool,
) -> FamilyParts:
    """LoRA, the critic and activation offload for this configuration (module docstring)."""
    update_tokens, _ = tokens_of(knobs)
    lora = None
    if workload.adapter is not None and workload.adapter.method != "none":
        lora = lora_plan(
            model,
            workload.adapter,
            executor=executor,
            precision=precision,
            shard_degree=shards,
            tokens=update_tokens,
            rollout_tp=knobs.rollout_tp,
            layered_summon=knobs.layered_summon,
        )
    critic = None
    if workload.has_critic:
        critic_update, critic_forward = tokens_of(critic_knobs(workload, knobs))
        critic = critic_plan(
            shape_of(model),
            workload,
            knobs,
            shard_degree=shards,
            update_tokens=critic_update,
            forward_tokens=critic_forward,
            compute_bytes=precision.compute_bytes,
        )
    offload = activation_offload_of(
        model, knobs, precision, tokens=update_tokens, offload_meaningful=offload_meaningful
    )
    return FamilyParts(lora, critic, offload)


def engine_budget_with_lora(budget: VllmBudget | None, lora: LoraPlan | None) -> VllmBudget | None:
    """vLLM's LoRA slots counted with its weights and taken from its KV cache (module docstring)."""
    if budget is None or lora is None or not lora.rollout_slot_bytes:
        return budget
    slots = lora.rollout_slot_bytes
    return budget._replace(weights_bytes=budget.weights_bytes + slots, kv_signed_bytes=budget.kv_signed_bytes - slots)


def update_activations(
    offload: ActivationOffload | None, saved_bytes: int, recompute_bytes: int, head_side_bytes: int
) -> tuple[int, int]:
    """(saved, recomputed) activation bytes of the update on the GPU: as given, or with verl's activation
    offload what stays on the GPU (two layer groups, the recomputed layer) plus the head side."""
    if offload is None:
        return saved_bytes, recompute_bytes
    return offload.gpu_saved_bytes + head_side_bytes, offload.gpu_recompute_bytes
