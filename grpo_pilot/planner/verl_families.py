"""verl's keys of the launch families, read for `from_verl.py`: the critic (PPO), Megatron, LoRA's sync,
SGLang, activation offload. Values come through from_verl's typed accessor (`Values`), defaults from
`FAMILY_DEFAULTS` (verl's today, volcengine/verl b178a3cd: trainer/config/critic/critic.yaml,
dp_critic.yaml, engine/megatron.yaml, rollout/rollout.yaml, model/hf_model.yaml), older ones from
verl_versions.CHANGES.

- critic: `trainer/ppo/utils.py need_critic` — `critic.enable` when set, else `algorithm.adv_estimator ==
  gae`. Its micro-batches: `critic.ppo_micro_batch_size_per_gpu`, or the deprecated global
  `critic.ppo_micro_batch_size` divided by the data-parallel size (fsdp_workers CriticWorker, also before
  verl#136, which multiplied only the actor's and rollout's by n); with `critic.use_dynamic_bsz` (default:
  the actor's flag) `critic.ppo_max_token_len_per_gpu` (32768); `forward_*` for compute_values (default:
  the update's). `critic.model.enable_gradient_checkpointing`, `critic.model.fsdp_config.{param,optimizer}
  _offload`; `reward_model.enable` with `reward_model.model.fsdp_config.param_offload`.
- Megatron: `--config-name=ppo_megatron_trainer` (its actor.strategy is megatron) or `actor.strategy=
  megatron`; `actor.megatron.{tensor,pipeline,virtual_pipeline,context,expert}_model_parallel_size`,
  `sequence_parallel`, `use_distributed_optimizer`, `param_offload`, `optimizer_offload` (`grad_offload`
  follows param_offload: memory/megatron.py), `ref.megatron.param_offload`; recompute from
  `actor.megatron.override_transformer_config.recompute_{granularity,method,num_layers}` (verl since
  c5b189a1a, #2651) or, before, `model.gradient_checkpointing_kwargs.activations_checkpoint_*` when
  `model.enable_gradient_checkpointing` (single_controller/base/megatron/worker.py@cc8fca504 L71–L79: the
  kwargs default to null, so enabling checkpointing alone recomputes nothing). The reference's parallel
  sizes follow the actor's.
- LoRA's sync: `rollout.layered_summon`; under FSDP2 (`actor.strategy=fsdp2`) tensors are gathered one at a
  time, planned as a layered gather.
- activation offload: `model.enable_activation_offload`.
"""

from __future__ import annotations

from typing import Any, Protocol

from grpo_pilot.errors import InputError
from grpo_pilot.planner.critic_settings import CriticSettings

ARR = "actor_rollout_ref."
MEG = ARR + "actor.megatron."
RECOMPUTE_NEW = MEG + "override_transformer_config."
RECOMPUTE_OLD = ARR + "model.gradient_checkpointing_kwargs."

FAMILY_DEFAULTS: dict[str, Any] = {
    "critic.enable": None,
    "critic.strategy": "fsdp",
    "critic.use_dynamic_bsz": None,
    "critic.ppo_max_token_len_per_gpu": 32768,
    "critic.model.enable_gradient_checkpointing": True,
    "critic.model.fsdp_config.param_offload": False,
    "critic.model.fsdp_config.optimizer_offload": False,
    "reward_model.enable": False,
    "reward_model.model.fsdp_config.param_offload": False,
    MEG + "tensor_model_parallel_size": 1,
    MEG + "pipeline_model_parallel_size": 1,
    MEG + "virtual_pipeline_model_parallel_size": None,
    MEG + "context_parallel_size": 1,
    MEG + "expert_model_parallel_size": 1,
    MEG + "sequence_parallel": True,
    MEG + "use_distributed_optimizer": True,
    MEG + "param_offload": False,
    MEG + "optimizer_offload": False,
    ARR + "ref.megatron.param_offload": False,
    ARR + "model.enable_activation_offload": False,
    ARR + "rollout.layered_summon": False,
}


