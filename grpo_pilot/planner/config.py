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
from grpo_pilot.planner.adapters import AdapterSettings
from grpo_pilot.planner.critic_settings import CriticSettings
from grpo_pilot.planner.rules import num_mini_batches, old_logprob_pass_runs
from grpo_pilot.planner.traits import TARGET_NAMES, ExecutorTraits

Target = Literal[TARGET_NAMES]  # type: ignore[valid-type]  # the executors of the traits table
Placement = Literal["colocated", "split"]
RolloutBackendName = Literal["vllm", "sglang", "hf"]
Algorithm = Literal["grpo", "ppo"]
Strategy = Literal["fsdp", "megatron"]
StateSharding = Literal["full", "zero2", "zero1", "ddp"]  # memory/zero.py
ModelDtype = Literal["fp32", "bf16", "fp16"]  # memory/precision.py
Recompute = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]
GenerationWeights = Literal["layer", "model"]
HfDecode = Literal["auto", "eager", "static", "cuda_graph"]  # grpo_pilot/kernels.py HF_DECODE_MODES
VllmEngine = Literal["v1", "v0"]
VllmMemory = Literal["instance", "device", "free"]
# The CUDA caching allocator's setting and where the executor empties its cache (planner/memory/allocator.py
# models both; engine/device_memory.py puts them into effect in grpo-run).
AllocatorSetting = Literal["expandable", "default"]
ReleasePolicy = Literal["verl", "before_sync_after_rollout", "each_phase", "after_rollout", "never"]

# Sanity bounds of a job (a larger value is a typo or a hostile input, and its arithmetic leaves float range):
# 16× the 1M-token context of the longest-context bundled family (Qwen2.5-1M), and batches far beyond any
# published GRPO run (verl's largest examples use a few thousand prompts × n ≤ 64).
MAX_SEQUENCE_TOKENS = 1 << 24
MAX_PROMPTS_PER_STEP = 1 << 24
MAX_GROUP_SIZE = 1 << 20


