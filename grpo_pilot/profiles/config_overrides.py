"""HF config keys a launch sets on the model (verl `actor_rollout_ref.model.override_config`), on a `ModelSpec`.

verl applies `override_config` to the model's HF config before building the actor, the reference and
the rollout (`update_model_config(..., override_config_kwargs=...)` in verl/workers/fsdp_workers.py), so
`+actor_rollout_ref.model.override_config.max_position_embeddings=32768` lengthens the context the run
checks: vLLM's `max_model_len` defaults to it (verl/workers/rollout/vllm_rollout/vllm_async_server.py@b178a3cd5
lines 112-118). Keys that are `ModelSpec` fields (by their HF names) give a copy of the spec with the field
changed, validated as a config.json would be; `rope_scaling` is noted (verl sets max_model_len from
max_position_embeddings, not from the RoPE factor); other keys do not change memory or time here and are
noted as ignored.
"""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import ValidationError

from grpo_pilot.errors import InputError
from grpo_pilot.profiles.spec import SIZE_BOUNDS, ModelSpec

# HF config.json name → ModelSpec field (profiles/spec.py `_spec_fields` reads the same names)
SPEC_FIELDS: dict[str, str] = {
    "max_position_embeddings": "max_position_embeddings",
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
    "tie_word_embeddings": "tie_word_embeddings",
    "attention_bias": "qkv_bias",
    "num_experts": "num_experts",
    "num_local_experts": "num_experts",
    "n_routed_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_tok",
    "moe_intermediate_size": "moe_intermediate_size",
    "shared_expert_intermediate_size": "shared_expert_intermediate_size",
}
_FLAGS = ("tie_word_embeddings", "attention_bias")
_WHERE = "actor_rollout_ref.model.override_config."


def _checked(key: str, value: Any) -> Any:
    if key in _FLAGS:
        if not isinstance(value, bool):
            raise InputError(f"{_WHERE}{key}={value!r:.60} is not true or false.", "Fix the override.")
        return value
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral:
        raise InputError(f"{_WHERE}{key}={value!r:.60} is not an integer.", "Fix the override.")
    bound = SIZE_BOUNDS.get(key, 1 << 30)
    if not 0 <= int(value) <= bound:
        raise InputError(f"{_WHERE}{key}={int(value)} is outside [0, {bound}].", "Fix the override.")
    return int(value)


def apply_config_overrides(spec: ModelSpec, overrides: Mapping[str, Any]) -> tuple[ModelSpec, list[str]]:
    """(the spec with the overridden fields, notes); an override no model can have is an InputError."""
    fields: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in overrides.items():
        if key in SPEC_FIELDS:
            fields[SPEC_FIELDS[key]] = _checked(key, value)
            notes.append(f"model config: {key} = {fields[SPEC_FIELDS[key]]} ({_WHERE}{key})")
        elif key == "rope_scaling":
            notes.append(
                f"model config: rope_scaling = {value!r:.80} noted; the context checked stays max_position_embeddings "
                f"= {fields.get('max_position_embeddings', spec.max_position_embeddings)} (verl sets vLLM's "
                f"max_model_len from it; set {_WHERE}max_position_embeddings for a longer one)"
            )
        else:
            notes.append(f"model config: {key} ignored (it does not change memory or time in the planner)")
    if not fields:
        return spec, notes
    try:
        return ModelSpec(**{**spec.model_dump(), **fields}), notes
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise InputError(
            f"The launch's {_WHERE}* overrides give a model no engine can build: {problem}.", "Fix the overrides."
        ) from None
