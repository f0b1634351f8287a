"""verl's Megatron backend (`actor.strategy=megatron`) phase by phase: the orchestrator over memory/megatron.py
and memory/megatron_activations.py (docs/families.md §1).

Layout: the training GPUs form TP × PP × CP × DP (`Knobs.megatron_*`; DP = training GPUs / (TP·PP·CP)); the
reference module (GRPO's KL) has the actor's parallel sizes (verl interpolates `ref.megatron.*` from the
actor's). Each phase is judged on the stage that peaks: the first (embedding, the most micro-batches in
flight) or the last (final norm, output layer, the logits).

- rollout: the trainer's states under verl's load-use-offload (`megatron_resident_items`) beside the rollout
  engine (vLLM or SGLang, `rollout_engines.py`), whose budget on each stage sees what the trainer held there at
  its start (the KV tokens from the stage that leaves the engine the least, `_tightest`)
  (`engine_start_held_bytes`: bf16 params and the fp32 grad buffer unless `param_offload`, the optimizer's fp32
  main params unless `optimizer_offload`, the reference's shard unless `ref_param_offload`);
- log_prob: the old-policy pass (params on) and the reference pass (ref params on), forward-only pipelines:
  one layer's forward transient per stage (`forward_only_bytes`), the last stage's vocab-parallel logits
  (with entropy for the old-policy pass: verl's `compute_log_prob(calculate_entropy=True)`);
- update: params, grad buffer and the (distributed) optimizer on; the stage's update peak
  (`update_peak_items` over `stage_activation_bytes`: 1F1B / interleaved in-flight micro-batches, SP,
  CP, recompute) with the logits on the last stage;
- weight sync: params on, the per-tensor export transient (TP all-gather + concat, PP broadcast:
  `megatron_weight_export_bytes`) and the transfer bucket, beside the engine's resumed weights;
- host RAM: pinned bf16 params, the optimizer's fp32 states and the reference's params of every training
  rank on the node that offloads them, and one process per GPU.
Micro-batches: `micro_batch_size_per_gpu` sequences per DP rank, or with dynamic batching a token budget ×
CP per micro-batch (verl megatron_actor.py: `max_token_len = ppo_max_token_len_per_gpu ×
context_parallel_size`), the mini-batch's sequences packed into m of them; m sets the in-flight count.
Not modelled (docs/families.md §7): MoE token dispatch (refused: planner/support.py), the optimizer step's
multi-tensor temporaries, uneven first/last stage layer counts (`num_layers_in_first_pipeline_stage`).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.planner.config import Knobs, old_logprob_pass_needed
from grpo_pilot.planner.memory.context import (
    MemoryContext,
    engine_start_resident_bytes,
    micro_batch_tokens_per_rank,
    rollout_engine,
    rollout_leftovers,
)
from grpo_pilot.planner.memory.kv_cache import concurrent_sequences, kv_bytes_per_token_per_gpu, kv_tokens
from grpo_pilot.planner.memory.megatron import (
    MegatronParallel,
    MegatronStates,
    megatron_host_items,
    megatron_resident_items,
    megatron_state_bytes,
    megatron_weight_export_bytes,
    stage_params,
)
from grpo_pilot.planner.memory.megatron_activations import (
    Recompute,
    forward_only_bytes,
    megatron_logits_bytes,
    stage_activation_bytes,
    update_peak_items,
)
from grpo_pilot.planner.memory.rollout_engines import SYNC_FIELDS, engine_items
from grpo_pilot.planner.memory.shape import TransformerShape, shape_of
from grpo_pilot.planner.memory.vllm_budget import VllmBudget
from grpo_pilot.planner.memory.weight_sync import largest_param_elements

Finish = Callable[[MemoryContext, dict[str, int], dict[str, int], dict[str, int]], dict[str, int]]


class MegatronMemory(NamedTuple):
    phases: dict[str, dict[str, int]]
    host: dict[str, int]
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_concurrent_seqs: int


class _Stage(NamedTuple):
    index: int
    last: bool
    states: MegatronStates
    ref_params_bytes: int


def megatron_parallel(knobs: Knobs, trainer_gpus: int) -> MegatronParallel:
    """The Megatron layout of the knobs over the training GPUs (DP = GPUs / (TP·PP·CP), at least 1)."""
    model_parallel = knobs.megatron_tp * knobs.megatron_pp * knobs.megatron_cp
    return MegatronParallel(
        tp=knobs.megatron_tp,
        pp=knobs.megatron_pp,
        vpp=knobs.megatron_vpp,
        cp=knobs.megatron_cp,
        dp=max(1, trainer_gpus // model_parallel),
        sequence_parallel=knobs.megatron_sequence_parallel,
        distributed_optimizer=knobs.megatron_distributed_optimizer,
    )


def megatron_recompute(knobs: Knobs) -> Recompute:
    return Recompute(
        granularity=knobs.megatron_recompute,
        method=knobs.megatron_recompute_method,
        num_layers=knobs.megatron_recompute_num_layers,
    )


class MegatronTokens(NamedTuple):
    update: int  # tokens of one update micro-batch of one DP rank (before the CP split)
    log_prob: int
    microbatches: int  # micro-batches of one mini-batch on one DP rank (the pipeline's m)


def megatron_tokens(ctx: MemoryContext, par: MegatronParallel) -> MegatronTokens:
    """Micro-batch tokens per DP rank and the micro-batches of a mini-batch (module docstring)."""
    k, w = ctx.knobs, ctx.workload
    scaled = k.model_copy(
        update={
            "ulysses_sp": 1,
            "max_token_len_per_gpu": None if k.max_token_len_per_gpu is None else k.max_token_len_per_gpu * par.cp,
            "log_prob_max_token_len_per_gpu": k.log_prob_max_token_len_per_gpu * par.cp,
        }
    )
    update, log_prob = micro_batch_tokens_per_rank(w, scaled, ctx.executor, lengths=ctx.lengths, trainer_gpus=par.dp)
    seqs = math.ceil(w.mini_batch_prompts * w.n / par.dp)
    if scaled.max_token_len_per_gpu is not None:
        m = math.ceil(seqs * ctx.lengths.seq_mean / max(1, scaled.max_token_len_per_gpu))
    else:
        m = math.ceil(seqs / max(1, k.micro_batch_size_per_gpu or 1))
    return MegatronTokens(update, log_prob, max(1, m))


def _stages(ctx: MemoryContext, shape: TransformerShape, par: MegatronParallel) -> list[_Stage]:
    out = []
    for index in sorted({0, par.pp - 1}):
        params = stage_params(shape, par, index)
        ref = megatron_state_bytes(params, par, trainable=False).params_bytes if ctx.has_ref else 0
        out.append(_Stage(index, index == par.pp - 1, megatron_state_bytes(params, par), ref))
    return out


def _resident(ctx: MemoryContext, stage: _Stage, phase: str) -> dict[str, int]:
    return megatron_resident_items(
        stage.states,
        stage.ref_params_bytes,
        phase,
        param_offload=ctx.param_offload,
        optimizer_offload=ctx.optimizer_offload,
        ref_param_offload=ctx.ref_offload,
    )


def engine_start_held_bytes(ctx: MemoryContext, stage: _Stage) -> int:
    """What the Megatron trainer holds on a colocated GPU when the rollout engine measures it, through the FSDP
    path's rule (memory/context.py `engine_start_resident_bytes`, counted for vLLM's 'device' / 'free' and SGLang):
    - the actor's bf16 params and fp32 grad buffer (Megatron DDP allocates both at model build) unless
      param_offload: verl's init_model offloads them before `_build_rollout` (megatron_workers.py
      `offload_megatron_model_to_cpu(self.actor_module)`, volcengine/verl@cc8fca504 #1162 through @b178a3cd5);
    - the optimizer's fp32 main params unless optimizer_offload: Megatron-LM builds them when the optimizer is
      constructed (NVIDIA/Megatron-LM megatron/core/optimizer/distrib_optimizer.py, DistributedOptimizer.__init__
      -> `_build_model_and_main_param_groups`: `shard_model_param.clone().float()`), and verl's init offloads them
      under optimizer_offload only (megatron_utils.py `offload_megatron_copy_params`: `shard_fp32_from_float16_groups`,
      @cc8fca504 and @b178a3cd5); Adam's moments appear at the first step (the same offload moves them if present);
    - the reference's bf16 shard (TP × PP, `_stages`) unless it is offloaded: built before the actor and rollout
      and offloaded by init_model only under `ref.megatron.param_offload` (planner/ref_offload.py: no forced
      offload outside FSDP; `ctx.ref_offload`);
    - the process overheads. No critic: refused under Megatron (planner/support.py)."""
    s = stage.states
    return engine_start_resident_bytes(
        ctx.knobs,
        master_bytes=s.params_bytes + s.grads_bytes,
        param_offload=ctx.param_offload,
        trainer_overheads=ctx.trainer_overheads,
        split=ctx.layout.split,
        ref_bytes=0 if ctx.ref_offload else stage.ref_params_bytes,
        optimizer_bytes=0 if ctx.optimizer_offload else s.master_bytes,
        offloads_actor_at_init=True,
    )


def _engine_budget(ctx: MemoryContext, stage: _Stage) -> VllmBudget | None:
    """The rollout engine's budget on a GPU of `stage`, with what the Megatron trainer holds there when the engine
    starts (`engine_start_held_bytes`)."""
    k = ctx.knobs
    preexisting = engine_start_held_bytes(ctx, stage)
    return rollout_engine(
        ctx.model,
        k,
        device=ctx.device,
        device_bytes=ctx.device_bytes,
        rollout_bytes=ctx.precision.rollout_bytes,
        overheads=ctx.overheads,
        preexisting_bytes=preexisting,
    )


def _logits(ctx: MemoryContext, par: MegatronParallel, tokens: int, *, training: bool, entropy: bool) -> int:
    m = ctx.model
    return megatron_logits_bytes(
        -(-tokens // par.cp),
        m.vocab_size,
        m.hidden_size,
        par.tp,
        compute_bytes=ctx.precision.compute_bytes,
        training=training,
        entropy=entropy,
        fused=ctx.knobs.fused_logprob,
    )


def _update_work(
    ctx: MemoryContext, shape: TransformerShape, *, par: MegatronParallel, stage: _Stage, tok: MegatronTokens
) -> dict[str, int]:
    c = ctx.precision.compute_bytes
    acts = stage_activation_bytes(
        shape,
        par,
        tokens_per_microbatch=tok.update,
        num_microbatches=tok.microbatches,
        compute_bytes=c,
        recompute=megatron_recompute(ctx.knobs),
        stage=stage.index,
    )
    sp = par.tp if (par.sequence_parallel and par.tp > 1) else 1
    head = 2 * c * shape.hidden * -(-tok.update // (par.cp * sp))  # the final norm's input and output
    logits = _logits(ctx, par, tok.update, training=True, entropy=ctx.workload.entropy_coeff > 0)
    return update_peak_items(acts, logits if stage.last else 0, head, last_stage=stage.last)


def _log_prob_work(
    ctx: MemoryContext, shape: TransformerShape, *, par: MegatronParallel, stage: _Stage, tok: MegatronTokens, ref: bool
) -> dict[str, int]:
    c = ctx.precision.compute_bytes
    layer = forward_only_bytes(shape, par, tokens_per_microbatch=tok.log_prob, compute_bytes=c)
    logits = _logits(ctx, par, tok.log_prob, training=False, entropy=not ref) if stage.last else 0
    return {"activations": layer, "logits": logits}


def _peak(options: list[dict[str, int]]) -> dict[str, int]:
    return max(options, key=lambda items: sum(items.values()))


class _Parts(NamedTuple):
    shape: TransformerShape
    par: MegatronParallel
    tokens: MegatronTokens
    stages: list[_Stage]
    budgets: list[VllmBudget]  # the engine's budget on each stage's GPUs (`stages` order)
    leftovers: list[dict[str, int]]

    @property
    def budget(self) -> VllmBudget:
        """The smallest cache across stages (`_tightest`)."""
        return _tightest(self.budgets)


def _tightest(budgets: list[VllmBudget]) -> VllmBudget:
    """The budget that bounds the rollout: the stage holding the most (the first: embedding; the last: the output
    layer) leaves its engine the least. Megatron orders ranks tp-cp-ep-dp-pp, so a rollout TP group of consecutive
    ranks sits inside one stage and each stage's engines size their own cache (the rollout peak pairs each stage
    with its own budget, `_rollout`); the step waits for the slowest engine, so the KV tokens and the
    concurrency come from the smallest. A group spanning stages gets the smallest too: vLLM gives every worker
    of an engine the smallest worker's block count (vllm/v1/core/kv_cache_utils.py `unify_kv_cache_configs`;
    V0: the executor's `determine_num_available_blocks`, min over workers)."""
    return min(budgets, key=lambda b: b.kv_signed_bytes)


