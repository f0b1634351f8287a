"""The memory orchestrator: per-GPU peak bytes of every GRPO phase, itemised, plus host RAM per node.

`estimate_memory` builds one frozen `MemoryContext` (everything the phases share, derived once) and
then one function per phase reads it (reference/memory-model.md is the spec; each leaf in
`planner/memory/` cites its sources):

1. context: the layout (FSDP degree D over the training GPUs, colocated or split rollout pool), the
   element sizes of the executor and device, the executor's traits (`traits.py`), the sharded states
   of one rank, the overheads, the rollout engine's budget and what it leaves behind outside rollout,
   and the tokens per rank of one update and one log-prob micro-batch at the memory quantile of the
   workload's lengths (`lengths.py`);
2. `resident`: what of the trainer's state is on the GPU during a phase: sharded fp32 master params,
   grads (update only — every target frees them after the optimizer step: verl's update_policy ends
   with `zero_grad()`, TRL/HF Trainer and our engine zero with set_to_none), Adam states and the
   reference shard. Offload semantics differ by executor (`ExecutorTraits.offload_streams`):
     streaming (our engine, TRL) — FSDP2 CPUOffloadPolicy / ZeRO-3 offload: an offloaded shard never
       returns to the GPU; layers are gathered from host memory and the optimizer steps on the host.
     load-use-offload (verl, fsdp_workers) — actor params come back for the old log-prob pass and the
       update, Adam states for the update, the reference for its pass;
3. what the rollout engine leaves behind outside rollout: verl and our engine free weights and KV
   cache (free_cache_engine, sleep level 2); CUDA graphs and non-torch buffers stay. TRL colocate
   keeps everything (`ExecutorTraits.keeps_rollout_engine`), except the profile-run activation peak,
   which is free cache the trainer reuses in the same process;
4. each phase's working set at its peak moment (memory/moments.py: the update peaks at the logits,
   inside the last layer's backward, at the root's reduce-scatter or in the optimizer step; a
   forward-only pass inside a layer or at the logits) — transients of different moments never add;
5. overheads (CUDA context, cuBLAS workspace, NCCL communicators) and allocator fragmentation on the
   allocations that fragment (`FRAGMENTING_ITEMS`); on the cpu pseudo-device only the process RSS.

Split placement reports, per phase, the GPU that peaks: the rollout pool's GPU for rollout, a training
GPU for log-prob and update, and whichever side of the transfer is larger for weight sync.

The cpu pseudo-device: one process (`1xcpu`) uses parameters in place (no FSDP, fp32); N worker
processes on one machine (`Nxcpu`, gloo) shard like FSDP over N ranks, so gathered layers and
reduce-scatter buffers exist there too. Each worker's "device memory" is its share of the host RAM
(`device_memory_bytes`).
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.planner.config import Knobs, Target, Workload, old_logprob_pass_needed
from grpo_pilot.planner.lengths import Lengths, lengths_of, micro_batch_tokens, response_share
from grpo_pilot.planner.memory.activations import (
    attention_mask_bytes,
    boolean_mask_bytes,
    forward_activation_bytes,
    head_side_activation_bytes,
    layer_activation_bytes_per_token,
    layer_backward_temporary_bytes,
    recompute_activation_bytes,
    saved_activation_bytes,
)
from grpo_pilot.planner.memory.fsdp import (
    FSDP_PREFETCH_LAYERS,
    gathered_layers_bytes,
    head_grad_bytes,
    layer_reduce_scatter_bytes,
    root_gathered_bytes,
    root_grad_bytes,
)
from grpo_pilot.planner.memory.hf_generate import hf_generate_memory
from grpo_pilot.planner.memory.host import host_items
from grpo_pilot.planner.memory.kv_cache import concurrent_sequences, kv_bytes_per_token, kv_tokens
from grpo_pilot.planner.memory.layout import Layout, layout_for
from grpo_pilot.planner.memory.logits import logprob_logits_bytes
from grpo_pilot.planner.memory.model_states import actor_state_bytes, sharded_bytes
from grpo_pilot.planner.memory.moments import log_prob_peak_items, update_peak_items
from grpo_pilot.planner.memory.optimizer import adam_step_temporary_bytes
from grpo_pilot.planner.memory.precision import Precision, precision_for
from grpo_pilot.planner.memory.tokens import (
    budget_tokens_per_rank,
    fixed_tokens_per_rank,
    scored_tokens,
    sequences_per_sp_group,
)
from grpo_pilot.planner.memory.ulysses import all_to_all_buffer_bytes
from grpo_pilot.planner.memory.vllm_budget import VllmBudget, forward_bytes_per_token, vllm_budget
from grpo_pilot.planner.memory.weight_sync import largest_gathered_bytes, largest_param_elements
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads
from grpo_pilot.planner.reports import MemoryReport, PhaseMemory
from grpo_pilot.planner.traits import ExecutorTraits, traits_for
from grpo_pilot.profiles.spec import ModelSpec

# Items whose allocation sizes change from one micro-batch (or tensor) to the next: the only ones the
# caching allocator fragments. Blocks of a repeated size are reused exactly (the persistent states —
# sharded params, grads, Adam, reference — and the same-sized gathered layers, fixed buckets and the
# rollout engine's pool); token-count-dependent activations, logits and temporaries are not
# (PyTorch CUDA semantics, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF": fragmentation comes
# from allocation sizes that change between iterations, e.g. varying sequence lengths).
FRAGMENTING_ITEMS: frozenset[str] = frozenset(
    {
        "activations",
        "recompute_activations",
        "logits",
        "layer_backward_temporaries",
        "ulysses_all_to_all",
        "hf_kv_cache",
        "hf_prefill_activations",
        "hf_sampling_logits",
        "largest_gathered_tensor",
    }
)


def device_memory_bytes(cluster: Cluster) -> int:
    """Memory one device offers: the GPU's, or on the cpu pseudo-device the host RAM shared by its worker
    processes (`Nxcpu`: each worker gets RAM / N; `1xcpu`: the whole RAM)."""
    if cluster.gpu.is_cpu:
        return cluster.host_ram_bytes_per_node // max(1, cluster.gpus_per_node)
    return cluster.gpu.memory_bytes


class MemoryContext(NamedTuple):
    """Everything the phase estimators share, derived once per `estimate_memory` call."""

    model: ModelSpec
    workload: Workload
    knobs: Knobs
    traits: ExecutorTraits
    prec: Precision
    lay: Layout
    lengths: Lengths
    is_cpu: bool
    fsdp: bool  # parameters are sharded and gathered (false only for one process on cpu)
    has_ref: bool
    p_off: bool
    o_off: bool
    r_off: bool
    master: int
    grads: int
    adam: int
    ref: int
    trainer_oh: dict[str, int]
    rollout_oh: dict[str, int]
    frag: float
    budget: VllmBudget | None
    leftovers: dict[str, int]
    gathered: int
    root: int
    per_layer_tok: int
    t_upd: int  # tokens per rank of one update micro-batch
    t_lp: int  # tokens per rank of one log-prob micro-batch
    share: float  # response share of a micro-batch's positions
    device_bytes: int
    overheads: Overheads


def _budget(
    model: ModelSpec,
    device_bytes: int,
    is_cpu: bool,
    knobs: Knobs,
    rollout_bytes: int,
    ov: Overheads,
    preexisting_bytes: int = 0,
):
    return vllm_budget(
        device_bytes,
        knobs.gpu_memory_utilization,
        model.num_params,
        knobs.rollout_tp,
        model.hidden_size,
        model.q_dim,
        model.kv_dim,
        model.intermediate_size,
        model.vocab_size,
        rollout_bytes,
        knobs.max_num_batched_tokens,
        knobs.max_num_seqs,
        knobs.enforce_eager,
        is_cpu,
        ov.vllm_non_torch_base_bytes,
        ov.vllm_non_torch_per_extra_tp_rank_bytes,
        ov.vllm_sampler_bytes_per_vocab_entry,
        ov.vllm_cuda_graph_bytes_per_graph,
        ov.vllm_cuda_graph_modes,
        preexisting_bytes,
    )


def engine_start_resident_bytes(
    knobs: Knobs, master_bytes: int, param_offload: bool, trainer_overheads: dict[str, int], split: bool
) -> int:
    """Trainer memory on a colocated GPU when the vLLM engine profiles (counted against its budget when
    knobs.vllm_memory == 'device'): the actor's sharded parameters unless offloaded (verl fsdp_workers
    .init_model builds and, with param_offload, offloads the actor before _build_rollout; optimizer states
    are created lazily at the first step; the reference model is built after the rollout) and the
    process's CUDA context, cuBLAS workspace and NCCL buffers."""
    if knobs.vllm_memory != "device" or split:
        return 0
    return (0 if param_offload else master_bytes) + sum(trainer_overheads.values())


