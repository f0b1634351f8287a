"""Can the engine build this model? transformers' own config validation, where transformers is installed.

`ModelSpec` checks the shapes no attention layer can have (kv heads dividing query heads, ...). A local
`config.json` may still name a `model_type` transformers does not know, or one without a causal-LM
class, or carry a field transformers' own validators refuse (hidden size not a multiple of the heads,
...): `grpo-run` would fail on it after the plan said yes. `check_buildable(cfg, name)` builds the
config exactly as the engine does (`AutoConfig.for_model(model_type, **fields)`, engine/model_factory.py)
and looks the type up in transformers' causal-LM mapping, turning any refusal into an `InputError`.

transformers (and with it torch) is imported lazily, inside the function: `grpo-plan` calls this for
local configs only (bundled ones are known to build), and the planner package never imports this
module. Without transformers the spec's own checks are all there is. Importing transformers costs
seconds, so a config that passed is remembered: the SHA-256 of its canonical JSON and the installed
transformers version (read from the package metadata, without importing it) are recorded in
`$GRPO_PILOT_CACHE_DIR/buildable.json` (default `~/.cache/grpo-pilot`), and the same config under the
same transformers is not checked again. A refusal is never cached.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from grpo_pilot.atomic import atomic_write_text
from grpo_pilot.errors import InputError

CACHE_DIR_ENV = "GRPO_PILOT_CACHE_DIR"
DEFAULT_CACHE_DIR = Path("~/.cache/grpo-pilot")
MAX_CACHED_CONFIGS = 256

# keys of a config.json that are not constructor fields (engine/model_factory.py drops them the same way)
NOT_CONFIG_FIELDS = ("model_type", "architectures", "torch_dtype", "dtype")


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = next((line for line in lines if "Error:" in line), lines[0] if lines else "")
    return f"{type(exc).__name__}: {detail[:300]}"


def _cache_file() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR).expanduser() / "buildable.json"


def _key(cfg: dict[str, Any]) -> str | None:
    """The config's identity under the installed transformers (None when the config is not plain JSON)."""
    try:
        version = importlib.metadata.version("transformers")
        text = json.dumps(cfg, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (importlib.metadata.PackageNotFoundError, TypeError, ValueError):
        return None
    return hashlib.sha256(f"{version}\n{text}".encode()).hexdigest()


def _passed(key: str) -> bool:
    try:
        return key in json.loads(_cache_file().read_text())
    except (OSError, ValueError, TypeError):
        return False  # no cache, or a damaged one: check again


def _remember(key: str) -> None:
    path = _cache_file()
    try:
        known = json.loads(path.read_text()) if path.is_file() else []
        known = [k for k in known if isinstance(k, str) and k != key][-(MAX_CACHED_CONFIGS - 1) :] + [key]
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(known))
    except (OSError, ValueError, TypeError):
        pass  # the cache only saves time: a read-only home directory costs the next run its seconds


def check_buildable(cfg: dict[str, Any], name: str) -> None:
    """`InputError` when transformers cannot build a causal LM from `cfg` (no-op without transformers);
    a config that passed before under the same transformers is not checked again (module docstring)."""
    if not transformers_available():
        return
    key = _key(cfg)
    if key is not None and _passed(key):
        return
    _check(cfg, name)
    if key is not None:
        _remember(key)


def _check(cfg: dict[str, Any], name: str) -> None:
    """transformers' own validation of `cfg` (imports transformers)."""
    import logging

    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers.utils import logging as hf_logging

    model_type = cfg.get("model_type")
    hint = "Fix config.json (or pass the model's own config.json); grpo-run builds the model from it."
    if not isinstance(model_type, str) or not model_type:
        raise InputError(f"The model config '{name}' has no model_type.", 'Add "model_type" (e.g. "qwen2").')
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise InputError(
            f"The model config '{name}' has model_type '{model_type}', which this transformers "
            f"({_version()}) cannot build as a causal language model.",
            "Use a decoder-only model type transformers knows (e.g. llama, mistral, qwen2, qwen3), or upgrade "
            "transformers.",
        )
    fields = {k: v for k, v in cfg.items() if k not in NOT_CONFIG_FIELDS and not k.startswith("_")}
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)  # its warnings about unusual fields are not our message
    try:
        AutoConfig.for_model(model_type, **fields)
    except Exception as exc:  # transformers' validators raise several types (ValueError, strict-dataclass errors)
        raise InputError(f"transformers refuses the model config '{name}' ({_first_line(exc)}).", hint) from None
    finally:
        hf_logging.set_verbosity(previous)


def _version() -> str:
    import transformers

    return f"transformers {transformers.__version__}"