class Workload(Frozen):
    """The GRPO job the user wants to run; never changed by the search.

    Lengths: `prompt_len_tokens` / `response_len_tokens` are the maxima (verl max_prompt_length /
    max_response_length, TRL max_prompt_length / max_completion_length). The optional means, standard
    deviations and response tail describe what the data really holds (`--prompt-len-mean`,
    `--lengths lengths.jsonl`); left unset, every sequence is taken at its maximum — the worst case.
    `planner/lengths.py` turns them into the tokens a micro-batch holds (memory) and the tokens a step
    processes (time).
    """

    prompts_per_step: int = Field(
        default=1024,
        ge=1,
        le=MAX_PROMPTS_PER_STEP,
        description="Prompts per optimizer batch (verl data.train_batch_size).",
    )
    mini_batch_prompts: int = Field(
        default=256,
        ge=1,
        le=MAX_PROMPTS_PER_STEP,
        description="Prompts per PPO mini-batch (verl ppo_mini_batch_size); one optimizer step each.",
    )
    n: int = Field(
        default=5,
        ge=1,
        le=MAX_GROUP_SIZE,
        description="Responses per prompt (group size; verl rollout.n, TRL num_generations).",
    )
    prompt_len_tokens: int = Field(default=512, ge=1, le=MAX_SEQUENCE_TOKENS, description="Longest prompt, tokens.")
    response_len_tokens: int = Field(
        default=1024, ge=1, le=MAX_SEQUENCE_TOKENS, description="Longest response, tokens."
    )
    prompt_len_mean_tokens: float | None = Field(
        default=None, gt=0, description="Mean prompt length, tokens (None = every prompt at the maximum)."
    )
    response_len_mean_tokens: float | None = Field(
        default=None, gt=0, description="Mean response length, tokens (None = every response at the maximum)."
    )
    prompt_len_std_tokens: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SEQUENCE_TOKENS,
        description="Standard deviation of prompt lengths (None = unknown: the largest a length in [0, max] "
        "with that mean can have).",
    )
    response_len_std_tokens: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SEQUENCE_TOKENS,
        description="Standard deviation of response lengths (None = unknown, as above).",
    )
    response_tail_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Longest response one rollout waits for (None = the maximum: some response reaches the cap).",
    )
    lengths_source: str | None = Field(
        default=None, description="Where the length statistics come from (a lengths file, a dataset), for display."
    )
    use_kl_loss: bool = Field(
        default=True, description="KL loss against a frozen reference model (instantiates the ref model)."
    )
    ppo_epochs: int = Field(default=1, ge=1, description="Passes over each rollout batch.")
    entropy_coeff: float = Field(
        default=0.0, ge=0.0, description="Entropy bonus; > 0 computes entropy in the update (more logits memory)."
    )
    adapter: AdapterSettings | None = Field(
        default=None,
        description="LoRA / QLoRA training (the user's choice of rank, targets and base quantization); None = full "
        "fine-tuning of every parameter.",
    )
    algorithm: Algorithm = Field(
        default="grpo",
        description="'grpo' (group-relative advantages, no critic) or 'ppo' (GAE with a critic: verl "
        "algorithm.adv_estimator=gae): a second trained model, its values pass and its update.",
    )
    critic: CriticSettings | None = Field(
        default=None,
        description="The critic's batching and checkpointing with algorithm 'ppo' (None: verl's defaults, "
        "derived from the actor's knobs); ignored with 'grpo'.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> "Workload":
        if self.mini_batch_prompts > self.prompts_per_step:
            raise ValueError(
                f"mini_batch_prompts ({self.mini_batch_prompts}) exceeds prompts_per_step ({self.prompts_per_step})"
            )
        for what, mean, cap in (
            ("prompt", self.prompt_len_mean_tokens, self.prompt_len_tokens),
            ("response", self.response_len_mean_tokens, self.response_len_tokens),
        ):
            if mean is not None and mean > cap:
                raise ValueError(f"the mean {what} length ({mean:g}) exceeds the maximum ({cap})")
        if self.response_tail_tokens is not None and self.response_tail_tokens > self.response_len_tokens:
            raise ValueError(
                f"response_tail_tokens ({self.response_tail_tokens}) exceeds the maximum response "
                f"({self.response_len_tokens})"
            )
        return self

    @property
    def has_critic(self) -> bool:
        return self.algorithm == "ppo"

    @property
    def critic_settings(self) -> CriticSettings:
        """The critic's settings (verl's defaults when none were given)."""
        return self.critic or CriticSettings()

    @property
    def seq_len_tokens(self) -> int:
        """Longest sequence (prompt + response): what one request may reach."""
        return self.prompt_len_tokens + self.response_len_tokens

    @property
    def responses_per_step(self) -> int:
        return self.prompts_per_step * self.n

    @property
    def prompt_mean_tokens(self) -> float:
        return self.prompt_len_tokens if self.prompt_len_mean_tokens is None else self.prompt_len_mean_tokens

    @property
    def response_mean_tokens(self) -> float:
        return self.response_len_tokens if self.response_len_mean_tokens is None else self.response_len_mean_tokens

    @property
    def seq_mean_tokens(self) -> float:
        return self.prompt_mean_tokens + self.response_mean_tokens

    @property
    def at_max_lengths(self) -> bool:
        """Every sequence at its maximum: the worst case (today's estimate when no length is given)."""
        at_max_prompt = self.prompt_mean_tokens == self.prompt_len_tokens
        return at_max_prompt and self.response_mean_tokens == self.response_len_tokens

    def worst_case(self) -> "Workload":
        """The same job with every prompt and response at its maximum."""
        return self.model_copy(
            update={
                "prompt_len_mean_tokens": None,
                "response_len_mean_tokens": None,
                "prompt_len_std_tokens": None,
                "response_len_std_tokens": None,
                "response_tail_tokens": None,
            }
        )


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
    log_prob_micro_batch_size_per_gpu: int | None = Field(
        default=None,
        ge=1,
        description="Sequences per log-prob micro-batch (verl log_prob_micro_batch_size_per_gpu without "
        "log_prob_use_dynamic_bsz); None = packed by log_prob_max_token_len_per_gpu.",
    )
    param_offload: bool = Field(
        default=False, description="Actor FSDP parameters (and grads) live in host RAM between uses."
    )
    optimizer_offload: bool = Field(
        default=False, description="Adam states live in host RAM; the optimizer step runs on CPU or streams."
    )
    ref_param_offload: bool = Field(
        default=False,
        description="Reference model parameters live in host RAM (verl's FSDP reference is there whatever this key "
        "since #121: ref_forced_cpu_offload).",
    )
    gradient_checkpointing: bool = Field(
        default=True, description="Recompute layer activations in backward (verl default on)."
    )
    ulysses_sp: int = Field(
        default=1, ge=1, description="Ulysses sequence-parallel degree (splits tokens across ranks)."
    )
    fsdp_size: int | None = Field(
        default=None,
        ge=1,
        description="GPUs one FSDP group shards the model states over (verl fsdp_config.fsdp_size; None / -1 = "
        "every training GPU). Smaller groups replicate (HSDP): states per GPU grow, gradients are also "
        "all-reduced across the replicas.",
    )
    state_sharding: StateSharding = Field(
        default="full",
        description="Which model states are sharded over the training GPUs (TRL only; verl and our engine shard "
        "everything): 'full' (FSDP full sharding / DeepSpeed ZeRO-3), 'zero2' (DeepSpeed ZeRO-2: gradients and "
        "optimizer states partitioned, bf16 parameters replicated), 'zero1' (ZeRO-1: optimizer states only), "
        "'ddp' (DistributedDataParallel: everything replicated). planner/memory/zero.py cites the code of each.",
    )
    model_dtype: ModelDtype = Field(
        default="fp32",
        description="The dtype TRL loads the policy and the reference in (TRL only; the search never moves it): "
        "'fp32', TRL's default, or 'bf16' / 'fp16' (`model_init_kwargs` dtype). With state_sharding 'ddp' every state "
        "follows it (a bf16 model trains in bf16); FSDP upcasts the policy to fp32 and keeps the reference as loaded; "
        "DeepSpeed keeps bf16 weights and fp32 master and Adam whatever it. planner/memory/precision.py cites each.",
    )
    fused_logprob: bool = Field(
        default=False, description="Chunked/fused log-prob kernel: never materialises full-vocab logits."
    )
    remove_padding: bool = Field(
        default=True,
        description="verl model.use_remove_padding (verl only; the search never moves it): False pads every row "
        "and computes log-probs and entropy eagerly on the padded logits (memory/logits.py, the padded path).",
    )
    entropy_every_pass: bool = Field(
        default=False,
        description="verl before 25b0f2262 (#1100) only (the search never moves it): every actor forward (update, "
        "old log-prob, reference) computes the entropy, and the update back-propagates through it whatever "
        "entropy_coeff (a coefficient of 0 scales a gradient that is still computed).",
    )
    actor_offload_at_init: bool = Field(
        default=True,
        description="verl only (the search never moves it): with param_offload, init_model moves the actor's "
        "parameters to the host before it builds the rollout engine (verl >= 0fb0bedb7, #1118). False: verl before, "
        "whose init moved only the gradients, so the engine measured the GPU beside the actor's parameters "
        "(vllm_memory device / free, SGLang) whatever param_offload.",
    )
    ref_forced_cpu_offload: bool = Field(
        default=True,
        description="verl only (the search never moves it): the reference model is wrapped in FSDP "
        "CPUOffload(offload_params=True) whatever ref_param_offload (verl >= fefca4172, #121), so it holds no GPU "
        "memory when the rollout engine measures and is streamed from the host unit by unit during its pass "
        "(planner/ref_offload.py). False: verl before, whose reference stayed on the GPU unless ref_param_offload "
        "moved it off (and back whole for its pass). FSDP only: the Megatron reference follows its key.",
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
        description="Rollout engine the plan assumes: 'vllm' or 'hf' (batched decode on the HF policy module "
        "itself, no second weight copy).",
    )
    hf_generation_weights: GenerationWeights = Field(
        default="layer",
        description="How an HF rollout (no rollout engine) holds a sharded policy's weights: 'layer' — gathered "
        "one decoder layer at a time for every forward (FSDP: our engine, TRL under FSDP); 'model' — the whole "
        "model gathered in the compute dtype for the whole generate call (TRL / ms-swift under DeepSpeed ZeRO-3 "
        "with ds3_gather_for_generation, their default: trl/models/utils.py unwrap_model_for_generation).",
    )
    hf_decode: HfDecode = Field(
        default="auto",
        description="The decode loop of our engine's hf rollout (grpo-run's `hf_decode`; a run config value wins): "
        "'eager' (fp32 weights under autocast, a host check per token), 'static' (a bf16 copy of the weights from "
        "the weight sync to the end of the rollout, a preallocated bf16 KV cache), 'cuda_graph' (static, each step "
        "replayed as a CUDA graph); 'auto' = cuda_graph on GPUs, eager on the cpu device. Llama-family models on "
        "one unsharded rank without adapters only; anything else decodes eagerly. vLLM plans ignore it.",
    )
    vllm_engine: VllmEngine = Field(
        default="v1",
        description="vLLM engine generation: 'v1' (vLLM >= 0.8 default) or 'v0' (the legacy engine: vLLM < 0.8, "
        "VLLM_USE_V1=0, or a backend V1 lacks such as VLLM_ATTENTION_BACKEND=XFORMERS); v0 processes every "
        "running sequence's output on the CPU each decode step.",
    )
    vllm_memory: VllmMemory = Field(
        default="instance",
        description="What gpu_memory_utilization × device memory bounds: 'instance' (vLLM >= 0.9, and the V0 engine "
        "of vLLM 0.7-0.8: the engine's own memory, measured from its start) or 'device' (the V1 engine of vLLM "
        "0.7-0.8: everything on the GPU when the engine profiles, the trainer's resident memory included, so the KV "
        "cache gets what is left) or 'free' (verl's vendored vLLM 0.3.1-0.6.3 workers, verl before the SPMD rollout "
        "or with vLLM <= 0.6.3 installed: the KV cache is the fraction gpu_memory_utilization of the memory still "
        "free after the profile run, beside the trainer, the engine's weights and its profile peak). "
        "memory/vllm_budget.py cites the code of each.",
    )
    allocator: AllocatorSetting = Field(
        default="expandable",
        description="PyTorch's CUDA caching allocator in the trainer: 'expandable' (expandable_segments:True: one "
        "growing mapping, verl >= e6843cc8 (#3020) in training, grpo-run's default) or 'default' (fixed cudaMalloc "
        "segments: older verl, TRL and Axolotl unless PYTORCH_CUDA_ALLOC_CONF sets expandable_segments).",
    )
    release_cache: ReleasePolicy = Field(
        default="verl",
        description="Where torch.cuda.empty_cache() returns the cached blocks: 'verl' (before and after the weight "
        "sync and after the rollout: verl's FSDP workers since 58840419 (#1081), its Megatron workers since dc8b5076 "
        "(#2678), grpo-run's default), 'before_sync_after_rollout' (not after the sync: verl 3fc3e2b7 (#575) to "
        "#1081, v0.3.0), 'each_phase' (also after every log-prob pass and update: verl before 51a5ff99 (#556)), "
        "'after_rollout', or 'never' (TRL without vLLM sleep mode). verl's workers add their own releases "
        "(planner/memory/releases.py).",
    )
    placement: Placement = Field(
        default="colocated", description="'colocated' (hybrid engine) or 'split' (separate rollout GPUs)."
    )
    split_rollout_gpus_per_node: int = Field(
        default=0, ge=0, description="With placement='split': GPUs per node given to rollout (0 = half)."
    )
    # ---- launch families (docs/families.md): Megatron, activation offload, LoRA sync, the critic ----
    strategy: Strategy = Field(
        default="fsdp",
        description="Training backend: 'fsdp' (verl FSDP/FSDP2, TRL, our engine) or 'megatron' (verl "
        "actor.strategy=megatron: TP x PP (x VPP) x CP x DP with the distributed optimizer).",
    )
    megatron_tp: int = Field(default=1, ge=1, description="Megatron tensor_model_parallel_size.")
    megatron_pp: int = Field(default=1, ge=1, description="Megatron pipeline_model_parallel_size.")
    megatron_vpp: int = Field(
        default=1, ge=1, description="Megatron virtual_pipeline_model_parallel_size (1 = verl's null: no interleaving)."
    )
    megatron_cp: int = Field(default=1, ge=1, description="Megatron context_parallel_size.")
    megatron_sequence_parallel: bool = Field(
        default=True, description="Megatron sequence_parallel (verl default True; meaningful with TP > 1)."
    )
    megatron_distributed_optimizer: bool = Field(
        default=True, description="Megatron use_distributed_optimizer (verl default True)."
    )
    megatron_recompute: Recompute = Field(
        default="none",
        description="Megatron recompute_granularity (override_transformer_config; verl default null = none).",
    )
    megatron_recompute_method: RecomputeMethod = Field(
        default="uniform", description="Megatron recompute_method for full recompute."
    )
    megatron_recompute_num_layers: int = Field(
        default=1, ge=1, description="Megatron recompute_num_layers for full recompute."
    )
    activation_offload: bool = Field(
        default=False,
        description="verl model.enable_activation_offload (FSDP): saved activations move to pinned host memory "
        "layer by layer.",
    )
    layered_summon: bool = Field(
        default=False,
        description="verl rollout.layered_summon (LoRA under FSDP1): gather one layer at a time to collect the "
        "adapters for the rollout engine, instead of the whole model.",
    )
    critic_param_offload: bool = Field(
        default=False, description="PPO: the critic's FSDP parameters live in host RAM between its passes."
    )
    critic_optimizer_offload: bool = Field(
        default=False, description="PPO: the critic's Adam states live in host RAM outside its update."
    )

    @property
    def dynamic_batching(self) -> bool:
        return self.max_token_len_per_gpu is not None

    def shard_degree(self, trainer_gpus: int) -> int:
        """GPUs the optimizer states are partitioned over: `fsdp_size`, capped by the training GPUs (1 under DDP)."""
        if self.state_sharding == "ddp":  # nothing is partitioned (memory/zero.py)
            return 1
        return min(self.fsdp_size or trainer_gpus, trainer_gpus)


KNOB_KEYS: tuple[str, ...] = tuple(Knobs.model_fields)


def old_logprob_pass_needed(workload: Workload, executor: ExecutorTraits) -> bool:
    """Whether `executor` runs an old-policy log-prob pass before the update (`rules.old_logprob_pass_runs`)."""
    return old_logprob_pass_runs(
        num_mini_batches=num_mini_batches(workload.prompts_per_step, workload.mini_batch_prompts),
        ppo_epochs=workload.ppo_epochs,
        always=executor.always_old_logprob,
    )