def _overheads(ov: Overheads, is_cpu: bool, fsdp: bool, sp: int, split: bool) -> tuple[dict[str, int], dict[str, int]]:
    """(trainer process overheads, rollout-only GPU overheads) per GPU."""
    if is_cpu:
        rss = {"overhead_process_rss": ov.cpu_process_rss_bytes}
        return rss, dict(rss)
    comms = (1 if fsdp else 0) + (1 if sp > 1 else 0) + (1 if split else 0)
    base = {"overhead_cuda_context": ov.cuda_context_bytes, "overhead_cublas_workspace": ov.cublas_workspace_bytes}
    trainer = {**base, "overhead_nccl": comms * ov.nccl_bytes_per_communicator}
    rollout = {**base, "overhead_nccl": ov.nccl_bytes_per_communicator if split else 0}  # the weight-sync group
    return trainer, rollout


def memory_context(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    target: Target = "grpo-pilot",
    overheads: Overheads = DEFAULT_OVERHEADS,
) -> MemoryContext:
    """Derive the shared quantities once (module docstring, step 1)."""
    ov = overheads
    is_cpu = cluster.gpu.is_cpu
    traits = traits_for(target)
    prec = precision_for(target, is_cpu)
    c = prec.compute_bytes
    lay = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    D, s = lay.trainer_gpus, knobs.ulysses_sp
    fsdp = (not is_cpu) or D > 1
    lengths = lengths_of(workload)
    device = device_memory_bytes(cluster)

    # offload is meaningless on the cpu pseudo-device: host RAM is the device
    p_off = knobs.param_offload and not is_cpu
    o_off = knobs.optimizer_offload and not is_cpu
    r_off = knobs.ref_param_offload and not is_cpu
    has_ref = workload.use_kl_loss
    master, grads, adam = actor_state_bytes(model.num_params, D, prec.master_bytes, prec.grad_bytes, prec.adam_bytes)
    ref = sharded_bytes(model.num_params, prec.ref_bytes, D) if has_ref else 0
    trainer_oh, rollout_oh = _overheads(ov, is_cpu, D > 1, s, lay.split)

    preexisting = engine_start_resident_bytes(knobs, master, p_off, trainer_oh, lay.split)
    budget = (
        _budget(model, device, is_cpu, knobs, prec.rollout_bytes, ov, preexisting)
        if knobs.rollout_backend == "vllm"
        else None
    )
    leftovers: dict[str, int] = {}
    if budget is not None and not lay.split:
        leftovers = {"vllm_non_torch": budget.non_torch_bytes, "vllm_cuda_graphs": budget.cuda_graph_bytes}
        if traits.keeps_rollout_engine:
            leftovers.update(vllm_weights=budget.weights_bytes, vllm_kv_cache=budget.kv_cache_bytes)

    # tokens per rank of one micro-batch, at the memory quantile of the lengths
    mini_seqs = sequences_per_sp_group(workload.mini_batch_prompts * workload.n, D, s)
    step_seqs = sequences_per_sp_group(workload.prompts_per_step * workload.n, D, s)
    scaled = traits.budget_scaled_by_sp

    population = step_seqs if traits.balances_batch else None

    def packed(budget_tokens: int, available_seqs: int) -> int:
        available = micro_batch_tokens(available_seqs, lengths, "remove", population=population)
        return budget_tokens_per_rank(budget_tokens, lengths.seq_max, available, s, scaled)

    def fixed(seqs: int, available_seqs: int) -> int:
        count = min(seqs, available_seqs)
        tokens = micro_batch_tokens(count, lengths, traits.padding, available_seqs, population=population)
        return fixed_tokens_per_rank(tokens, s)

    if knobs.max_token_len_per_gpu is not None:
        t_upd = packed(knobs.max_token_len_per_gpu, mini_seqs)
    else:
        t_upd = fixed(knobs.micro_batch_size_per_gpu or 1, mini_seqs)
    if knobs.log_prob_micro_batch_size_per_gpu is not None:
        t_lp = fixed(knobs.log_prob_micro_batch_size_per_gpu, step_seqs)
    else:
        t_lp = packed(knobs.log_prob_max_token_len_per_gpu, step_seqs)

    return MemoryContext(
        model=model,
        workload=workload,
        knobs=knobs,
        traits=traits,
        prec=prec,
        lay=lay,
        lengths=lengths,
        is_cpu=is_cpu,
        fsdp=fsdp,
        has_ref=has_ref,
        p_off=p_off,
        o_off=o_off,
        r_off=r_off,
        master=master,
        grads=grads,
        adam=adam,
        ref=ref,
        trainer_oh=trainer_oh,
        rollout_oh=rollout_oh,
        frag=ov.fragmentation_factor,
        budget=budget,
        leftovers=leftovers,
        gathered=gathered_layers_bytes(model.params_per_layer, c, not fsdp),
        root=root_gathered_bytes(model.embedding_params, model.lm_head_params, c, not fsdp),
        per_layer_tok=layer_activation_bytes_per_token(
            model.hidden_size,
            model.q_dim,
            model.kv_dim,
            model.intermediate_size,
            model.num_attention_heads,
            c,
            qk_norm=model.qk_norm,
            num_kv_heads=model.num_kv_heads,
        ),
        t_upd=t_upd,
        t_lp=t_lp,
        share=response_share(lengths),
        device_bytes=device,
        overheads=ov,
    )


