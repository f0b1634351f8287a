"""What the user fixed (`Workload`), what the search may change (`Knobs`), and the executor (`Target`).

Workload defaults are verl's documented GRPO example (examples/grpo_trainer/run_qwen2-7b.sh style):
1024 prompts per step, PPO mini-batch 256 prompts, n = 5, prompt 512, response 1024, KL loss on.
Knob defaults are verl's own defaults (reference/verl-config.md), so evaluating `Knobs()` is
evaluating "what verl would do if you changed nothing".
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_pilot.models import Frozen

Target = Literal["grpo-pilot", "verl", "trl"]
Placement = Literal["colocated", "split"]
RolloutBackendName = Literal["vllm", "hf"]
PhaseName = Literal["rollout", "log_prob", "update", "weight_sync"]
PHASES: tuple[PhaseName, ...] = ("rollout", "log_prob", "update", "weight_sync")


class Workload(Frozen):
    """The GRPO job the user wants to run; never changed by the search."""

    prompts_per_step: int = Field(
        default=1024, ge=1, description="Prompts per optimizer batch (verl data.train_batch_size)."
    )
    mini_batch_prompts: int = Field(
        default=256, ge=1, description="Prompts per PPO mini-batch (verl ppo_mini_batch_size); one optimizer step each."
    )
    n: int = Field(
        default=5, ge=1, description="Responses per prompt (group size; verl rollout.n, TRL num_generations)."
    )
    prompt_len_tokens: int = Field(default=512, ge=1, description="Longest prompt, tokens.")
    response_len_tokens: int = Field(default=1024, ge=1, description="Longest response, tokens.")
    use_kl_loss: bool = Field(
        default=True, description="KL loss against a frozen reference model (instantiates the ref model)."
    )
    ppo_epochs: int = Field(default=1, ge=1, description="Passes over each rollout batch.")
    entropy_coeff: float = Field(
        default=0.0, ge=0.0, description="Entropy bonus; > 0 computes entropy in the update (more logits memory)."
    )

    @model_validator(mode="after")
    def _mini_le_batch(self) -> "Workload":
        if self.mini_batch_prompts > self.prompts_per_step:
            raise ValueError(
                f"mini_batch_prompts ({self.mini_batch_prompts}) exceeds prompts_per_step ({self.prompts_per_step})"
            )
        return self

    @property
    def seq_len_tokens(self) -> int:
        return self.prompt_len_tokens + self.response_len_tokens

    @property
    def responses_per_step(self) -> int:
        return self.prompts_per_step * self.n


class Knobs(Frozen):
    """The settings the search chooses (or the user pins with --pin KEY=VALUE)."""

    rollout_tp: int = Field(default=2, ge=1, description="Rollout tensor-parallel size (verl default 2).")
    gpu_memory_utilization: float = Field(
        default=0.5,
        gt=0.0,
        le=0.99,
        description="Fraction of *total* GPU memory the vLLM engine takes (vLLM >= 0.7 semantics).",
    )
    micro_batch_size_per_gpu: int | None = Field(
        default=4, ge=1, description="Sequences per update micro-batch; ignored when max_token_len_per_gpu is set."
    )
    max_token_len_per_gpu: int | None = Field(
        default=None,
        ge=1,
        description="Token budget per update micro-batch; set = dynamic batching (verl use_dynamic_bsz).",
    )
    log_prob_max_token_len_per_gpu: int = Field(
        default=16384, ge=1, description="Token budget per log-prob micro-batch (old policy and reference)."
    )
    param_offload: bool = Field(
        default=False, description="Actor FSDP parameters (and grads) live in host RAM between uses."
    )
    optimizer_offload: bool = Field(
        default=False, description="Adam states live in host RAM; the optimizer step runs on CPU or streams."
    )
    ref_param_offload: bool = Field(default=False, description="Reference model parameters live in host RAM.")
    gradient_checkpointing: bool = Field(
        default=True, description="Recompute layer activations in backward (verl default on)."
    )
    ulysses_sp: int = Field(
        default=1, ge=1, description="Ulysses sequence-parallel degree (splits tokens across ranks)."
    )
    fused_logprob: bool = Field(
        default=False, description="Chunked/fused log-prob kernel: never materialises full-vocab logits."
    )
    enforce_eager: bool = Field(
        default=False, description="vLLM without CUDA graphs (saves graph memory, slower decode)."
    )
    max_num_seqs: int = Field(
        default=1024, ge=1, description="vLLM concurrent sequences cap (verl RolloutConfig default)."
    )
    max_num_batched_tokens: int = Field(
        default=8192, ge=1, description="vLLM tokens per scheduler step (prefill chunk)."
    )
    rollout_backend: RolloutBackendName = Field(
        default="vllm",
        description="Rollout engine the plan assumes: 'vllm' or 'hf' (batched decode on the HF policy module itself, no second weight copy).",
    )
    placement: Placement = Field(
        default="colocated", description="'colocated' (hybrid engine) or 'split' (separate rollout GPUs)."
    )
    split_rollout_gpus_per_node: int = Field(
        default=0, ge=0, description="With placement='split': GPUs per node given to rollout (0 = half)."
    )

    @property
    def dynamic_batching(self) -> bool:
        return self.max_token_len_per_gpu is not None


KNOB_KEYS: tuple[str, ...] = tuple(Knobs.model_fields)


def old_logprob_pass_needed(workload: Workload, target: Target) -> bool:
    """Whether the executor runs an old-policy log-prob pass before the update.

    verl always recomputes old log-probs (`compute_log_prob` in its PPO loop). TRL
    (`GRPOTrainer._generate_and_score_completions`) and our engine (`engine/loop.py`) skip it when the
    step is one on-policy update — one mini-batch, one epoch — where the ratio is 1 by construction.
    """
    if target == "verl":
        return True
    return workload.ppo_epochs > 1 or workload.prompts_per_step > workload.mini_batch_prompts