class Values(Protocol):
    """from_verl's typed accessor of the launch's values (duck-typed: from_verl imports this module)."""

    raw: dict[str, Any]

    def get(self, key: str) -> Any: ...
    def integer(self, key: str, value: Any = None) -> int: ...
    def flag(self, key: str) -> bool: ...


def needs_critic(v: Values) -> bool:
    """verl's `need_critic`: critic.enable when given, else the GAE estimator."""
    enable = v.get("critic.enable")
    if enable is not None:
        return v.flag("critic.enable")
    return str(v.get("algorithm.adv_estimator")) == "gae"


def _optional(v: Values, key: str) -> int | None:
    return None if v.raw.get(key) is None else v.integer(key, v.raw[key])


def _global_micro(v: Values, key: str, dp: int, notes: list[str]) -> int | None:
    """A deprecated global critic micro-batch, divided by the data-parallel size (module docstring)."""
    value = _optional(v, key)
    if value is None:
        return None
    per_gpu = value // max(1, dp)
    if per_gpu < 1:
        raise InputError(f"{key}={value} (global) over {dp} data-parallel GPUs is 0 per GPU: verl fails on it.", "")
    notes.append(f"{key}={value} (global): {value} // {dp} = {per_gpu} per GPU")
    return per_gpu


def critic_settings(v: Values, *, dp: int, actor_dynamic: bool, notes: list[str]) -> CriticSettings:
    """The critic's settings of a PPO launch (module docstring)."""
    if str(v.get("critic.strategy")) == "megatron":
        raise InputError(
            "critic.strategy=megatron: a critic trained under Megatron is not modelled (planner/support.py: no "
            "public launch with an outcome to check it).",
            "Plan the critic under FSDP (critic.strategy=fsdp), or a critic-free estimator (grpo).",
        )
    micro = _optional(v, "critic.ppo_micro_batch_size_per_gpu") or _global_micro(
        v, "critic.ppo_micro_batch_size", dp, notes
    )
    forward = _optional(v, "critic.forward_micro_batch_size_per_gpu") or _global_micro(
        v, "critic.forward_micro_batch_size", dp, notes
    )
    dynamic_raw = v.get("critic.use_dynamic_bsz")
    dynamic = actor_dynamic if dynamic_raw is None else v.flag("critic.use_dynamic_bsz")
    if not dynamic and micro is None:
        raise InputError(
            "The critic has neither critic.ppo_micro_batch_size_per_gpu nor use_dynamic_bsz (verl refuses to start).",
            "Set critic.ppo_micro_batch_size_per_gpu.",
        )
    budget = v.integer("critic.ppo_max_token_len_per_gpu") if dynamic else None
    fwd_budget = _optional(v, "critic.forward_max_token_len_per_gpu") if dynamic else None
    if v.raw.get("critic.model.path") and v.raw.get("critic.model.path") != v.raw.get(ARR + "model.path"):
        notes.append("critic.model.path differs from the actor's: the critic is planned with the actor's architecture")
    return CriticSettings(
        micro_batch_size_per_gpu=None if dynamic else micro,
        max_token_len_per_gpu=budget,
        forward_micro_batch_size_per_gpu=None if dynamic else (forward or micro),
        forward_max_token_len_per_gpu=fwd_budget or budget,
        gradient_checkpointing=v.flag("critic.model.enable_gradient_checkpointing"),
        reward_model=v.flag("reward_model.enable"),
        reward_model_param_offload=v.flag("reward_model.model.fsdp_config.param_offload"),
    )


def critic_knob_values(v: Values) -> dict[str, Any]:
    return {
        "critic_param_offload": v.flag("critic.model.fsdp_config.param_offload"),
        "critic_optimizer_offload": v.flag("critic.model.fsdp_config.optimizer_offload"),
    }


