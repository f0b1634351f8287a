"""Bundled model configs (HF `config.json` shapes under `configs/`) and their short aliases.

Each bundled file holds the architecture fields of the model's published `config.json` plus
`_name_or_path` (the hub id) and `_published_params` (the model card's rounded count, for tests).
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.profiles.gguf import gguf_spec, is_gguf_ref, packaged_hub_id
from grpo_pilot.profiles.spec import ModelSpec, load_hf_config, spec_from_hf_config

# Short aliases: a size without a version means the newest dense family that has that size
# (Qwen3 over Qwen2.5, Llama 3.1 over 3.2 where both exist). The resolved name is always shown.
SHORT_ALIASES: dict[str, str] = {
    "qwen-0.5b": "qwen2.5-0.5b",
    "qwen-0.6b": "qwen3-0.6b",
    "qwen-1.5b": "qwen2.5-1.5b",
    "qwen-1.7b": "qwen3-1.7b",
    "qwen-3b": "qwen2.5-3b",
    "qwen-4b": "qwen3-4b",
    "qwen-7b": "qwen2.5-7b",
    "qwen-8b": "qwen3-8b",
    "qwen-14b": "qwen3-14b",
    "qwen-32b": "qwen3-32b",
    "qwen-72b": "qwen2.5-72b",
    "llama-1b": "llama-3.2-1b",
    "llama-3b": "llama-3.2-3b",
    "llama-8b": "llama-3.1-8b",
    "llama-70b": "llama-3.1-70b",
    "llama-405b": "llama-3.1-405b",
    "r1-distill-qwen-1.5b": "deepseek-r1-distill-qwen-1.5b",
    "r1-distill-qwen-7b": "deepseek-r1-distill-qwen-7b",
    "r1-distill-qwen-14b": "deepseek-r1-distill-qwen-14b",
    "r1-distill-qwen-32b": "deepseek-r1-distill-qwen-32b",
}


class ResolvedModel(Frozen):
    """A model the user named, and what it resolved to."""

    requested: str
    resolved: str
    hub_id: str | None
    published_params: str | None
    spec: ModelSpec
    # the config's `torch_dtype` (`dtype` since transformers v5): what from_pretrained(dtype="auto") loads
    checkpoint_dtype: str | None = None


def _config_dtype(cfg: dict) -> str | None:
    value = cfg.get("torch_dtype", cfg.get("dtype"))
    return value if isinstance(value, str) else None


def _configs_dir() -> Path:
    return Path(str(resources.files("grpo_pilot.profiles") / "configs"))


@lru_cache(maxsize=1)
def bundled_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in _configs_dir().glob("*.json")))


def all_aliases() -> tuple[str, ...]:
    return tuple(sorted(set(bundled_names()) | set(SHORT_ALIASES)))


def _normalise(name: str) -> str:
    key = name.strip().lower().split("/")[-1]
    key = re.sub(r"[\s_]+", "-", key)
    for suffix in ("-instruct", "-base", "-chat"):  # fine-tuned variants keep the base model's shape
        key = key.replace(suffix, "")
    return key


@lru_cache(maxsize=None)
def _load_bundled(canonical: str) -> tuple[dict, ModelSpec]:
    cfg = json.loads((_configs_dir() / f"{canonical}.json").read_text())
    hub_id = cfg.get("_name_or_path", canonical)
    return cfg, spec_from_hf_config(cfg, name=hub_id.split("/")[-1])


def resolve_model(name: str) -> ResolvedModel:
    """Resolve a bundled alias, a hub id of a bundled model, a local HF directory / config.json, or a GGUF file
    (a path ending in .gguf, or a packaged alias such as smollm2-135m-gguf; see profiles/gguf.py)."""
    if is_gguf_ref(name):
        path, spec = gguf_spec(name)
        return ResolvedModel(
            requested=name, resolved=str(path), hub_id=packaged_hub_id(name), published_params=None, spec=spec
        )
    path = Path(name).expanduser()
    if path.exists():
        cfg, display = load_hf_config(path)
        return ResolvedModel(
            requested=name,
            resolved=str(path),
            hub_id=None,
            published_params=None,
            spec=spec_from_hf_config(cfg, display),
            checkpoint_dtype=_config_dtype(cfg),
        )
    key = _normalise(name)
    canonical = SHORT_ALIASES.get(key, key)
    if canonical not in bundled_names():
        close = difflib.get_close_matches(key, all_aliases(), n=4, cutoff=0.5)
        suggestion = f"Closest: {', '.join(close)}. " if close else ""
        raise InputError(
            f"Unknown model '{name}'.",
            f"{suggestion}Use a bundled alias (`grpo-plan --list-models`), a path to an HF model directory or "
            "config.json, or a GGUF file.",
        )
    cfg, spec = _load_bundled(canonical)
    return ResolvedModel(
        requested=name,
        resolved=canonical,
        hub_id=cfg.get("_name_or_path"),
        published_params=cfg.get("_published_params"),
        spec=spec,
        checkpoint_dtype=_config_dtype(cfg),
    )
