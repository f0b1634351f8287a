"""Can the engine build this model? transformers' own config validation, where transformers is installed.

`ModelSpec` checks the shapes no attention layer can have (kv heads dividing query heads, ...). A local
`config.json` may still name a `model_type` transformers does not know, or one without a causal-LM
class, or carry a field transformers' own validators refuse (hidden size not a multiple of the heads,
...): `grpo-run` would fail on it after the plan said yes. `check_buildable(cfg, name)` builds the
config exactly as the engine does (`AutoConfig.for_model(model_type, **fields)`, engine/model_factory.py)
and looks the type up in transformers' causal-LM mapping, turning any refusal into an `InputError`.

transformers (and with it torch) is imported lazily, inside the function: `grpo-plan` calls this for
local configs only (bundled ones are known to build), and the planner package never imports this
module. Without transformers the spec's own checks are all there is.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from grpo_pilot.errors import InputError

# keys of a config.json that are not constructor fields (engine/model_factory.py drops them the same way)
NOT_CONFIG_FIELDS = ("model_type", "architectures", "torch_dtype", "dtype")


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = next((line for line in lines if "Error:" in line), lines[0] if lines else "")
    return f"{type(exc).__name__}: {detail[:300]}"


def check_buildable(cfg: dict[str, Any], name: str) -> None:
    """`InputError` when transformers cannot build a causal LM from `cfg` (no-op without transformers)."""
    if not transformers_available():
        return
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
