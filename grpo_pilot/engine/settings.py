"""The actor's own settings (`ActorSettings`), resolved once from the plan's knobs and the run config.

The actor never reads the planner's `Knobs`: `ActorSettings.from_knobs` is the one place where a plan's
search space turns into what a training worker does (micro-batching, checkpointing, offload, log-prob
kernel) and the run config adds the optimizer and sampling temperature.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from grpo_pilot.models import Frozen
from grpo_pilot.planner.adapters import AdapterSettings


class ActorSettings(Frozen):
    """Everything `engine.actor.Actor` needs; units in names, defaults = verl's actor defaults."""

    micro_batch_size: int | None = Field(
        default=4, ge=1, description="Sequences per update micro-batch (used when max_token_len is None)."
    )
    max_token_len: int | None = Field(
        default=None, ge=1, description="Token budget per update micro-batch, padding included (dynamic batching)."
    )
    log_prob_max_token_len: int = Field(default=16384, ge=1, description="Token budget per log-prob micro-batch.")
    gradient_checkpointing: bool = Field(default=True, description="Recompute each decoder layer in backward.")
    fused_logprob: bool = Field(default=False, description="Chunked LM head + log-prob: no full-vocab logits.")
    param_offload: bool = Field(default=False, description="FSDP2 CPUOffloadPolicy: params and grads in host RAM.")
    optimizer_offload: bool = Field(
        default=False, description="Optimizer states in host RAM (FSDP2 CPUOffloadPolicy: the step runs on CPU)."
    )
    ref_param_offload: bool = Field(default=False, description="Reference model parameters in host RAM.")
    lr: float = Field(default=1e-6, gt=0.0, description="AdamW learning rate.")
    weight_decay: float = Field(default=0.01, ge=0.0)
    adam_beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(default=0.999, ge=0.0, lt=1.0)
    max_grad_norm: float = Field(default=1.0, gt=0.0, description="Global grad-norm clip.")
    temperature: float = Field(default=1.0, gt=0.0, description="Log-probs divide the logits by it (sampling T).")
    with_ref: bool = Field(default=False, description="Keep a frozen reference copy of the initial policy.")
    share_prompts: bool = Field(default=True, description="Compute each distinct prompt once per micro-batch.")
    adapter: AdapterSettings | None = Field(
        default=None,
        description="LoRA / DoRA adapters on a frozen base (engine/lora.py; the plan's workload.adapter); None = full "
        "fine-tuning.",
    )

    @property
    def dynamic_batching(self) -> bool:
        return self.max_token_len is not None

    @property
    def offload(self) -> bool:
        """Training states live in host RAM (FSDP2 `CPUOffloadPolicy`)."""
        return self.param_offload or self.optimizer_offload

    @classmethod
    def from_knobs(cls, knobs: Any, **run: Any) -> "ActorSettings":
        """The actor's part of a plan's `Knobs`, plus run settings (`lr=`, `temperature=`, `with_ref=`, ...)."""
        return cls(
            micro_batch_size=knobs.micro_batch_size_per_gpu,
            max_token_len=knobs.max_token_len_per_gpu,
            log_prob_max_token_len=knobs.log_prob_max_token_len_per_gpu,
            gradient_checkpointing=knobs.gradient_checkpointing,
            fused_logprob=knobs.fused_logprob,
            param_offload=knobs.param_offload,
            optimizer_offload=knobs.optimizer_offload,
            ref_param_offload=knobs.ref_param_offload,
            **run,
        )
