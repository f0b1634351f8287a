"""`TransformerShape`: the architecture numbers the launch-family leaves (Megatron, LoRA, critic) need.

A plain frozen value object so the leaves stay free of `ModelSpec` (the orchestrator builds it once:
`shape_of(spec)` below is the one adapter). Parameter counts follow memory-model.md §1 (exact, from
the architecture): attention h·q + 2·h·kv + q·h (+ q + 2·kv with qkv biases), a gated (SwiGLU) MLP
3·h·I or a plain (GeLU) MLP 2·h·I, norms of `norm_params` elements per hidden unit (RMSNorm 1,
LayerNorm 2: weight + bias), Qwen3's per-head q/k RMSNorm 2·d, embeddings V·h, an untied output layer
V·h. `linear_bias` (GPT-2 style) adds a bias to every linear layer. MoE layers replace the dense MLP by
a router h·E, E experts of 3·h·I_moe (gated) and an optional shared expert (+ its gate h).

Megatron-LM's `compute_weight_and_optimizer_memory` (megatron/training/theoretical_memory_usage.py,
NVIDIA/Megatron-LM d98e8a64, L82–L127) counts the same matrices (2h²·(1 + g/a)·(q/h) = 2·h·q + 2·h·kv
for attention, 2·h·I·(3/2 if swiglu) for the MLP, 2·h·norm_size for the norms) and ignores biases.
"""

from __future__ import annotations

from typing import NamedTuple


class TransformerShape(NamedTuple):
    """Architecture numbers of a decoder-only transformer (dense or MoE)."""

    hidden: int
    q_dim: int  # heads × head_dim
    kv_dim: int  # kv_heads × head_dim
    ffn: int  # dense MLP width I
    num_heads: int
    num_layers: int
    vocab: int
    gated_mlp: bool = True  # SwiGLU (gate, up, down) vs GeLU (fc1, fc2)
    tied_embeddings: bool = False
    qkv_bias: bool = False
    linear_bias: bool = False  # a bias on every linear layer (GPT-2 / Megatron GPT default)
    norm_params: int = 1  # per hidden unit: RMSNorm 1, LayerNorm 2
    qk_norm_dim: int = 0  # head_dim when q/k RMSNorm per head (Qwen3), else 0
    dropout: bool = False  # hidden/attention dropout > 0 (GPT-2 style); Llama/Qwen use none
    num_experts: int = 0
    moe_ffn: int = 0
    moe_topk: int = 0
    shared_ffn: int = 0

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP: 3 for a gated MLP, 2 otherwise."""
        return 3 if self.gated_mlp else 2

    @property
    def attention_params(self) -> int:
        """One layer's attention projections (tensor-parallel sharded in Megatron)."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        weights = h * q + 2 * h * kv + q * h
        bias = (q + 2 * kv) if (self.qkv_bias or self.linear_bias) else 0
        return weights + bias + (h if self.linear_bias else 0)

    @property
    def dense_mlp_params(self) -> int:
        """One dense MLP (tensor-parallel sharded)."""
        m, h, f = self.mlp_matrices, self.hidden, self.ffn
        bias = ((m - 1) * f + h) if self.linear_bias else 0
        return m * h * f + bias

    @property
    def shared_expert_params(self) -> int:
        """The shared expert and its gate of one MoE layer (0 when none)."""
        if not self.shared_ffn:
            return 0
        return self.mlp_matrices * self.hidden * self.shared_ffn + self.hidden

    @property
    def routed_expert_params(self) -> int:
        """All routed experts of one MoE layer (expert-parallel sharded)."""
        return self.num_experts * self.mlp_matrices * self.hidden * self.moe_ffn

    @property
    def replicated_params_per_layer(self) -> int:
        """Norms (and a router): replicated on every tensor-parallel rank."""
        router = self.hidden * self.num_experts if self.num_experts else 0
        return 2 * self.norm_params * self.hidden + 2 * self.qk_norm_dim + router

    @property
    def tp_sharded_params_per_layer(self) -> int:
        """Parameters of one layer that tensor parallelism splits."""
        mlp = self.shared_expert_params if self.num_experts else self.dense_mlp_params
        return self.attention_params + mlp

    @property
    def expert_params_per_layer(self) -> int:
        return self.routed_expert_params if self.num_experts else 0

    @property
    def params_per_layer(self) -> int:
        return self.tp_sharded_params_per_layer + self.replicated_params_per_layer + self.expert_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def output_layer_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def final_norm_params(self) -> int:
        return self.norm_params * self.hidden

    @property
    def num_params(self) -> int:
        """Exact total (embeddings + layers + final norm + untied output layer)."""
        layers = self.num_layers * self.params_per_layer
        return self.embedding_params + layers + self.final_norm_params + self.output_layer_params


def shape_of(spec) -> TransformerShape:
    """The shape of a `profiles.spec.ModelSpec` (Llama/Qwen-style: RMSNorm, SwiGLU, no dropout).

    The one place a `ModelSpec` is unpacked for these leaves (duck-typed, so this module imports nothing
    from the rest of the package)."""
    return TransformerShape(
        hidden=spec.hidden_size,
        q_dim=spec.q_dim,
        kv_dim=spec.kv_dim,
        ffn=spec.intermediate_size,
        num_heads=spec.num_attention_heads,
        num_layers=spec.num_layers,
        vocab=spec.vocab_size,
        gated_mlp=True,
        tied_embeddings=spec.tie_word_embeddings,
        qkv_bias=spec.qkv_bias,
        norm_params=1,
        qk_norm_dim=spec.head_dim if spec.qk_norm else 0,
        num_experts=spec.num_experts,
        moe_ffn=spec.moe_intermediate_size,
        moe_topk=spec.num_experts_per_tok,
        shared_ffn=spec.shared_expert_intermediate_size,
    )
