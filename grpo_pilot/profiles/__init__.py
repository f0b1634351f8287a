"""What a model is: `ModelSpec` from an HF config, bundled configs and aliases."""

from grpo_pilot.profiles.catalog import ResolvedModel, all_aliases, bundled_names, resolve_model
from grpo_pilot.profiles.spec import ModelSpec, load_hf_config, spec_from_hf_config

__all__ = [
    "ModelSpec",
    "ResolvedModel",
    "all_aliases",
    "bundled_names",
    "load_hf_config",
    "resolve_model",
    "spec_from_hf_config",
]