def _recompute(v: Values) -> dict[str, Any]:
    """Megatron recompute from the current keys, or verl's older checkpointing kwargs (module docstring)."""
    granularity = v.raw.get(RECOMPUTE_NEW + "recompute_granularity")
    method = v.raw.get(RECOMPUTE_NEW + "recompute_method")
    layers = v.raw.get(RECOMPUTE_NEW + "recompute_num_layers")
    if granularity is None and v.raw.get(ARR + "model.enable_gradient_checkpointing") is True:
        granularity = v.raw.get(RECOMPUTE_OLD + "activations_checkpoint_granularity")
        method = v.raw.get(RECOMPUTE_OLD + "activations_checkpoint_method")
        layers = v.raw.get(RECOMPUTE_OLD + "activations_checkpoint_num_layers")
    granularity = "none" if granularity in (None, "null", "none") else str(granularity)
    if granularity not in ("none", "selective", "full"):
        raise InputError(f"recompute_granularity={granularity[:40]} is not full or selective.", "Fix the override.")
    out: dict[str, Any] = {"megatron_recompute": granularity}
    if granularity == "full":
        method = str(method or "uniform")
        if method not in ("uniform", "block"):
            raise InputError(f"recompute_method={method[:40]} is not uniform or block.", "Fix the override.")
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
            raise InputError(f"recompute_num_layers={str(layers)[:40]} is not a positive integer.", "Fix the override.")
        out.update(megatron_recompute_method=method, megatron_recompute_num_layers=layers or 1)
    return out


def megatron_knob_values(v: Values, notes: list[str]) -> dict[str, Any]:
    """The Megatron knobs of a launch (module docstring)."""
    vpp = v.get(MEG + "virtual_pipeline_model_parallel_size")
    ep = v.integer(MEG + "expert_model_parallel_size")
    if ep > 1:
        notes.append(f"expert_model_parallel_size={ep}")
    knobs = {
        "strategy": "megatron",
        "megatron_tp": v.integer(MEG + "tensor_model_parallel_size"),
        "megatron_pp": v.integer(MEG + "pipeline_model_parallel_size"),
        "megatron_vpp": 1 if vpp is None else v.integer(MEG + "virtual_pipeline_model_parallel_size"),
        "megatron_cp": v.integer(MEG + "context_parallel_size"),
        "megatron_sequence_parallel": v.flag(MEG + "sequence_parallel"),
        "megatron_distributed_optimizer": v.flag(MEG + "use_distributed_optimizer"),
        "param_offload": v.flag(MEG + "param_offload"),
        "optimizer_offload": v.flag(MEG + "optimizer_offload"),
        "ref_param_offload": v.flag(ARR + "ref.megatron.param_offload"),
        "gradient_checkpointing": False,  # not a Megatron setting: recompute is
        **_recompute(v),
    }
    if v.raw.get(ARR + "actor.optim.override_optimizer_config.optimizer_cpu_offload") is True:
        notes.append("Megatron's own CPU optimizer (optimizer_cpu_offload) is not modelled")
    return knobs


def megatron_data_parallel_divisor(v: Values) -> int:
    """GPUs one Megatron data-parallel rank spans (TP × PP × CP): what verl divides global batch keys by."""
    return (
        v.integer(MEG + "tensor_model_parallel_size")
        * v.integer(MEG + "pipeline_model_parallel_size")
        * v.integer(MEG + "context_parallel_size")
    )


def family_knob_values(v: Values, *, strategy: str, has_adapter: bool, notes: list[str]) -> dict[str, Any]:
    """Activation offload and LoRA's layered summon (FSDP2 gathers one tensor at a time: planned layered)."""
    layered = v.flag(ARR + "rollout.layered_summon")
    if has_adapter and strategy == "fsdp2" and not layered:
        notes.append("FSDP2 gathers the adapters one tensor at a time: planned as layered_summon")
        layered = True
    return {"activation_offload": v.flag(ARR + "model.enable_activation_offload"), "layered_summon": layered}
