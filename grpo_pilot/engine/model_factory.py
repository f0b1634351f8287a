"""Build the policy model and tokenizer without any hub access.

- A bundled alias (`qwen2.5-0.5b`) or a local directory / config.json without weights gives a
  randomly initialised model of that exact shape; a local directory with weights loads them.
- Tokenizers are built locally: the directory's own tokenizer files when present, else a
  character-level WordLevel tokenizer (every printable ASCII character is one token).
- A GGUF file (a path ending in .gguf or a packaged alias, `profiles/gguf.py`) gives the pretrained model
  and its tokenizer, both read by transformers' GGUF loader (weights de-quantised to `dtype`).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from grpo_pilot.errors import InputError
from grpo_pilot.profiles.catalog import _configs_dir, resolve_model
from grpo_pilot.profiles.gguf import is_gguf_ref, resolve_gguf_path
from grpo_pilot.profiles.spec import load_hf_config

PAD, EOS, UNK = "<pad>", "<|endoftext|>", "<unk>"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def char_vocab(alphabet: str | None = None) -> dict[str, int]:
    """Special tokens first, then one id per character (default: printable ASCII without \\x0b\\x0c)."""
    chars = alphabet if alphabet is not None else "".join(c for c in string.printable if c not in "\x0b\x0c\r")
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    return vocab


def build_char_tokenizer(alphabet: str | None = None) -> Any:
    """A `PreTrainedTokenizerFast` that maps each character to one token (no merges, no normaliser)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=char_vocab(alphabet), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    fast.padding_side = "left"
    return fast


def _config_dict(model: str) -> tuple[dict[str, Any], Path | None]:
    """The HF config dict for an alias or a path, and the directory if `model` is a local directory."""

    path = Path(model).expanduser()
    if path.exists():
        cfg, _ = load_hf_config(path)
        return cfg, path if path.is_dir() else path.parent
    resolved = resolve_model(model)  # raises InputError with the closest aliases
    cfg = json.loads((_configs_dir() / f"{resolved.resolved}.json").read_text())
    return {k: v for k, v in cfg.items() if not k.startswith("_")}, None


def _gguf_location(model: str) -> tuple[str, str]:
    """(directory, file name) of a GGUF model, as transformers' `gguf_file=` loading takes them."""

    path = resolve_gguf_path(model).resolve()
    return str(path.parent), path.name


def _quiet_transformers() -> Any:
    """Context in which transformers' own progress bars (GGUF de-quantisation, weight loading) stay off."""
    import contextlib

    from transformers.utils import logging as hf_logging

    @contextlib.contextmanager
    def quiet() -> Any:
        import functools

        from transformers import modeling_gguf_pytorch_utils as gguf_utils

        was_enabled = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        bar = gguf_utils.tqdm  # the GGUF loader uses plain tqdm, which the transformers switch does not reach
        gguf_utils.tqdm = functools.partial(bar, disable=True)
        try:
            yield
        finally:
            gguf_utils.tqdm = bar
            if was_enabled:
                hf_logging.enable_progress_bar()

    return quiet()


def build_gguf_model(model: str, *, dtype: str = "float32") -> Any:
    """The pretrained model in a GGUF file, de-quantised to `dtype` by transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    directory, filename = _gguf_location(model)
    with _quiet_transformers():
        try:
            net = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=getattr(torch, dtype))
        except (ValueError, OSError, KeyError, RuntimeError) as exc:
            raise InputError(
                f"transformers could not load the GGUF model '{model}' ({type(exc).__name__}: {exc}).",
                "Check that the 'gguf' package is installed and the file is a complete GGUF model.",
            ) from exc
    # the weights are plain de-quantised tensors now; without this, save_pretrained (the vLLM rollout's
    # model directory) refuses the model as "quantized with GGUF and not serializable"
    quantizer = getattr(net, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(net)
    return net


def build_gguf_tokenizer(model: str) -> Any:
    """The tokenizer stored in a GGUF file (left padding; pad = eos when the file names no pad token)."""
    from transformers import AutoTokenizer

    directory, filename = _gguf_location(model)
    with _quiet_transformers():
        tok = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def has_weights(directory: Path | None) -> bool:
    return directory is not None and any((directory / f).exists() for f in WEIGHT_FILES)


def weights_directory(model: str) -> str | None:
    """The local directory holding `model`'s weights (what `build_model` loads), or None (alias, config only, GGUF)."""

    if is_gguf_ref(model):
        return None
    _, directory = _config_dict(model)
    return str(directory) if has_weights(directory) else None