def finish(ctx: MemoryContext, tensors: dict[str, int], engine: dict[str, int], overheads: dict[str, int]):
    """Merge tensor items, rollout-engine items and overheads; fragmentation on `FRAGMENTING_ITEMS`."""
    items = {**tensors, **engine, **overheads}
    if not ctx.is_cpu:
        varying = sum(v for k, v in tensors.items() if k in FRAGMENTING_ITEMS)
        items["overhead_fragmentation"] = int((ctx.frag - 1.0) * varying)
    return items


def resident(ctx: MemoryContext, phase: str, ref_pass: bool = False) -> dict[str, int]:
    """Trainer state on a training GPU during `phase` (module docstring, step 2)."""
    loads_back = not ctx.traits.offload_streams
    params_on = (not ctx.p_off) or (
        loads_back and (phase == "update" or (phase in ("log_prob", "rollout_hf") and not ref_pass))
    )
    adam_on = (not ctx.o_off) or (loads_back and phase == "update")
    grads_on = phase == "update" and ((not ctx.p_off) or loads_back)
    ref_on = ctx.has_ref and ((not ctx.r_off) or (loads_back and ref_pass))
    return {
        "actor_params": ctx.master if params_on else 0,
        "actor_grads": ctx.grads if grads_on else 0,
        "optimizer_states": ctx.adam if adam_on else 0,
        "ref_params": ctx.ref if ref_on else 0,
    }


