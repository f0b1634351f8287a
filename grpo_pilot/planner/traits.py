"""`ExecutorTraits`: what each executor (`Target`) does differently, in one place.

The estimators ask these questions instead of testing `target == ...` themselves. Each trait names
the executor behaviour it stands for and the source where it was read:

- always_old_logprob: verl recomputes old log-probs every step (`compute_log_prob` in its PPO loop);
  TRL (`_generate_and_score_completions`) and our engine (`engine/loop.py`) skip the pass when the
  step is one on-policy update (one mini-batch, one epoch).
- budget_scaled_by_sp: verl multiplies the per-GPU token budget by the Ulysses degree before it
  splits the packed sequence (reference/verl-config.md); our engine and TRL do not.
- offload_streams: FSDP2 CPUOffloadPolicy / ZeRO-3 offload keep shards on the host and stream them in
  with every all-gather, stepping the optimizer on the host (our engine, TRL); verl loads offloaded
  states back to the GPU for the phase that uses them and offloads them after (fsdp_workers).
- keeps_rollout_engine: TRL colocate keeps vLLM's weights and KV cache allocated through training
  (`vllm_enable_sleep_mode` defaults to False); verl and our engine free both (sleep level 2).
- scores_all_positions: verl computes logits over every packed position and slices the response
  afterwards (`logits_rmpad`); our engine (`logits_to_keep`) and TRL (fused head over labelled
  positions) score the response positions only.
- padding: what one micro-batch of B sequences holds. "remove": verl's `use_remove_padding` packs the
  real tokens (the sum of B lengths); "sorted_rows": our engine right-pads length-sorted rows, so the
  first micro-batch holds the B longest sequences (B × the longest); "batch_max": TRL pads every row
  to the longest prompt and completion of the generation batch (B × the longest).
- masked_rows: TRL builds a padding mask over [B, S] rows (a mask tensor per layer); verl
  (flash-attention varlen) and our engine (SDPA `is_causal` on right-padded rows) build none.
- log_prob_entropy / update_entropy: verl's old-log-prob pass computes entropy as a metric
  (`compute_log_prob(calculate_entropy=True)`), its update only with a bonus; our engine's update
  always computes it as a metric; TRL gets it from its fused head.
- balances_batch: verl reorders every step's sequences so that each data-parallel rank holds the same
  total tokens (trainer.balance_batch, default True: ray_trainer._balance_batch with
  get_seqlen_balanced_partitions; its logs show global_seqlen/balanced_min == balanced_max), so a
  micro-batch is a sample from a rank's share whose total is fixed; our engine and TRL do not.
- fused_adamw_on_cpu: our engine steps a cpu run with torch's fused AdamW (engine/actor.py: one in-place
  pass per tensor, no foreach temporaries); verl and TRL use the default (foreach) AdamW.
- ref_bytes: bytes per reference-model parameter on a GPU. Our engine keeps a bf16 copy; verl creates
  non-actor roles in bf16 (`fsdp_workers`: `torch.float32 if self._is_actor else torch.bfloat16`); TRL
  builds the reference with the policy's dtype (`model_init_kwargs.setdefault("dtype", self.model.dtype)`),
  fp32 by default (the trait); a launch's `model_dtype` and launcher change it (memory/precision.py `trl_precision`).
- logits_kernel: which log-prob implementation's memory and traffic apply (`memory/logits.py`): our
  engine's, verl's (flash-attn cross-entropy / FusedLinearForPPO) or TRL's always-fused chunked head.
- fsdp_on_one_rank: verl wraps actor and reference in FSDP even on one GPU (fsdp_workers builds the FSDP
  module whatever the world size); our engine shards only over several ranks or to offload (engine/actor.py
  `sharded = world_size > 1 or settings.offload`) and TRL only under accelerate's FSDP / ZeRO-3 on several
  processes: one rank runs the plain module, its fp32 weights cast to bf16 by autocast
  (`memory/autocast.py`).
- shares_prompts: our engine's unsharded actor computes each distinct prompt of a micro-batch once
  (engine/actor.py `share_prompts and not sharded`, engine/shared_prefix.py; `memory/shared_prompts.py`);
  verl and TRL feed every completion's prompt.
- missing_knobs: knobs the executor has no setting for, which the search must not move (they keep
  `Knobs()` defaults): our engine refuses Ulysses SP (engine/assemble.py) and shards over every rank (no
  HSDP `fsdp_size`); only TRL runs under DeepSpeed ZeRO-1/2 or DDP (`state_sharding`, memory/zero.py): verl's
  and our engine's FSDP shard every state; only TRL loads the model in a dtype the launch chooses (`model_dtype`,
  memory/precision.py): verl and our engine create the actor in fp32; TRL's GRPOConfig has no
  reference offload (the reference stays on the GPU), no Ulysses SP, no log-prob kernel switch (its head
  is always fused), no vLLM eager switch and no scheduler caps (trl 1.16 GRPOConfig fields).
  `remove_padding` (verl `model.use_remove_padding`) and the facts of older verl releases (`VERL_ERA_KNOBS`:
  `entropy_every_pass` before #1100, `actor_offload_at_init` before #1118, `ref_forced_cpu_offload` before #121)
  are verl's alone: our engine and TRL pad as `padding` says, compute entropy as `update_entropy_metric` says and
  keep the latter two at their defaults.
  The launch families' knobs (`FAMILY_KNOBS`: Megatron's parallel sizes and recompute, activation offload,
  the LoRA layered summon, the critic's offloads) exist only in verl; our engine and TRL miss them all.
  `hf_decode` (our static / CUDA-graph decode loop) exists only in our engine: verl's and TRL's HF rollout
  generate eagerly (transformers `generate`).
- algorithms / strategies / rollout_engines: what the executor runs at all. verl runs PPO with a critic
  (`algorithm.adv_estimator=gae`), the Megatron backend (`actor.strategy=megatron`) and SGLang rollout
  (`rollout.name=sglang`); TRL's GRPOTrainer and our engine (engine/loop.py) run GRPO on FSDP / ZeRO-3
  with vLLM or an HF decode loop. A plan asking an executor for what it cannot run is refused
  (`support.unsupported`), never planned as something else.
- lora_rollout: how a LoRA policy reaches the rollout engine. verl starts vLLM with `enable_lora` and ships
  only the adapters each step (workers/rollout/vllm_rollout, fsdp_workers `rollout_mode`:
  memory/lora_rollout.py); TRL merges the adapters into the base for the weight sync and unmerges after
  (trl 1.16 grpo_trainer `_move_model_to_vllm`: `merge_adapter()` ... `unmerge_adapter()`), so vLLM runs a
  plain model and receives full weights; our engine (branch lora) syncs merged weights the same way.
- forces_fsdp_ref_offload: verl wraps its FSDP reference in CPUOffload(offload_params=True) (FSDP2:
  CPUOffloadPolicy) whatever ref.fsdp_config.param_offload, since fefca4172 (#121; fsdp_workers.py
  `_build_model_optimizer`, role "ref"); `Knobs.ref_forced_cpu_offload` says whether the launch's verl is that
  new (planner/ref_offload.py). Our engine and TRL keep the reference where `ref_param_offload` says.
- hf_rollout_replica: our engine's `hf` rollout generates on a replica of the model wherever it cannot sample
  from the trainer's own unsharded module — several training ranks (FSDP2-sharded), offload, or split placement
  (engine/worker.py `_build_rollout`: `on_policy = ... train_world == 1 and not st.actor.offload`, else
  `build_model(...).to(device=..., dtype=bf16 on CUDA / fp32 on the CPU)`), loaded by `sync_weights`
  (planner/hf_decode_mode.py `hf_replica`). verl's and TRL's HF rollout generate on the trainer's module itself
  (gathered as `hf_generation_weights` says).
- split_sync_via_host: under split placement the weights travel trainer → rollout through host memory, with no
  communicator between the pools: our engine (engine/weight_sync.py: training rank 0 puts each bucket into the
  Ray object store, every rollout worker pulls it and copies it host → device). verl's split recipes join both
  pools in an NCCL group (volcengine/verl@b178a3cd5 verl/experimental/one_step_off_policy/ray_trainer.py
  `create_weight_sync_group` / `collective.create_collective_group(..., group_name="actor_rollout")`, the same in
  fully_async_policy/param_sync.py); TRL's vLLM server mode through `VLLMClient.init_communicator` (a
  PyNcclCommunicator between the trainer and the server's workers).
- quantized_adapter_bytes: the adapters' dtype over a bitsandbytes base: TRL casts them to bf16
  ("following the QLoRA paper", grpo_trainer.py L530–L541); elsewhere fp32 (peft autocast_adapter_dtype).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from grpo_pilot.units import BF16_BYTES, FP32_BYTES

Padding = Literal["remove", "sorted_rows", "batch_max"]
LogitsKernel = Literal["ours", "verl", "trl"]
LoraRollout = Literal["adapters", "merged"]
# Knobs only verl has (Megatron, activation offload, the LoRA layered summon, the critic's offloads).
FAMILY_KNOBS: frozenset[str] = frozenset(
    {
        "strategy",
        "megatron_tp",
        "megatron_pp",
        "megatron_vpp",
        "megatron_cp",
        "megatron_sequence_parallel",
        "megatron_distributed_optimizer",
        "megatron_recompute",
        "megatron_recompute_method",
        "megatron_recompute_num_layers",
        "activation_offload",
        "layered_summon",
        "critic_param_offload",
        "critic_optimizer_offload",
    }
)
# What an older verl release did differently (verl_versions.CHANGES, set by --from-verl from the launch's date).
VERL_ERA_KNOBS: frozenset[str] = frozenset({"entropy_every_pass", "actor_offload_at_init", "ref_forced_cpu_offload"})


class ExecutorTraits(NamedTuple):
    name: str
    always_old_logprob: bool
    budget_scaled_by_sp: bool
    offload_streams: bool
    keeps_rollout_engine: bool
    scores_all_positions: bool
    padding: Padding
    masked_rows: bool
    log_prob_entropy: bool  # the old-policy pass computes entropy (no gradient)
    update_entropy_metric: bool  # the update computes entropy even without a bonus
    ref_bytes: int  # reference parameters on a GPU
    logits_kernel: LogitsKernel
    missing_knobs: frozenset[str] = frozenset()
    fsdp_on_one_rank: bool = False
    shares_prompts: bool = False
    fused_adamw_on_cpu: bool = False
    balances_batch: bool = False
    algorithms: frozenset[str] = frozenset({"grpo"})
    strategies: frozenset[str] = frozenset({"fsdp"})
    rollout_engines: frozenset[str] = frozenset({"vllm", "hf"})
    lora_rollout: LoraRollout = "merged"
    quantized_adapter_bytes: int = FP32_BYTES
    forces_fsdp_ref_offload: bool = False
    hf_rollout_replica: bool = False
    split_sync_via_host: bool = False

    def has_knob(self, name: str) -> bool:
        """Whether the executor has a setting for knob `name` (else the search leaves it at its default)."""
        return name not in self.missing_knobs


TRAITS: dict[str, ExecutorTraits] = {
    "grpo-pilot": ExecutorTraits(
        name="grpo-pilot",
        always_old_logprob=False,
        budget_scaled_by_sp=False,
        offload_streams=True,
        keeps_rollout_engine=False,
        scores_all_positions=False,
        padding="sorted_rows",
        masked_rows=False,
        log_prob_entropy=False,
        update_entropy_metric=True,
        ref_bytes=BF16_BYTES,
        logits_kernel="ours",
        missing_knobs=frozenset({"ulysses_sp", "fsdp_size", "remove_padding", "state_sharding", "model_dtype"})
        | VERL_ERA_KNOBS
        | FAMILY_KNOBS,
        shares_prompts=True,
        fused_adamw_on_cpu=True,
        hf_rollout_replica=True,
        split_sync_via_host=True,
    ),
    "verl": ExecutorTraits(
        name="verl",
        always_old_logprob=True,
        budget_scaled_by_sp=True,
        offload_streams=False,
        keeps_rollout_engine=False,
        scores_all_positions=True,
        padding="remove",
        masked_rows=False,
        log_prob_entropy=True,
        update_entropy_metric=False,
        ref_bytes=BF16_BYTES,
        logits_kernel="verl",
        fsdp_on_one_rank=True,
        balances_batch=True,
        algorithms=frozenset({"grpo", "ppo"}),
        strategies=frozenset({"fsdp", "megatron"}),
        rollout_engines=frozenset({"vllm", "sglang", "hf"}),
        lora_rollout="adapters",
        missing_knobs=frozenset({"hf_decode", "state_sharding", "model_dtype"}),
        forces_fsdp_ref_offload=True,
    ),
    "trl": ExecutorTraits(
        name="trl",
        always_old_logprob=False,
        budget_scaled_by_sp=False,
        offload_streams=True,
        keeps_rollout_engine=True,
        scores_all_positions=False,
        padding="batch_max",
        masked_rows=True,
        log_prob_entropy=False,
        update_entropy_metric=False,
        ref_bytes=FP32_BYTES,
        logits_kernel="trl",
        missing_knobs=frozenset(
            {
                "ref_param_offload",
                "ulysses_sp",
                "fused_logprob",
                "enforce_eager",
                "max_num_seqs",
                "max_num_batched_tokens",
                "hf_decode",
                "remove_padding",
            }
        )
        | VERL_ERA_KNOBS
        | FAMILY_KNOBS,
        quantized_adapter_bytes=BF16_BYTES,
    ),
}
TARGET_NAMES: tuple[str, ...] = tuple(TRAITS)


def traits_for(target: str) -> ExecutorTraits:
    """The traits of one executor (KeyError for an unknown target: inputs are validated before this)."""
    return TRAITS[target]
