"""`ModelSpec`: what a decoder-only transformer *is*, read from a Hugging Face `config.json`.

Parameter counts are computed from the architecture (memory-model.md §1), never from a rounded
marketing number: Qwen2/2.5 have q/k/v biases and no o_proj bias; Qwen3 drops the qkv bias and adds
per-head q/k RMSNorm (2·d per layer); Llama has no attention bias; MLPs are SwiGLU (gate, up, down).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen


class ModelSpec(Frozen):
    """Architecture numbers of a dense or MoE decoder-only causal LM."""

    name: str = Field(description="Display name, e.g. 'Qwen2.5-32B' or the local directory name.")
    architecture: str = Field(description="HF architecture class, e.g. 'Qwen2ForCausalLM'.")
    model_type: str = Field(description="HF model_type, e.g. 'qwen2', 'qwen3', 'llama'.")
    hidden_size: int = Field(gt=0, description="h: width of the residual stream.")
    intermediate_size: int = Field(gt=0, description="I: SwiGLU MLP width (dense layers).")
    num_layers: int = Field(gt=0, description="L: decoder layers.")
    num_attention_heads: int = Field(gt=0, description="a: query heads.")
    num_kv_heads: int = Field(gt=0, description="kv: key/value heads (GQA).")
    head_dim: int = Field(gt=0, description="d: per-head width; a·d may differ from h (Qwen3).")
    vocab_size: int = Field(gt=0, description="V: embedding rows (padded vocab as in config.json).")
    tie_word_embeddings: bool = Field(description="lm_head shares the embedding matrix.")
    qkv_bias: bool = Field(description="q/k/v projections carry biases (Qwen2/2.5).")
    qk_norm: bool = Field(description="Per-head RMSNorm on q and k (Qwen3).")
    max_position_embeddings: int = Field(gt=0, description="Longest context the model supports.")
    num_experts: int = Field(default=0, ge=0, description="Routed experts per MoE layer (0 = dense).")
    num_experts_per_tok: int = Field(default=0, ge=0, description="Experts activated per token.")
    moe_intermediate_size: int = Field(default=0, ge=0, description="Width of one routed expert's MLP.")
    shared_expert_intermediate_size: int = Field(
        default=0, ge=0, description="Width of the shared expert MLP (Qwen2-MoE), 0 if none."
    )

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


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def spec_from_hf_config(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Build a `ModelSpec` from the dict of an HF `config.json` (Qwen2/2.5/3, Llama, Mistral, MoE)."""
    try:
        model_type = str(cfg.get("model_type", "unknown"))
        archs = cfg.get("architectures") or [f"{model_type}ForCausalLM"]
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(_first(cfg, "num_key_value_heads", default=heads))
        head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
        qkv_bias = bool(_first(cfg, "attention_bias", default=model_type in ("qwen2", "qwen2_moe")))
        qk_norm = model_type.startswith("qwen3")
        num_experts = int(_first(cfg, "num_experts", "num_local_experts", "n_routed_experts", default=0))
        return ModelSpec(
            name=name,
            architecture=str(archs[0]),
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=int(cfg["vocab_size"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            max_position_embeddings=int(_first(cfg, "max_position_embeddings", default=32768)),
            num_experts=num_experts,
            num_experts_per_tok=int(_first(cfg, "num_experts_per_tok", default=0)) if num_experts else 0,
            moe_intermediate_size=int(_first(cfg, "moe_intermediate_size", default=0)) if num_experts else 0,
            shared_expert_intermediate_size=int(_first(cfg, "shared_expert_intermediate_size", default=0))
            if num_experts
            else 0,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"The model config '{name}' is not a decoder-only HF config this tool understands ({exc!r} missing or malformed).",
            "Pass a config.json with hidden_size, intermediate_size, num_hidden_layers, num_attention_heads and vocab_size.",
        ) from None


def load_hf_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """Read `config.json` from a file or a model directory; returns (dict, display name)."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    if not file.is_file():
        raise InputError(
            f"No config.json at '{path}'.",
            "Pass a bundled alias (see `grpo-plan --list-models`) or a path to an HF model directory or config.json.",
        )
    try:
        cfg = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"'{file}' is not valid JSON ({exc}).", "Pass the model's HF config.json.") from None
    if not isinstance(cfg, dict):
        raise InputError(f"'{file}' does not hold a JSON object.", "Pass the model's HF config.json.")
    name = p.name if p.is_dir() else (p.parent.name or p.stem)
    return cfg, name
