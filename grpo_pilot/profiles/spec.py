"""`ModelSpec`: what a decoder-only transformer *is*, read from a Hugging Face `config.json`.

Parameter counts are computed from the architecture (memory-model.md §1), never from a rounded
marketing number: Qwen2/2.5 have q/k/v biases and no o_proj bias; Qwen3 drops the qkv bias and adds
per-head q/k RMSNorm (2·d per layer); Llama has no attention bias; MLPs are SwiGLU (gate, up, down).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from grpo_pilot.errors import InputError
from grpo_pilot.inputs import read_json_file
from grpo_pilot.models import Frozen

# Sanity bounds on config.json sizes: far above every published model (the largest dense models have
# hidden 16384-25600, ~130 layers, 128 heads, vocabularies of ~256k, contexts of 10M tokens), low enough
# that the estimates stay exact integers and an absurd or corrupted file is refused by name.
SIZE_BOUNDS: dict[str, int] = {
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 1 << 12,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12,
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 30,
    "num_experts": 1 << 14,
    "num_experts_per_tok": 1 << 14,
    "moe_intermediate_size": 1 << 20,
    "shared_expert_intermediate_size": 1 << 20,
}


class ModelSpec(Frozen):
    """Architecture numbers of a dense or MoE decoder-only causal LM."""

    name: str = Field(description="Display name, e.g. 'Qwen2.5-32B' or the local directory name.")
    architecture: str = Field(description="HF architecture class, e.g. 'Qwen2ForCausalLM'.")
    model_type: str = Field(description="HF model_type, e.g. 'qwen2', 'qwen3', 'llama'.")
    hidden_size: int = Field(gt=0, le=SIZE_BOUNDS["hidden_size"], description="h: width of the residual stream.")
    intermediate_size: int = Field(
        gt=0, le=SIZE_BOUNDS["intermediate_size"], description="I: SwiGLU MLP width (dense layers)."
    )
    num_layers: int = Field(gt=0, le=SIZE_BOUNDS["num_hidden_layers"], description="L: decoder layers.")
    num_attention_heads: int = Field(gt=0, le=SIZE_BOUNDS["num_attention_heads"], description="a: query heads.")
    num_kv_heads: int = Field(gt=0, le=SIZE_BOUNDS["num_key_value_heads"], description="kv: key/value heads (GQA).")
    head_dim: int = Field(
        gt=0, le=SIZE_BOUNDS["head_dim"], description="d: per-head width; a·d may differ from h (Qwen3)."
    )
    vocab_size: int = Field(
        gt=0, le=SIZE_BOUNDS["vocab_size"], description="V: embedding rows (padded vocab as in config.json)."
    )
    tie_word_embeddings: bool = Field(description="lm_head shares the embedding matrix.")
    qkv_bias: bool = Field(description="q/k/v projections carry biases (Qwen2/2.5).")
    qk_norm: bool = Field(description="Per-head RMSNorm on q and k (Qwen3).")
    max_position_embeddings: int = Field(
        gt=0, le=SIZE_BOUNDS["max_position_embeddings"], description="Longest context the model supports."
    )
    num_experts: int = Field(default=0, ge=0, description="Routed experts per MoE layer (0 = dense).")
    num_experts_per_tok: int = Field(default=0, ge=0, description="Experts activated per token.")
    moe_intermediate_size: int = Field(default=0, ge=0, description="Width of one routed expert's MLP.")
    shared_expert_intermediate_size: int = Field(
        default=0, ge=0, description="Width of the shared expert MLP (Qwen2-MoE), 0 if none."
    )

    @model_validator(mode="after")
    def _buildable(self) -> "ModelSpec":
        """Shapes no attention or MoE layer can have (the spec's own checks; transformers adds its own in
        `profiles/buildable.py`)."""
        heads, kv = self.num_attention_heads, self.num_kv_heads
        if kv > heads or heads % kv:
            raise ValueError(
                f"num_key_value_heads = {kv} does not divide num_attention_heads = {heads} (grouped-query "
                "attention gives every kv head a whole group of query heads)"
            )
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok = {self.num_experts_per_tok} must be between 1 and num_experts = "
                f"{self.num_experts}"
            )
        if self.num_experts and not self.moe_intermediate_size:
            raise ValueError("an MoE model (num_experts > 0) needs moe_intermediate_size > 0")
        return self

    # ---- derived counts (computed, never stored) ----
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_params_per_layer(self) -> int:
        h = self.hidden_size
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return weights + bias + qk_norm

    @property
    def mlp_params_per_layer(self) -> int:
        h = self.hidden_size
        if not self.is_moe:
            return 3 * h * self.intermediate_size
        router = h * self.num_experts
        experts = self.num_experts * 3 * h * self.moe_intermediate_size
        shared = 3 * h * self.shared_expert_intermediate_size
        shared_gate = h if self.shared_expert_intermediate_size else 0
        return router + experts + shared + shared_gate

    @property
    def active_mlp_params_per_layer(self) -> int:
        """MLP parameters a token touches (all of them for dense; top-k experts for MoE)."""
        if not self.is_moe:
            return self.mlp_params_per_layer
        h = self.hidden_size
        return (
            h * self.num_experts
            + self.num_experts_per_tok * 3 * h * self.moe_intermediate_size
            + 3 * h * self.shared_expert_intermediate_size
        )

    @property
    def params_per_layer(self) -> int:
        """One decoder layer: attention + MLP + two RMSNorms."""
        return self.attention_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Exact total: embeddings + layers + final norm + untied lm_head."""
        return self.embedding_params + self.num_layers * self.params_per_layer + self.hidden_size + self.lm_head_params

    @property
    def num_active_params(self) -> int:
        """Parameters used per token (differs from num_params only for MoE)."""
        dense_part = self.num_params - self.num_layers * self.mlp_params_per_layer
        return dense_part + self.num_layers * self.active_mlp_params_per_layer