def _row(ctx: MemoryContext) -> int:
    """Tokens per masked attention row (0 = no mask tensor): TRL pads rows of the longest sequence with a
    padding mask (`ExecutorTraits.masked_rows`); verl (flash-attention varlen) and our engine
    (right-padded rows under SDPA's `is_causal`, or one varlen-packed row — engine/actor.py) build none."""
    return ctx.lengths.seq_max if ctx.traits.masked_rows else 0


class RolloutMemory(NamedTuple):
    items: dict[str, int]
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_concurrent_seqs: int


def rollout_memory(ctx: MemoryContext) -> RolloutMemory:
    """Rollout: the vLLM budget beside what the trainer keeps resident, or HF generate on the policy."""
    m, k, w = ctx.model, ctx.knobs, ctx.workload
    seq_max = ctx.lengths.seq_max
    bud = ctx.budget
    if bud is not None:
        engine = {
            "vllm_weights": bud.weights_bytes,
            "vllm_activation_peak": bud.activation_bytes,
            "vllm_non_torch": bud.non_torch_bytes,
            "vllm_cuda_graphs": bud.cuda_graph_bytes,
            "vllm_kv_cache": bud.kv_cache_bytes,
        }
        per_token = kv_bytes_per_token(m.num_layers, m.num_kv_heads, m.head_dim, k.rollout_tp, ctx.prec.rollout_bytes)
        tokens = kv_tokens(bud.kv_cache_bytes, per_token)
        max_seqs = concurrent_sequences(tokens, seq_max, k.max_num_seqs)
        if ctx.lay.split:
            items = {**engine, **ctx.rollout_oh}
        else:
            items = finish(ctx, resident(ctx, "rollout"), engine, ctx.trainer_oh)
        return RolloutMemory(items, bud.kv_cache_bytes, tokens, max_seqs)
    c = ctx.prec.compute_bytes
    batch = min(k.max_num_seqs, sequences_per_sp_group(w.responses_per_step, ctx.lay.trainer_gpus, 1))
    gen = hf_generate_memory(  # the decode loop's buffers are allocated for the maximum lengths
        batch,
        w.prompt_len_tokens,
        w.response_len_tokens,
        kv_bytes_per_token(m.num_layers, m.num_kv_heads, m.head_dim, 1, c),
        forward_bytes_per_token(m.hidden_size, m.q_dim, m.kv_dim, m.intermediate_size, 1, c),
        m.vocab_size,
        c,
    )
    work = {
        "gathered_layers": ctx.gathered,
        "root_embed_lm_head": ctx.root,
        "hf_kv_cache": gen.kv_cache_bytes,
        "hf_prefill_activations": gen.prefill_bytes,
        "hf_sampling_logits": gen.sampling_bytes,
    }
    items = finish(ctx, {**resident(ctx, "rollout_hf"), **work}, {}, ctx.trainer_oh)
    return RolloutMemory(items, gen.kv_cache_bytes, gen.kv_cache_tokens, gen.batch_seqs)


