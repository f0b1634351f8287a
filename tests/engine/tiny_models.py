"""Helpers shared by engine tests: a tiny Llama-family model, and the gradients an optimizer step sees."""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 100


def tiny(model_type: str, *, attn: str = "sdpa", **extra: object) -> torch.nn.Module:
    """2 layers, hidden 64, 4 query heads over 2 KV heads (GQA), random init with std 0.1 (decisive argmaxes),
    eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        initializer_range=0.1,
        tie_word_embeddings=False,
        **extra,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def update_capturing_grads(actor: Any, *args: Any, **kwargs: Any) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """`actor.update(*args, **kwargs)`; also the accumulated gradients the optimizer step saw (by parameter name)."""
    grads: dict[str, torch.Tensor] = {}
    step = actor.optimizer.step

    def capture(*a: Any, **kw: Any) -> Any:
        grads.update({n: p.grad.clone() for n, p in actor.policy.named_parameters() if p.grad is not None})
        return step(*a, **kw)

    actor.optimizer.step = capture
    try:
        return grads, actor.update(*args, **kwargs)
    finally:
        actor.optimizer.step = step