def build_model(model: str, *, seed: int = 0, dtype: str = "float32", vocab_size: int | None = None) -> Any:
    """Load weights from a local directory when it has them; otherwise a seeded random init of the shape.

    `vocab_size` overrides the config's vocabulary (used to fit a random model to a local tokenizer).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if is_gguf_ref(model):
        return build_gguf_model(model, dtype=dtype)
    cfg_dict, directory = _config_dict(model)
    torch_dtype = getattr(torch, dtype)
    if has_weights(directory):
        return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch_dtype)
    cfg_dict = dict(cfg_dict)
    model_type = cfg_dict.pop("model_type", None)
    if model_type is None:
        raise InputError(
            f"The config of '{model}' has no model_type.", 'Add "model_type" (e.g. "qwen2") to config.json.'
        )
    if vocab_size is not None:
        cfg_dict["vocab_size"] = vocab_size
    cfg_dict.pop("architectures", None)
    cfg_dict.pop("torch_dtype", None)
    config = AutoConfig.for_model(model_type, **cfg_dict)
    torch.manual_seed(seed)
    net = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    return net


def build_tokenizer(model: str) -> Any:
    """The directory's tokenizer files if it has them, else the local character tokenizer."""
    from transformers import AutoTokenizer

    if is_gguf_ref(model):
        return build_gguf_tokenizer(model)
    _, directory = _config_dict(model)
    if directory is not None and (
        (directory / "tokenizer.json").exists() or (directory / "tokenizer_config.json").exists()
    ):
        if _generic_tokenizer_json(directory):
            # a plain tokenizer.json (e.g. the character tokenizer saved by save_model_dir): load it as
            # written; AutoTokenizer would pick the class of the config's model type (Qwen2Tokenizer for
            # qwen2) and rebuild its own byte-level pre-tokenizer around the vocabulary
            from transformers import PreTrainedTokenizerFast

            tok = PreTrainedTokenizerFast.from_pretrained(str(directory))
        else:
            tok = AutoTokenizer.from_pretrained(str(directory))
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "left"
        return tok
    return build_char_tokenizer()


GENERIC_TOKENIZER_CLASSES = (
    "TokenizersBackend",
    "PreTrainedTokenizerFast",
)  # what transformers writes for a bare tokenizer.json


def _generic_tokenizer_json(directory: Path) -> bool:
    """Whether `directory` holds a tokenizer.json saved by a generic fast tokenizer (no model-specific class)."""
    config = directory / "tokenizer_config.json"
    if not (directory / "tokenizer.json").exists() or not config.exists():
        return False
    try:
        return json.loads(config.read_text()).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES
    except (OSError, ValueError, AttributeError):
        return False


def save_model_dir(net: Any, tokenizer: Any, directory: str | Path) -> Path:
    """Write config, weights and tokenizer to `directory` (what vLLM needs to start).

    In a torch.distributed process transformers' `save_pretrained` writes only on global rank 0, but every
    worker starts its own engine from its own directory: there the weights are written directly
    (safetensors, tied tensors once, as transformers does).
    """
    import torch.distributed as dist

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if dist.is_initialized():
        from safetensors.torch import save_model

        net.config.save_pretrained(str(out))
        save_model(net, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        with _quiet_transformers():  # no "Writing model shards" bar at every vLLM start
            net.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