def log_prob_memory(ctx: MemoryContext) -> dict[str, int]:
    """Log-prob passes (old policy, then reference): the larger pass is the phase peak."""
    m, k, c, t = ctx.model, ctx.knobs, ctx.prec.compute_bytes, ctx.t_lp
    row = _row(ctx)

    def one_pass(ref_pass: bool) -> dict[str, int]:
        entropy = "metric" if (ctx.traits.log_prob_entropy and not ref_pass) else "none"
        work = log_prob_peak_items(
            root_gathered=ctx.root,
            gathered_layers=ctx.gathered,
            layer_forward=forward_activation_bytes(
                t, m.hidden_size, m.intermediate_size, c, attention_mask_bytes(t, row, c), boolean_mask_bytes(t, row)
            ),
            head_side=2 * c * m.hidden_size * t,
            embedding_output=c * m.hidden_size * t,
            logits=logprob_logits_bytes(
                scored_tokens(t, ctx.share, ctx.traits.scores_all_positions),
                m.vocab_size,
                m.hidden_size,
                c,
                ctx.traits.name,
                training=False,
                fused=k.fused_logprob,
                entropy=entropy,
            ),
            all_to_all=all_to_all_buffer_bytes(t, m.q_dim, m.kv_dim, c, k.ulysses_sp),
        )
        return finish(ctx, {**resident(ctx, "log_prob", ref_pass), **work}, ctx.leftovers, ctx.trainer_oh)

    passes = ([one_pass(False)] if old_logprob_pass_needed(ctx.workload, ctx.traits.name) else []) + (
        [one_pass(True)] if ctx.has_ref else []
    )
    if passes:
        return max(passes, key=lambda items: sum(items.values()))
    # one on-policy update without KL: no pass runs, only what stays resident
    return finish(ctx, resident(ctx, "log_prob", False), ctx.leftovers, ctx.trainer_oh)