def _stage_budgets(ctx: MemoryContext, stages: list[_Stage]) -> list[VllmBudget]:
    budgets = [_engine_budget(ctx, s) for s in stages]
    if any(b is None for b in budgets):  # refused upstream (support.py): Megatron rolls out with vLLM or SGLang
        raise ValueError("Megatron plans need a vLLM or SGLang rollout engine")
    return [b for b in budgets if b is not None]


def _parts(ctx: MemoryContext) -> _Parts:
    shape = shape_of(ctx.model)
    par = megatron_parallel(ctx.knobs, ctx.layout.trainer_gpus)
    stages = _stages(ctx, shape, par)
    budgets = _stage_budgets(ctx, stages)
    left = [rollout_leftovers(b, ctx.executor, ctx.layout.split, ctx.knobs.rollout_backend) for b in budgets]
    return _Parts(shape, par, megatron_tokens(ctx, par), stages, budgets, left)


def megatron_engine_budget(ctx: MemoryContext) -> VllmBudget | None:
    """The rollout engine's budget under the Megatron trainer on the stage that leaves it the least (`_tightest`;
    signed KV for the constraints)."""
    shape = shape_of(ctx.model)
    stages = _stages(ctx, shape, megatron_parallel(ctx.knobs, ctx.layout.trainer_gpus))
    return _tightest(_stage_budgets(ctx, stages))


