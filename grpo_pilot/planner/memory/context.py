"""`MemoryContext`: everything the phase estimators share, derived once per estimate (estimate.py step 1).

The layout (FSDP degree D over the training GPUs, colocated or split rollout pool), the element sizes
of the executor and device, the executor's and device's traits, the sharded states of one rank, the
overheads, the rollout engine's budget and what it leaves behind outside rollout, and the tokens per
rank of one update and one log-prob micro-batch at the memory quantile of the workload's lengths
(`lengths.py`).
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.hardware.device_traits import DeviceTraits
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.hf_decode_mode import hf_replica, hf_rollout_gpus, policy_sharded
from grpo_pilot.planner.lengths import Lengths, lengths_of, micro_batch_tokens, response_share
from grpo_pilot.planner.memory.activation_offload import ActivationOffload
from grpo_pilot.planner.memory.autocast import autocast_cast_params
from grpo_pilot.planner.memory.critic_plan import CriticPlan, critic_engine_start_bytes
from grpo_pilot.planner.memory.family_parts import (
    ActorStates,
    FamilyParts,
    actor_states,
    engine_budget_with_lora,
    family_parts,
)
from grpo_pilot.planner.memory.fsdp import gathered_layers_bytes, root_gathered_bytes
from grpo_pilot.planner.memory.layout import Layout, layout_for
from grpo_pilot.planner.memory.lora_plan import LoraPlan
from grpo_pilot.planner.memory.precision import Precision, precision_for, rollout_element_bytes
from grpo_pilot.planner.memory.rollout_engines import sglang_engine_budget, sleep_leftovers
from grpo_pilot.planner.memory.shared_prompts import SharedLayout, micro_batch_layouts
from grpo_pilot.planner.memory.tokens import budget_tokens_per_rank, fixed_tokens_per_rank, sequences_per_sp_group
from grpo_pilot.planner.memory.vllm_budget import VllmBudget, VllmSettings, vllm_budget
from grpo_pilot.planner.memory.weight_sync import largest_param_elements
from grpo_pilot.planner.memory.zero import REPLICATED_MODES, ZERO_MODES, ReplicatedStates, replicated_states
from grpo_pilot.planner.overheads import Overheads
from grpo_pilot.planner.ref_offload import ref_offloaded
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec


class MemoryContext(NamedTuple):
    """Everything the phase estimators share (module docstring)."""

    model: ModelSpec
    workload: Workload
    knobs: Knobs
    executor: ExecutorTraits
    device: DeviceTraits
    precision: Precision
    layout: Layout
    lengths: Lengths
    sharded: bool  # parameters are sharded and gathered (false: one rank using them in place)
    shard_degree: int  # GPUs the model states are sharded over
    autocast: bool  # fp32 weights used in place under bf16 autocast (memory/autocast.py)
    policy_cast_bytes: int  # autocast's bf16 copies of the policy's weights during its passes (unsharded)
    ref_cast_bytes: int  # the same for the reference model
    has_ref: bool
    param_offload: bool
    optimizer_offload: bool
    ref_offload: bool
    master_bytes: int  # one rank's shard of the actor's master parameters
    grad_bytes: int
    adam_bytes: int
    ref_bytes: int
    trainer_overheads: dict[str, int]
    rollout_overheads: dict[str, int]
    vllm: VllmBudget | None
    rollout_leftovers: dict[str, int]  # what the rollout engine keeps allocated outside rollout
    gathered_layers_bytes: int
    root_gathered_bytes: int
    layer_activation_bytes_per_token: int
    update_tokens: int  # tokens per rank of one update micro-batch
    log_prob_tokens: int  # tokens per rank of one log-prob micro-batch
    layouts: tuple[SharedLayout | None, ...]  # (update, log-prob) micro-batch in the shared-prompt layout, or None
    response_share: float  # response share of a micro-batch's positions
    device_bytes: int
    overheads: Overheads
    # launch families (memory/family_parts.py): None / 0 for a full fine-tune of GRPO without them
    lora: LoraPlan | None = None
    frozen_base_bytes: int = 0  # LoRA: one rank's shard of the frozen base (actor_params is the adapters)
    critic: CriticPlan | None = None
    activation_offload: ActivationOffload | None = None
    # our engine's hf rollout on a replica (planner/hf_decode_mode.py `hf_replica`, memory/hf_rollout.py)
    hf_replica_bytes: int = 0  # the replica's weights on its GPU (0: the rollout decodes the trainer's module)
    hf_rollout_gpus: int = 1  # GPUs the hf rollout generates on (`hf_decode_mode.hf_rollout_gpus`)
    # TRL under DeepSpeed ZeRO-1/2 or DDP (memory/zero.py)
    backward_buffer_bytes: int = 0  # ZeRO's IPG bucket during each backward
    step_grad_bytes: int = 0  # ZeRO's fp32 gradient partition during the optimizer step
    ddp_bucket_bytes: int = 0  # DDP's reducer buckets, resident in every phase
    zero_host_bytes: int = 0  # ZeRO-1/2 offload_optimizer: the partitions DeepSpeed keeps on the host (not Adam)


def engine_start_resident_bytes(
    knobs: Knobs,
    *,
    master_bytes: int,
    param_offload: bool,
    trainer_overheads: dict[str, int],
    split: bool,
    critic_bytes: int = 0,
    ref_bytes: int = 0,
    optimizer_bytes: int = 0,
    offloads_actor_at_init: bool | None = None,
) -> int:
    """Trainer memory on a colocated GPU when the rollout engine profiles (counted against its budget when
    knobs.vllm_memory is 'device' or 'free', and always for SGLang, which measures the memory free at its start
    whatever its version: memory/sglang_budget.py): the process's CUDA context, cuBLAS workspace and NCCL buffers,
    a PPO critic (`critic_plan.critic_engine_start_bytes`), and what verl's init left of the actor and the reference.

    verl's ray_trainer.init_workers initialises the critic, then the reference, then the reward model, and the
    actor with its rollout last ('so that vllm can have a better estimation of kv cache memory'; ray_trainer.py
    @v0.1 through volcengine/verl@b178a3cd5); ActorRolloutRefWorker.init_model builds the actor
    (_build_model_optimizer: the FSDP module and an AdamW whose states appear at the first step), offloads, then
    calls _build_rollout, in which the engine measures the GPU. With param_offload the actor's parameters are
    offloaded there only since 0fb0bedb7 (#1118, 2025-04-28; fsdp_workers.py init_model `offload_fsdp_model_to_cpu`);
    before, init moved only the gradients (fsdp_workers.py@v0.2 `offload_fsdp_grad`, 'param is require during
    state_dict in sharding manager') or, from 9db52329f (#284), nothing: `knobs.actor_offload_at_init` False counts
    them whatever param_offload. The reference (`ref_bytes`: its shard, 0 without a reference model) counts unless it
    is offloaded: the caller passes 0 where planner/ref_offload.py `ref_offloaded` says so — under its param_offload
    key (init_model offloaded it: fsdp_workers.py@fefca4172^ `offload_fsdp_param_and_grad`, megatron_workers.py
    `offload_megatron_model_to_cpu`), and for verl's FSDP reference since fefca4172 (#121, 2025-01-24) whatever
    the key: _build_model_optimizer wraps it in FSDP CPUOffload(offload_params=True) (FSDP2: CPUOffloadPolicy,
    db84a4007 #1026), so its parameters are on the host (`knobs.ref_forced_cpu_offload`; not the Megatron
    backend's). Other executors keep the knobs' defaults (today's verl).

    verl's Megatron backend (memory/megatron_phases.py) goes through the same rule with its own states: the
    reference is its own worker there too (main_ppo.py `Role.RefPolicy` -> megatron_workers.ActorRolloutRefWorker,
    built by ray_trainer.init_workers before the actor; the new engine builds it first in its init_model,
    engine_workers.py@b178a3cd5), left on the GPU unless `ref.megatron.param_offload` (megatron_workers.py
    init_model `offload_megatron_model_to_cpu(self.ref_module)`, @cc8fca504, @503ea75f5 and @b178a3cd5). Its actor
    (`master_bytes`: the bf16 params and the DDP grad buffer) is offloaded at init under param_offload since that
    offload exists (#1162, cc8fca504: `offloads_actor_at_init` True, whatever `knobs.actor_offload_at_init`, which
    dates FSDP's #1118), and `optimizer_bytes` is what its optimizer built at construction (the caller passes 0
    where the optimizer offload moved it). None of the two is FSDP's: its AdamW states appear at the first step."""
    if (knobs.vllm_memory == "instance" and knobs.rollout_backend != "sglang") or split:
        return 0
    at_init = knobs.actor_offload_at_init if offloads_actor_at_init is None else offloads_actor_at_init
    actor = 0 if param_offload and at_init else master_bytes
    return actor + optimizer_bytes + ref_bytes + sum(trainer_overheads.values()) + critic_bytes


def process_overheads(
    overheads: Overheads, device: DeviceTraits, *, sharded: bool, ulysses_sp: int, sync_group: bool
) -> tuple[dict[str, int], dict[str, int]]:
    """(trainer process overheads, rollout-only GPU overheads) per device. `sync_group`: a split placement whose
    weight sync joins both pools in an NCCL group (`ExecutorTraits.split_sync_via_host` False)."""
    if not device.caching_allocator:
        rss = {"overhead_process_rss": overheads.cpu_process_rss_bytes}
        return rss, dict(rss)
    comms = (1 if sharded else 0) + (1 if ulysses_sp > 1 else 0) + (1 if sync_group else 0)
    base = {
        "overhead_cuda_context": overheads.cuda_context_bytes,
        "overhead_cublas_workspace": overheads.cublas_workspace_bytes,
    }
    trainer = {**base, "overhead_nccl": comms * overheads.nccl_bytes_per_communicator}
    rollout = {**base, "overhead_nccl": overheads.nccl_bytes_per_communicator if sync_group else 0}
    return trainer, rollout


def micro_batch_tokens_per_rank(
    workload: Workload, knobs: Knobs, executor: ExecutorTraits, *, lengths: Lengths, trainer_gpus: int
) -> tuple[int, int]:
    """(update, log-prob) tokens per rank of one micro-batch, at the memory quantile of the lengths."""
    sp = knobs.ulysses_sp
    mini_seqs = sequences_per_sp_group(workload.mini_batch_prompts * workload.n, trainer_gpus, sp)
    step_seqs = sequences_per_sp_group(workload.prompts_per_step * workload.n, trainer_gpus, sp)
    population = step_seqs if executor.balances_batch else None

    def packed(budget_tokens: int, available_seqs: int) -> int:
        available = micro_batch_tokens(available_seqs, lengths, padding="remove", population=population)
        return budget_tokens_per_rank(
            budget_tokens=budget_tokens,
            longest_seq_tokens=lengths.seq_max,
            available_tokens=available,
            ulysses_sp=sp,
            budget_scaled_by_sp=executor.budget_scaled_by_sp,
        )

    def fixed(seqs: int, available_seqs: int) -> int:
        count = min(seqs, available_seqs)
        # TRL pads a micro-batch to the longest of the rank's whole generation batch (lengths.micro_batch_tokens)
        pool = step_seqs if executor.padding == "batch_max" else available_seqs
        tokens = micro_batch_tokens(count, lengths, padding=executor.padding, pool=pool, population=population)
        return fixed_tokens_per_rank(tokens, sp)

    if knobs.max_token_len_per_gpu is not None:
        update = packed(knobs.max_token_len_per_gpu, mini_seqs)
    else:
        update = fixed(knobs.micro_batch_size_per_gpu or 1, mini_seqs)
    if knobs.log_prob_micro_batch_size_per_gpu is not None:
        log_prob = fixed(knobs.log_prob_micro_batch_size_per_gpu, step_seqs)
    else:
        log_prob = packed(knobs.log_prob_max_token_len_per_gpu, step_seqs)
    return update, log_prob


def rollout_engine(
    model: ModelSpec,
    knobs: Knobs,
    *,
    device: DeviceTraits,
    device_bytes: int,
    rollout_bytes: int,
    overheads: Overheads,
    preexisting_bytes: int,
) -> VllmBudget | None:
    """The rollout engine's budget on one GPU (None for HF rollout on the policy itself): vLLM's, or SGLang's
    in the same view (memory/rollout_engines.py)."""
    if knobs.rollout_backend == "sglang":
        return sglang_engine_budget(
            model,
            utilization=knobs.gpu_memory_utilization,
            tensor_parallel=knobs.rollout_tp,
            max_num_seqs=knobs.max_num_seqs,
            cuda_graphs=device.cuda_graphs and not knobs.enforce_eager,
            device_bytes=device_bytes,
            weight_bytes=rollout_bytes,
            overheads=overheads,
            preexisting_bytes=preexisting_bytes,
        )
    if knobs.rollout_backend != "vllm":
        return None
    settings = VllmSettings(
        utilization=knobs.gpu_memory_utilization,
        tensor_parallel=knobs.rollout_tp,
        max_num_batched_tokens=knobs.max_num_batched_tokens,
        max_num_seqs=knobs.max_num_seqs,
        cuda_graphs=device.cuda_graphs and not knobs.enforce_eager,
        non_torch_buffers=device.caching_allocator,
        engine=knobs.vllm_engine,
        of_free=knobs.vllm_memory == "free",
    )
    return vllm_budget(
        model=model,
        settings=settings,
        device_bytes=device_bytes,
        weight_bytes=rollout_bytes,
        overheads=overheads,
        preexisting_bytes=preexisting_bytes,
    )


def rollout_leftovers(
    budget: VllmBudget | None, executor: ExecutorTraits, split: bool, engine: str = "vllm"
) -> dict[str, int]:
    """What a colocated rollout engine keeps allocated during the training phases: verl and our engine free
    weights and KV cache (sleep level 2; CUDA graphs and non-torch buffers stay; SGLang keeps its graphs);
    TRL colocate keeps everything (`ExecutorTraits.keeps_rollout_engine`) except the profile run's
    activation peak."""
    if budget is None or split:
        return {}
    kept = sleep_leftovers(engine, budget)
    if executor.keeps_rollout_engine:
        kept.update(vllm_weights=budget.weights_bytes, vllm_kv_cache=budget.kv_cache_bytes)
    return kept


def _rollout_budget(
    model: ModelSpec,
    knobs: Knobs,
    *,
    device: DeviceTraits,
    device_bytes: int,
    prec: Precision,
    overheads: Overheads,
    trainer_overheads: dict[str, int],
    split: bool,
    held_bytes: int,
    fam: FamilyParts,
    ref_bytes: int = 0,
) -> VllmBudget | None:
    """The rollout engine's budget beside what the trainer holds when it starts (`engine_start_resident_bytes`: the
    actor's parameters unless verl's init offloaded them, a pre-#121 reference, a PPO critic's) and vLLM's LoRA slots
    inside it (memory/family_parts.py)."""
    preexisting = engine_start_resident_bytes(
        knobs,
        master_bytes=held_bytes,
        param_offload=knobs.param_offload and device.offload_meaningful,
        trainer_overheads=trainer_overheads,
        split=split,
        critic_bytes=critic_engine_start_bytes(fam.critic),
        ref_bytes=ref_bytes,
    )
    engine = rollout_engine(
        model,
        knobs,
        device=device,
        device_bytes=device_bytes,
        rollout_bytes=prec.rollout_bytes,
        overheads=overheads,
        preexisting_bytes=preexisting,
    )
    return engine_budget_with_lora(engine, fam.lora)


class _Sharding(NamedTuple):
    """Where the training states live: the layout, the precision, whether and how far they are sharded."""

    precision: Precision
    layout: Layout
    lengths: Lengths
    sharded: bool  # parameters are sharded and gathered (false: one rank using them in place)
    shard_degree: int  # FSDP group size (HSDP replicates across groups)
    param_offload: bool


def _sharding(cluster: Cluster, workload: Workload, knobs: Knobs, executor: ExecutorTraits) -> _Sharding:
    """The layout over the cluster, the executor's precision on its device and the sharding of the states."""
    device = cluster.device
    lay = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    # offload is meaningless on the cpu pseudo-device: host RAM is the device
    p_off = knobs.param_offload and device.offload_meaningful
    # ZeRO-1/2 and DDP replicate the parameters: each rank runs the module in place (memory/zero.py)
    sharded = knobs.state_sharding not in REPLICATED_MODES and policy_sharded(
        trainer_gpus=lay.trainer_gpus,
        device=device,
        executor=executor,
        param_offload=p_off,
        optimizer_offload=knobs.optimizer_offload and device.offload_meaningful,
    )
    return _Sharding(
        precision=precision_for(executor, device, model_dtype=knobs.model_dtype, state_sharding=knobs.state_sharding),
        layout=lay,
        lengths=lengths_of(workload),
        sharded=sharded,
        shard_degree=knobs.shard_degree(lay.trainer_gpus),
        param_offload=p_off,
    )


class _Held(NamedTuple):
    """What one training rank holds: the launch families' parts, the actor's states, the micro-batch tokens."""

    fam: FamilyParts
    states: ActorStates
    autocast: bool  # fp32 weights used in place under bf16 autocast (memory/autocast.py)
    update_tokens: int
    log_prob_tokens: int
    replicated: ReplicatedStates | None  # ZeRO-1/2 or DDP (memory/zero.py)


def _held(
    model: ModelSpec, workload: Workload, knobs: Knobs, *, executor: ExecutorTraits, device: DeviceTraits, sh: _Sharding
) -> _Held:
    """The families' parts (LoRA, critic, activation offload), the actor's states of one rank and the tokens per
    rank of one update and one log-prob micro-batch."""
    prec, lay = sh.precision, sh.layout

    def tokens_of(k: Knobs) -> tuple[int, int]:
        return micro_batch_tokens_per_rank(workload, k, executor, lengths=sh.lengths, trainer_gpus=lay.trainer_gpus)

    update_tokens, log_prob_tokens = tokens_of(knobs)
    fam = family_parts(
        model,
        workload,
        knobs,
        executor=executor,
        precision=prec,
        shards=sh.shard_degree,
        sharded=sh.sharded,
        tokens_of=tokens_of,
        offload_meaningful=device.offload_meaningful,
    )
    # DeepSpeed casts the module to bf16 (memory/zero.py): ZeRO-1/2 run without autocast
    zero = knobs.state_sharding in ZERO_MODES and device.mixed_precision
    autocast = not sh.sharded and prec.master_bytes != prec.compute_bytes and not zero
    casts = autocast_cast_params(model, lm_head=not (knobs.fused_logprob and executor.logits_kernel == "ours"))
    states = actor_states(
        model,
        prec,
        shards=sh.shard_degree,
        sharded=sh.sharded,
        has_ref=workload.use_kl_loss,
        lora=fam.lora,
        autocast=autocast,
        casts=casts,
    )
    o_off = knobs.optimizer_offload and device.offload_meaningful
    rep = _replicated(model, knobs, prec, sh, has_ref=workload.use_kl_loss, optimizer_offload=o_off)
    rep = rep if fam.lora is None else None
    if rep is not None:
        states = states._replace(
            master_bytes=rep.params_bytes, grad_bytes=rep.grad_bytes, adam_bytes=rep.adam_bytes, ref_bytes=rep.ref_bytes
        )
        if zero:  # bf16 weights: autocast has nothing to cast
            states = states._replace(policy_cast_bytes=0, ref_cast_bytes=0)
    return _Held(fam, states, autocast, update_tokens, log_prob_tokens, rep)


def _replicated(
    model: ModelSpec, knobs: Knobs, prec: Precision, sh: _Sharding, *, has_ref: bool, optimizer_offload: bool
) -> ReplicatedStates | None:
    """The states under ZeRO-1/2 or DDP (memory/zero.py); None under full sharding (or a LoRA policy, whose
    adapters' states are planned by memory/lora_plan.py over `shard_degree`)."""
    if knobs.state_sharding not in REPLICATED_MODES:
        return None
    return replicated_states(
        model.num_params,
        mode=knobs.state_sharding,
        ranks=sh.layout.trainer_gpus,
        compute_bytes=prec.compute_bytes,
        master_bytes=prec.master_bytes,
        grad_bytes=prec.grad_bytes,
        adam_bytes=prec.adam_bytes,
        ref_bytes=prec.ref_bytes,
        has_ref=has_ref,
        # DeepSpeed's offload_optimizer (memory/zero.py); DDP has none (family_constraints offload.needs_sharding)
        optimizer_offload=optimizer_offload and knobs.state_sharding in ZERO_MODES,
        largest_param_elements=largest_param_elements(
            model.vocab_size, model.hidden_size, model.intermediate_size, model.q_dim
        ),
    )


class _RolloutSide(NamedTuple):
    """The process overheads and the rollout engine: its budget and what it keeps outside rollout."""

    trainer_overheads: dict[str, int]
    rollout_overheads: dict[str, int]
    budget: VllmBudget | None
    leftovers: dict[str, int]


def _rollout_side(
    model: ModelSpec,
    cluster: Cluster,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    overheads: Overheads,
    sh: _Sharding,
    held: _Held,
) -> _RolloutSide:
    """The trainer's and the rollout's process overheads, then the rollout engine's budget beside what the trainer
    holds at its start, and what the engine keeps allocated during the training phases."""
    lay, device = sh.layout, cluster.device
    trainer_oh, rollout_oh = process_overheads(
        overheads,
        device,
        sharded=lay.trainer_gpus > 1,
        ulysses_sp=knobs.ulysses_sp,
        sync_group=lay.split and not executor.split_sync_via_host,
    )
    budget = _rollout_budget(
        model,
        knobs,
        device=device,
        device_bytes=cluster.device_memory_bytes,
        prec=sh.precision,
        overheads=overheads,
        trainer_overheads=trainer_oh,
        split=lay.split,
        # the actor's parameters at the engine's start
        held_bytes=held.states.master_bytes + held.states.frozen_base_bytes,
        fam=held.fam,
        # verl's FSDP reference since #121 is on the host whatever the key (planner/ref_offload.py)
        ref_bytes=0 if ref_offloaded(knobs, executor) and device.offload_meaningful else held.states.ref_bytes,
    )
    leftovers = rollout_leftovers(budget, executor, lay.split, knobs.rollout_backend)
    return _RolloutSide(trainer_oh, rollout_oh, budget, leftovers)


def memory_context(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    overheads: Overheads,
) -> MemoryContext:
    """Derive the shared quantities once (module docstring)."""
    device, device_bytes = cluster.device, cluster.device_memory_bytes
    sh = _sharding(cluster, workload, knobs, executor)
    prec, lay, lengths, sharded, shards, p_off = sh
    held = _held(model, workload, knobs, executor=executor, device=device, sh=sh)
    fam, states, autocast, update_tokens, log_prob_tokens, rep = held
    c, has_ref = prec.compute_bytes, workload.use_kl_loss
    trainer_oh, rollout_oh, budget, leftovers = _rollout_side(
        model, cluster, knobs, executor=executor, overheads=overheads, sh=sh, held=held
    )
    shared = dict(group_size=workload.n, applies=executor.shares_prompts and not sharded, compute_bytes=c)
    replica = hf_replica(knobs=knobs, executor=executor, sharded=sharded, split=lay.split)
    return MemoryContext(
        model=model,
        workload=workload,
        knobs=knobs,
        executor=executor,
        device=device,
        precision=prec,
        layout=lay,
        lengths=lengths,
        sharded=sharded,
        shard_degree=shards,
        autocast=autocast,
        policy_cast_bytes=states.policy_cast_bytes,
        ref_cast_bytes=states.ref_cast_bytes,
        has_ref=has_ref,
        param_offload=p_off,
        optimizer_offload=knobs.optimizer_offload and device.offload_meaningful,
        ref_offload=ref_offloaded(knobs, executor) and device.offload_meaningful,  # the key or verl's force
        master_bytes=states.master_bytes,
        grad_bytes=states.grad_bytes,
        adam_bytes=states.adam_bytes,
        ref_bytes=states.ref_bytes,
        trainer_overheads=trainer_oh,
        rollout_overheads=rollout_oh,
        vllm=budget,
        rollout_leftovers=leftovers,
        gathered_layers_bytes=gathered_layers_bytes(model.params_per_layer, prec.compute_bytes, unsharded=not sharded),
        root_gathered_bytes=root_gathered_bytes(
            model.embedding_params, model.lm_head_params, prec.compute_bytes, unsharded=not sharded
        ),
        layer_activation_bytes_per_token=states.layer_activation_bytes_per_token,
        update_tokens=update_tokens,
        log_prob_tokens=log_prob_tokens,
        layouts=micro_batch_layouts(
            model,
            lengths,
            tokens=(update_tokens, log_prob_tokens),
            autocast=autocast,
            **shared,  # type: ignore[arg-type]
        ),
        response_share=response_share(lengths),
        device_bytes=device_bytes,
        overheads=overheads,
        lora=fam.lora,
        frozen_base_bytes=states.frozen_base_bytes,
        critic=fam.critic,
        activation_offload=fam.activation_offload,
        # engine/worker.py `_build_rollout`: the replica in bf16 on a GPU, fp32 on the cpu device
        hf_replica_bytes=rollout_element_bytes(device) * model.num_params if replica else 0,
        hf_rollout_gpus=hf_rollout_gpus(lay, cluster.num_nodes, replica=replica),
        backward_buffer_bytes=rep.backward_buffer_bytes if rep else 0,
        step_grad_bytes=rep.step_grad_bytes if rep else 0,
        ddp_bucket_bytes=rep.ddp_bucket_bytes if rep else 0,
        zero_host_bytes=rep.host_bytes if rep else 0,
    )