def kv_bytes_per_token(
    *, num_layers: int, num_kv_heads: int, head_dim: int, tensor_parallel: int, kv_bytes: int
) -> int:
    """KV-cache bytes one token occupies on one GPU of a t-way tensor-parallel replica: 2 (K and V) · L ·
    ceil(kv_heads / t) · d · bytes; once t exceeds the kv heads every rank holds one (replicated) head
    (vLLM `QKVParallelLinear`; its `FullAttentionSpec.page_size_bytes` per token). The planner sizes KV caches
    with it and the engine sizes its decode buffers with it: a model fact, kept with the model's shape."""
    heads_per_gpu = max(1, -(-num_kv_heads // tensor_parallel))
    return 2 * num_layers * heads_per_gpu * head_dim * kv_bytes


EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


class ConfigProblem(ValueError):
    """A config.json field this tool cannot use; `field` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field '{field}' {problem}")
        self.field = field


def _size(cfg: dict[str, Any], *keys: str, default: int | None = None, minimum: int = 1) -> int:
    """An integer size field (the first of `keys` present): a JSON integer (or an integral number such as
    4096.0) within [minimum, SIZE_BOUNDS]; booleans, strings, fractions and absurd values are refused."""
    key = next((k for k in keys if cfg.get(k) is not None), keys[0])
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ConfigProblem(key, "is missing")
        return default
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral:
        raise ConfigProblem(key, f"must be an integer, got {value!r}")
    number = int(value)
    bound = SIZE_BOUNDS.get(keys[0], 1 << 30)
    if not minimum <= number <= bound:
        raise ConfigProblem(key, f"= {number} is outside [{minimum}, {bound}]")
    return number


def _spec_fields(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """The `ModelSpec` fields of an HF config dict (`ConfigProblem` for a field that cannot be used)."""
    for key in REQUIRED_KEYS:
        if cfg.get(key) is None:
            raise ConfigProblem(key, "is missing")
    model_type = cfg.get("model_type", "unknown")
    if not isinstance(model_type, str) or not model_type.strip():
        raise ConfigProblem("model_type", f"must be a non-empty string, got {model_type!r}")
    archs = cfg.get("architectures") or [f"{model_type}ForCausalLM"]
    if not isinstance(archs, list) or not isinstance(archs[0], str):
        raise ConfigProblem("architectures", f"must be a list of class names, got {archs!r}")
    hidden = _size(cfg, "hidden_size")
    heads = _size(cfg, "num_attention_heads")
    if cfg.get("head_dim") is None and hidden % heads:
        raise ConfigProblem(
            "hidden_size", f"= {hidden} is not divisible by num_attention_heads = {heads} (and no head_dim is given)"
        )
    num_experts = _size(cfg, *EXPERT_KEYS, default=0, minimum=0)
    moe = num_experts > 0
    flags = {}
    for key, default in (("attention_bias", model_type in ("qwen2", "qwen2_moe")), ("tie_word_embeddings", False)):
        value = cfg.get(key)
        if value is not None and not isinstance(value, bool):
            raise ConfigProblem(key, f"must be true or false, got {value!r}")
        flags[key] = default if value is None else value
    return dict(
        name=name,
        architecture=archs[0],
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=_size(cfg, "intermediate_size"),
        num_layers=_size(cfg, "num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=_size(cfg, "num_key_value_heads", default=heads),
        head_dim=_size(cfg, "head_dim", default=hidden // heads),
        vocab_size=_size(cfg, "vocab_size"),
        tie_word_embeddings=flags["tie_word_embeddings"],
        qkv_bias=flags["attention_bias"],
        qk_norm=model_type.startswith("qwen3"),
        max_position_embeddings=_size(cfg, "max_position_embeddings", default=32768),
        num_experts=num_experts,
        num_experts_per_tok=_size(cfg, "num_experts_per_tok", default=0, minimum=0) if moe else 0,
        moe_intermediate_size=_size(cfg, "moe_intermediate_size", default=0, minimum=0) if moe else 0,
        shared_expert_intermediate_size=_size(cfg, "shared_expert_intermediate_size", default=0, minimum=0)
        if moe
        else 0,
    )


def spec_from_hf_config(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Build a `ModelSpec` from the dict of an HF `config.json` (Qwen2/2.5/3, Llama, Mistral, MoE)."""
    fix = (
        "Pass a config.json with integer hidden_size, intermediate_size, num_hidden_layers, num_attention_heads "
        "and vocab_size (and num_key_value_heads dividing num_attention_heads)."
    )
    try:
        fields = _spec_fields(cfg, name)
    except ConfigProblem as exc:
        raise InputError(
            f"The model config '{name}' is not a decoder-only HF config this tool understands: {exc}.", fix
        ) from None
    try:
        return ModelSpec(**fields)
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise InputError(f"The model config '{name}' describes a model no engine can build: {problem}.", fix) from None


def load_hf_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """Read `config.json` from a file or a model directory; returns (dict, display name)."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    hint = "Pass a bundled alias (see `grpo-plan --list-models`) or a path to an HF model directory or config.json."
    if not file.exists():
        raise InputError(f"No config.json at '{path}'.", hint)
    cfg = read_json_file(file, "model config", hint="Pass the model's HF config.json.")
    if not isinstance(cfg, dict):
        raise InputError(f"'{file}' does not hold a JSON object.", "Pass the model's HF config.json.")
    name = p.name if p.is_dir() else (p.parent.name or p.stem)
    return cfg, name