def _rollout(ctx: MemoryContext, p: _Parts, finish: Finish) -> dict[str, int]:
    backend = ctx.knobs.rollout_backend
    if ctx.layout.split:
        return {**engine_items(backend, p.budget), **ctx.rollout_overheads}
    return _peak(
        [
            finish(ctx, _resident(ctx, s, "rollout"), engine_items(backend, b), ctx.trainer_overheads)
            for s, b in zip(p.stages, p.budgets)
        ]
    )


def _log_prob(ctx: MemoryContext, p: _Parts, finish: Finish) -> dict[str, int]:
    kinds = ([("log_prob", False)] if old_logprob_pass_needed(ctx.workload, ctx.executor) else []) + (
        [("ref_log_prob", True)] if ctx.has_ref else []
    )
    passes = [
        finish(
            ctx,
            {**_resident(ctx, s, phase), **_log_prob_work(ctx, p.shape, par=p.par, stage=s, tok=p.tokens, ref=ref)},
            left,
            ctx.trainer_overheads,
        )
        for s, left in zip(p.stages, p.leftovers)
        for phase, ref in kinds
    ]
    if passes:
        return _peak(passes)
    return _peak(
        [
            finish(ctx, _resident(ctx, s, "log_prob"), left, ctx.trainer_overheads)
            for s, left in zip(p.stages, p.leftovers)
        ]
    )