def update_memory(ctx: MemoryContext) -> dict[str, int]:
    """Update: the largest of the logits / layer-backward / root-reduce / optimizer moments."""
    m, k, w, c, t = ctx.model, ctx.knobs, ctx.workload, ctx.prec.compute_bytes, ctx.t_upd
    E, H = m.embedding_params, m.lm_head_params
    row = _row(ctx)
    mask, bool_mask = attention_mask_bytes(t, row, c), boolean_mask_bytes(t, row)
    if w.entropy_coeff > 0:
        entropy = "grad"
    else:
        entropy = "metric" if ctx.traits.update_entropy_metric else "none"
    root_grads, root_rs = root_grad_bytes(E, H, c, ctx.prec.grad_bytes, not ctx.fsdp)
    largest = largest_param_elements(m.vocab_size, m.hidden_size, m.intermediate_size, m.q_dim)
    work = update_peak_items(
        root_gathered=ctx.root,
        root_tied=m.tie_word_embeddings,
        gathered_layers=ctx.gathered,
        saved_activations=saved_activation_bytes(
            t, m.num_layers, ctx.per_layer_tok, mask, bool_mask, m.hidden_size, c, k.gradient_checkpointing
        ),
        head_side_activations=head_side_activation_bytes(t, m.hidden_size, c),
        prefetched_layer=ctx.gathered // FSDP_PREFETCH_LAYERS,
        recompute_activations=recompute_activation_bytes(t, ctx.per_layer_tok, mask, k.gradient_checkpointing),
        logits=logprob_logits_bytes(
            scored_tokens(t, ctx.share, ctx.traits.scores_all_positions),
            m.vocab_size,
            m.hidden_size,
            c,
            ctx.traits.name,
            training=True,
            fused=k.fused_logprob,
            entropy=entropy,
        ),
        layer_backward_temporaries=layer_backward_temporary_bytes(t, m.hidden_size, m.intermediate_size, c),
        head_grad=head_grad_bytes(E, H, c, not ctx.fsdp),
        root_grads=root_grads,
        root_reduce_scatter=root_rs,
        layer_reduce_scatter=layer_reduce_scatter_bytes(m.params_per_layer, ctx.prec.grad_bytes, not ctx.fsdp),
        all_to_all=all_to_all_buffer_bytes(t, m.q_dim, m.kv_dim, c, k.ulysses_sp),
        # the step runs on the host when the optimizer is offloaded and streamed (verl loads it back)
        optimizer_step=adam_step_temporary_bytes(
            -(-m.num_params // ctx.lay.trainer_gpus),
            largest,
            ctx.o_off and ctx.traits.offload_streams,
            ctx.is_cpu,
            fused=ctx.is_cpu and ctx.traits.fused_adamw_on_cpu,
        ),
    )
    return finish(ctx, {**resident(ctx, "update"), **work}, ctx.leftovers, ctx.trainer_oh)


def weight_sync_memory(ctx: MemoryContext) -> dict[str, int]:
    """Weight sync: both sides of the transfer bucket (nothing to transfer for HF rollout)."""
    bud, m = ctx.budget, ctx.model
    if bud is None:  # the policy generates itself
        return finish(ctx, resident(ctx, "weight_sync"), {}, ctx.trainer_oh)
    largest = largest_gathered_bytes(
        largest_param_elements(m.vocab_size, m.hidden_size, m.intermediate_size, m.q_dim),
        ctx.prec.master_bytes,
        ctx.prec.compute_bytes,
    )
    bucket = ctx.overheads.weight_sync_bucket_bytes
    transfer = {"weight_sync_bucket": bucket, "largest_gathered_tensor": largest}
    engine = {
        "vllm_weights": bud.weights_bytes,
        "vllm_non_torch": bud.non_torch_bytes,
        "vllm_cuda_graphs": bud.cuda_graph_bytes,
    }
    if ctx.traits.keeps_rollout_engine or ctx.lay.split:  # the engine never sleeps: its KV cache stays
        engine["vllm_kv_cache"] = bud.kv_cache_bytes
    if ctx.lay.split:
        send = finish(ctx, {**resident(ctx, "weight_sync"), **transfer}, {}, ctx.trainer_oh)
        recv = {**engine, "weight_sync_bucket": bucket, **ctx.rollout_oh}
        return send if sum(send.values()) >= sum(recv.values()) else recv
    return finish(ctx, {**resident(ctx, "weight_sync"), **transfer}, engine, ctx.trainer_oh)


def host_memory(ctx: MemoryContext, cluster: Cluster) -> dict[str, int]:
    """Host RAM per node: offloaded shards of the node's training ranks and one process per device."""
    ov = ctx.overheads
    return host_items(
        ctx.lay.trainer_gpus_per_node,
        cluster.gpus_per_node,
        ctx.master,
        ctx.grads,
        ctx.adam,
        ctx.ref,
        ctx.p_off,
        ctx.o_off,
        ctx.r_off and ctx.has_ref,
        ctx.traits.offload_streams,
        ov.cpu_process_rss_bytes if ctx.is_cpu else ov.host_rss_bytes_per_gpu_process,
    )


def estimate_memory(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    target: Target = "grpo-pilot",
    overheads: Overheads = DEFAULT_OVERHEADS,
) -> MemoryReport:
    """Per-GPU peak memory of rollout, log_prob, update and weight_sync, and host RAM per node.

    Pure and fast (plain integer arithmetic; pydantic only for the returned report). Items of every
    phase are non-negative integers that sum to the phase total; `overhead_*` items are not tensors.
    Lengths are taken at the memory quantile of the workload's length statistics (`lengths.py`); pass
    `workload.worst_case()` for every sequence at its maximum.
    """
    ctx = memory_context(model, cluster, workload, knobs, target, overheads)
    rollout = rollout_memory(ctx)
    return MemoryReport(
        phases={
            "rollout": PhaseMemory.of(rollout.items),
            "log_prob": PhaseMemory.of(log_prob_memory(ctx)),
            "update": PhaseMemory.of(update_memory(ctx)),
            "weight_sync": PhaseMemory.of(weight_sync_memory(ctx)),
        },
        host=PhaseMemory.of(host_memory(ctx, cluster)),
        kv_cache_bytes_per_gpu=rollout.kv_cache_bytes,
        kv_cache_tokens_per_gpu=rollout.kv_cache_tokens,
        max_concurrent_seqs=rollout.max_concurrent_seqs,
    )


def rollout_kv_budget_bytes(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    target: Target = "grpo-pilot",
    overheads: Overheads = DEFAULT_OVERHEADS,
) -> int:
    """Signed KV-cache bytes per GPU the vLLM budget leaves (negative = the engine cannot start).

    `MemoryReport.kv_cache_bytes_per_gpu` reports max(0, this); constraints use the sign and size to
    say how far off the budget is. With rollout_backend 'hf' there is no budget: the KV the
    generating batch needs is returned (always >= 0).
    """
    if knobs.rollout_backend == "hf":
        return estimate_memory(
            model, cluster, workload, knobs, target=target, overheads=overheads
        ).kv_cache_bytes_per_gpu
    budget = memory_context(model, cluster, workload, knobs, target, overheads).budget
    assert budget is not None  # rollout_backend 'vllm'
    return budget.kv_signed_bytes