def _update(ctx: MemoryContext, p: _Parts, finish: Finish) -> dict[str, int]:
    return _peak(
        [
            finish(
                ctx,
                {**_resident(ctx, s, "update"), **_update_work(ctx, p.shape, par=p.par, stage=s, tok=p.tokens)},
                left,
                ctx.trainer_overheads,
            )
            for s, left in zip(p.stages, p.leftovers)
        ]
    )


def _weight_sync(ctx: MemoryContext, p: _Parts, finish: Finish) -> dict[str, int]:
    m = ctx.model
    largest = largest_param_elements(m.vocab_size, m.hidden_size, m.intermediate_size, m.q_dim)
    transfer = {
        "weight_sync_bucket": ctx.overheads.weight_sync_bucket_bytes,
        "megatron_weight_export": megatron_weight_export_bytes(largest, p.par, ctx.precision.compute_bytes),
    }
    kept = SYNC_FIELDS[ctx.knobs.rollout_backend]
    if ctx.layout.split:
        kept += ("kv_cache_bytes",)
    return _peak(
        [
            finish(
                ctx,
                {**_resident(ctx, s, "weight_sync"), **transfer},
                engine_items(ctx.knobs.rollout_backend, b, include=kept),
                ctx.trainer_overheads,
            )
            for s, b in zip(p.stages, p.budgets)
        ]
    )


def megatron_memory(ctx: MemoryContext, cluster: Cluster, *, finish: Finish) -> MegatronMemory:
    """Per-GPU peaks of every phase on the stage that peaks, and host RAM per node (module docstring)."""
    p = _parts(ctx)
    m = ctx.model
    kv_per_token = kv_bytes_per_token_per_gpu(m, ctx.knobs.rollout_tp, ctx.precision.rollout_bytes)
    tokens = kv_tokens(p.budget.kv_cache_bytes, kv_per_token)
    return MegatronMemory(
        phases={
            "rollout": _rollout(ctx, p, finish),
            "log_prob": _log_prob(ctx, p, finish),
            "update": _update(ctx, p, finish),
            "weight_sync": _weight_sync(ctx, p, finish),
        },
        host=_host(ctx, cluster, p.stages[0]),
        kv_cache_bytes=p.budget.kv_cache_bytes,
        kv_cache_tokens=tokens,
        max_concurrent_seqs=concurrent_sequences(tokens, ctx.lengths.seq_max, ctx.knobs.max_num_seqs),
    )


def _host(ctx: MemoryContext, cluster: Cluster, stage: _Stage) -> dict[str, int]:
    ov = ctx.overheads
    items = megatron_host_items(
        stage.states,
        stage.ref_params_bytes,
        ctx.layout.trainer_gpus_per_node,
        param_offload=ctx.param_offload,
        optimizer_offload=ctx.optimizer_offload,
        ref_param_offload=ctx.ref_offload and ctx.has_ref,
    )
    rss = ov.host_rss_bytes_per_gpu_process if ctx.device.caching_allocator else ov.cpu_process_rss_bytes
    return {**items, "process_rss": cluster.gpus_per_node * rss}
