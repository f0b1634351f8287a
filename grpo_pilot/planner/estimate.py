"""The memory orchestrator: per-GPU peak bytes of every GRPO phase, itemised, plus host RAM per node.

`estimate_memory` builds one frozen `MemoryContext` (everything the phases share, derived once) and
then one function per phase reads it (reference/memory-model.md is the spec; each leaf in
`planner/memory/` cites its sources):

1. context (`memory/context.py`): the layout (FSDP degree D over the training GPUs, colocated or split
   rollout pool), the element sizes of the executor and device, the executor's and device's traits, the
   sharded states of one rank, the overheads, the rollout engine's budget and what it leaves behind
   outside rollout, and the tokens per rank of one update and one log-prob micro-batch at the memory
   quantile of the workload's lengths (`lengths.py`);
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
5. overheads (CUDA context, cuBLAS workspace, NCCL communicators) and what the caching allocator holds
   beyond the live tensors at each phase's peak, from its rules, the `allocator` setting and the
   `release_cache` policy (memory/allocator.py) with the executor's own releases (memory/releases.py: verl's
   workers under offload, Megatron after every method); on the cpu pseudo-device only the process RSS
   (`DeviceTraits.caching_allocator`).

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
from grpo_pilot.planner.memory.activations import (
    attention_mask_bytes,
    boolean_mask_bytes,
    forward_activation_bytes,
    head_side_activation_bytes,
    layer_backward_temporary_bytes,
    recompute_activation_bytes,
    saved_activation_bytes,
)
from grpo_pilot.planner.memory.allocator import with_reserve
from grpo_pilot.planner.memory.autocast import (
    head_weight_cast,
    tied_embedding_grad_bytes,
    tied_head_grad_pending_bytes,
    unsharded_head_grad_bytes,
)
from grpo_pilot.planner.memory.context import MemoryContext, memory_context
from grpo_pilot.planner.memory.family_parts import update_activations
from grpo_pilot.planner.memory.family_phases import (
    critic_phases,
    family_host_items,
    family_resident,
    lora_head_savings,
    lora_layer_grad_params,
    lora_logits_savings,
    lora_sync_items,
    lora_transients,
)
from grpo_pilot.planner.memory.fsdp import (
    FSDP_PREFETCH_LAYERS,
    head_grad_bytes,
    layer_reduce_scatter_bytes,
    root_grad_bytes,
)
from grpo_pilot.planner.memory.hf_rollout import (
    REPLICA_ITEM,
    decode_mode,
    hf_decode,
    replica_transfer,
    resident_replica,
    rollout_rows,
)
from grpo_pilot.planner.memory.host import HostOffloads, HostShards, host_items
from grpo_pilot.planner.memory.kv_cache import concurrent_sequences, kv_bytes_per_token_per_gpu, kv_tokens
from grpo_pilot.planner.memory.logits import logits_block_bytes, logprob_logits_bytes
from grpo_pilot.planner.memory.megatron_phases import megatron_engine_budget, megatron_memory
from grpo_pilot.planner.memory.moments import log_prob_peak_items, update_peak_items
from grpo_pilot.planner.memory.optimizer import adam_step_temporary_bytes
from grpo_pilot.planner.memory.releases import VERL, fsdp_actor_releases, fsdp_critic_releases, megatron_releases
from grpo_pilot.planner.memory.rollout_engines import SYNC_FIELDS, engine_items
from grpo_pilot.planner.memory.shared_prompts import shared_positions
from grpo_pilot.planner.memory.tokens import scored_tokens
from grpo_pilot.planner.memory.ulysses import all_to_all_buffer_bytes
from grpo_pilot.planner.memory.weight_sync import largest_gathered_bytes, largest_param_elements
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads
from grpo_pilot.planner.ref_offload import ref_offload_mode
from grpo_pilot.planner.reports import MemoryReport, PhaseMemory
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import FP32_BYTES


def finish(ctx: MemoryContext, tensors: dict[str, int], engine: dict[str, int], overheads: dict[str, int]):
    """Merge tensor items, rollout-engine items and overheads (the allocator's reserve is added across
    phases: `memory/allocator.py`, `estimate_memory`)."""
    return {**tensors, **engine, **overheads}


def largest_blocks(ctx: MemoryContext) -> dict[str, int]:
    """Each phase's largest repeated transient block (memory/allocator.py): the logits of one micro-batch
    in the log-prob passes and the update; the rollout, weight sync and critic phases allocate blocks of the
    same sizes at every repetition (buckets, gathered layers, the engine's pool), modelled as none."""
    k, kernel = ctx.knobs, ctx.executor.logits_kernel
    c = FP32_BYTES if _fp32_head(ctx) else ctx.precision.compute_bytes
    megatron = k.strategy == "megatron"  # vocab-parallel logits over TP, tokens split over CP
    vocab = -(-ctx.model.vocab_size // k.megatron_tp) if megatron else ctx.model.vocab_size

    def block(tokens: int, entropy: bool) -> int:
        scored = -(-_scored(ctx, tokens) // k.megatron_cp) if megatron else _scored(ctx, tokens)
        padded = _padded_response(ctx, tokens) if entropy and not megatron else None
        return logits_block_bytes(scored, vocab, c, kernel=kernel, fused=k.fused_logprob, padded_response_tokens=padded)

    return {
        "log_prob": block(ctx.log_prob_tokens, ctx.executor.log_prob_entropy),
        "update": block(ctx.update_tokens, _update_entropy(ctx) != "none"),
    }


def executor_releases(ctx: MemoryContext) -> frozenset[str]:
    """Phases after which the executor's workers empty the cache beside `Knobs.release_cache`
    (memory/allocator.py `also_released`): verl's, by backend and offload flags (memory/releases.py); our engine
    and TRL release only where the policy says."""
    k = ctx.knobs
    if ctx.executor.name != VERL:
        return frozenset()
    if k.strategy == "megatron":
        return megatron_releases(param_offload=ctx.param_offload, optimizer_offload=ctx.optimizer_offload)
    # the log-prob phase's last pass is a separate reference's unless there is none or it is the actor's (LoRA)
    actor = fsdp_actor_releases(param_offload=ctx.param_offload, reference_pass_last=ctx.has_ref and ctx.lora is None)
    return actor | fsdp_critic_releases(critic_param_offload=k.critic_param_offload, release_cache=k.release_cache)


def resident(ctx: MemoryContext, phase: str, ref_pass: bool = False) -> dict[str, int]:
    """Trainer state on a training GPU during `phase` (module docstring, step 2)."""
    loads_back = not ctx.executor.offload_streams
    params_on = (not ctx.param_offload) or (
        loads_back and (phase == "update" or (phase in ("log_prob", "rollout_hf") and not ref_pass))
    )
    adam_on = (not ctx.optimizer_offload) or (loads_back and phase == "update")
    grads_on = phase == "update" and ((not ctx.param_offload) or loads_back)
    # an offloaded reference comes back whole for its pass only when it is "loaded" (planner/ref_offload.py); a
    # streamed one (our engine, TRL, verl's FSDP reference since #121 whatever its key) gathers unit by unit
    ref_loads_back = ref_offload_mode(ctx.knobs, ctx.executor) == "loaded"
    ref_on = ctx.has_ref and ((not ctx.ref_offload) or (ref_loads_back and ref_pass))
    return {
        "actor_params": ctx.master_bytes if params_on else 0,
        "actor_grads": ctx.grad_bytes if grads_on else 0,
        "optimizer_states": ctx.adam_bytes if adam_on else 0,
        "ref_params": ctx.ref_bytes if ref_on else 0,
        **family_resident(ctx, phase, params_on or (ctx.lora is not None and ref_pass and loads_back)),
        **resident_replica(ctx),  # our engine's colocated hf replica, never freed (memory/hf_rollout.py)
        # TRL under DDP: the reducer's flat gradient buckets, allocated at the wrap and kept (memory/zero.py)
        **({"ddp_grad_buckets": ctx.ddp_bucket_bytes} if ctx.ddp_bucket_bytes else {}),
    }


def _row(ctx: MemoryContext) -> int:
    """Tokens per masked attention row (0 = no mask tensor): TRL pads rows of the longest sequence with a
    padding mask (`ExecutorTraits.masked_rows`); verl (flash-attention varlen) and our engine
    (right-padded rows under SDPA's `is_causal`, or one varlen-packed row — engine/actor.py) build none."""
    return ctx.lengths.seq_max if ctx.executor.masked_rows else 0


class RolloutMemory(NamedTuple):
    items: dict[str, int]
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_concurrent_seqs: int


def rollout_memory(ctx: MemoryContext) -> RolloutMemory:
    """Rollout: the vLLM budget beside what the trainer keeps resident, or HF generate on the policy or on our
    engine's replica (memory/hf_rollout.py)."""
    m, k = ctx.model, ctx.knobs
    bud = ctx.vllm
    if bud is not None:
        engine = engine_items(k.rollout_backend, bud)
        per_token = kv_bytes_per_token_per_gpu(m, k.rollout_tp, ctx.precision.rollout_bytes)
        tokens = kv_tokens(bud.kv_cache_bytes, per_token)
        max_seqs = concurrent_sequences(tokens, ctx.lengths.seq_max, k.max_num_seqs)
        if ctx.layout.split:
            items = {**engine, **ctx.rollout_overheads}
        else:
            items = finish(ctx, resident(ctx, "rollout"), engine, ctx.trainer_overheads)
        return RolloutMemory(items, bud.kv_cache_bytes, tokens, max_seqs)
    dec = hf_decode(ctx, rollout_rows(ctx))
    pool = {"overhead_hf_cuda_graph_pool": dec.graph_pool_bytes} if dec.graph_pool_bytes else {}
    if ctx.hf_replica_bytes:  # our engine's replica: unsharded, nothing gathered (memory/hf_rollout.py)
        if ctx.layout.split:  # the rollout GPU holds the replica only
            items = {REPLICA_ITEM: ctx.hf_replica_bytes, **dec.generate.items, **pool, **ctx.rollout_overheads}
        else:
            items = finish(ctx, {**resident(ctx, "rollout"), **dec.generate.items}, pool, ctx.trainer_overheads)
        return RolloutMemory(items, dec.generate.kv_cache_bytes, dec.generate.kv_cache_tokens, dec.generate.batch_seqs)
    c = ctx.precision.compute_bytes
    whole = ctx.sharded and k.hf_generation_weights == "model"
    work = {
        # ZeRO-3's GatheredParameters around generate: every parameter in full, beside the shards
        "generation_gathered_model": c * m.num_params if whole else 0,
        "gathered_layers": 0 if whole else ctx.gathered_layers_bytes,
        "root_embed_lm_head": 0 if whole else ctx.root_gathered_bytes,
        **dec.generate.items,
        **lora_transients(ctx),
    }
    items = finish(ctx, {**resident(ctx, "rollout_hf"), **work}, pool, ctx.trainer_overheads)
    return RolloutMemory(items, dec.generate.kv_cache_bytes, dec.generate.kv_cache_tokens, dec.generate.batch_seqs)


def _scored(ctx: MemoryContext, tokens: int) -> int:
    """Positions whose logits are computed in a micro-batch of `tokens` positions."""
    return scored_tokens(tokens, ctx.response_share, ctx.executor.scores_all_positions)


def _padded_response(ctx: MemoryContext, tokens: int) -> int | None:
    """verl's padded path (`Knobs.remove_padding` False, memory/logits.py): the response positions of a
    micro-batch of `tokens` padded positions, which its log-probs and entropy slice out; None otherwise."""
    if ctx.knobs.remove_padding or ctx.executor.logits_kernel != "verl":
        return None
    return scored_tokens(tokens, ctx.response_share, scores_all_positions=False)


def _update_entropy(ctx: MemoryContext) -> str:
    """The update's entropy: with a gradient for an entropy bonus (or in every update: verl before #1100,
    `Knobs.entropy_every_pass`), else as a metric where the executor computes one anyway (memory/logits.py
    ENTROPY_MODES)."""
    if ctx.workload.entropy_coeff > 0 or ctx.knobs.entropy_every_pass:
        return "grad"
    return "metric" if ctx.executor.update_entropy_metric else "none"


def _fp32_head(ctx: MemoryContext) -> bool:
    """Our fused kernel under autocast: the LM head runs on the fp32 weight and hidden states (no cast)."""
    return ctx.autocast and ctx.knobs.fused_logprob and ctx.executor.logits_kernel == "ours"


def _logits_bytes(ctx: MemoryContext, tokens: int, *, training: bool, entropy: str) -> int:
    """The log-prob computation's peak for `tokens` positions per rank (the executor's kernel)."""
    m = ctx.model
    full = logprob_logits_bytes(
        _scored(ctx, tokens),
        m.vocab_size,
        m.hidden_size,
        FP32_BYTES if _fp32_head(ctx) else ctx.precision.compute_bytes,
        kernel=ctx.executor.logits_kernel,
        training=training,
        fused=ctx.knobs.fused_logprob,
        entropy=entropy,
        padded_response_tokens=_padded_response(ctx, tokens),
    )
    return max(0, full - lora_logits_savings(ctx, training=training))


def log_prob_memory(ctx: MemoryContext) -> dict[str, int]:
    """Log-prob passes (old policy, then reference): the larger pass is the phase peak."""
    m, c, t = ctx.model, ctx.precision.compute_bytes, ctx.log_prob_tokens
    row, hb = _row(ctx), FP32_BYTES if ctx.autocast else c  # hb: the residual stream's bytes per element
    tl, mask, bool_mask = shared_positions(
        t, ctx.layouts[1], attention_mask_bytes(t, row, c), boolean_mask_bytes(t, row), forward_only=True
    )

    def one_pass(ref_pass: bool) -> dict[str, int]:
        every = ctx.knobs.entropy_every_pass  # verl before #1100: the reference pass computes it too
        entropy = "metric" if (ctx.executor.log_prob_entropy and (every or not ref_pass)) else "none"
        casts = ctx.ref_cast_bytes if ref_pass else ctx.policy_cast_bytes
        work = log_prob_peak_items(
            root_gathered=ctx.root_gathered_bytes,
            gathered_layers=ctx.gathered_layers_bytes,
            layer_forward=forward_activation_bytes(
                tokens=tl,
                hidden=m.hidden_size,
                intermediate=m.intermediate_size,
                compute_bytes=c,
                mask_per_layer=mask,
                bool_mask=bool_mask,
                hidden_bytes=hb,
            ),
            # the logits moment: the final hidden states (autocast: the fp32 normed ones at the scored positions)
            head_side=FP32_BYTES * m.hidden_size * _scored(ctx, t) if ctx.autocast else 2 * c * m.hidden_size * t,
            embedding_output=hb * m.hidden_size * tl,
            logits=_logits_bytes(ctx, t, training=False, entropy=entropy),
            all_to_all=all_to_all_buffer_bytes(
                tokens_per_rank=t, q_dim=m.q_dim, kv_dim=m.kv_dim, compute_bytes=c, ulysses_sp=ctx.knobs.ulysses_sp
            ),
            weight_casts=casts,
            head_weight_cast=head_weight_cast(m, c) if casts and not _fp32_head(ctx) else 0,
        )
        work.update(lora_transients(ctx))
        return finish(
            ctx, {**resident(ctx, "log_prob", ref_pass), **work}, ctx.rollout_leftovers, ctx.trainer_overheads
        )

    passes = ([one_pass(False)] if old_logprob_pass_needed(ctx.workload, ctx.executor) else []) + (
        [one_pass(True)] if ctx.has_ref else []
    )
    if passes:
        return max(passes, key=lambda items: sum(items.values()))
    # one on-policy update without KL: no pass runs, only what stays resident
    return finish(ctx, resident(ctx, "log_prob", False), ctx.rollout_leftovers, ctx.trainer_overheads)


class _UpdateActivations(NamedTuple):
    tokens: int  # the layers' positions (shared-prompt layout)
    mask: int
    bool_mask: int
    head_side: int
    saved: int
    recompute: int


def _update_activations(ctx: MemoryContext) -> _UpdateActivations:
    """The update's saved and recomputed activations: the layers' (shared-prompt layout, checkpointing), the
    head side (minus what a frozen LoRA head keeps no input for), and what activation offload leaves on the GPU."""
    m, k, c, t = ctx.model, ctx.knobs, ctx.precision.compute_bytes, ctx.update_tokens
    row = _row(ctx)
    per_tok, lay, scored = ctx.layer_activation_bytes_per_token, ctx.layouts[0], _scored(ctx, t)
    tl, mask, bool_mask = shared_positions(t, lay, attention_mask_bytes(t, row, c), boolean_mask_bytes(t, row))
    head_side = head_side_activation_bytes(
        t,
        m.hidden_size,
        c,
        scored=scored,
        normed=scored if lay else t,
        autocast=ctx.autocast,
        head_input_bytes=FP32_BYTES if _fp32_head(ctx) else c,
    )
    head_side -= min(head_side, lora_head_savings(ctx, t))
    saved = saved_activation_bytes(
        tokens=tl,
        num_layers=m.num_layers,
        per_layer_per_token=per_tok,
        mask_per_layer=mask,
        bool_mask=bool_mask,
        hidden=m.hidden_size,
        compute_bytes=c,
        checkpointing=k.gradient_checkpointing,
        head_side=head_side,
        layer_input_bytes=FP32_BYTES if ctx.autocast else c,
    )
    recompute = recompute_activation_bytes(tl, per_tok, mask, k.gradient_checkpointing)
    saved, recompute = update_activations(ctx.activation_offload, saved, recompute, head_side)
    return _UpdateActivations(tl, mask, bool_mask, head_side, saved, recompute)


def update_memory(ctx: MemoryContext) -> dict[str, int]:
    """Update: the largest of the logits / layer-backward / root-reduce / optimizer moments. Under LoRA the
    embeddings and LM head are frozen: no root gradients, a layer's reduce-scatter carries its adapters."""
    m, k, c, t = ctx.model, ctx.knobs, ctx.precision.compute_bytes, ctx.update_tokens
    E, H = m.embedding_params, m.lm_head_params
    unsharded, frozen = not ctx.sharded, ctx.lora is not None
    entropy = _update_entropy(ctx)
    root_grads, root_rs = root_grad_bytes(
        E, H, compute_bytes=c, reduce_bytes=ctx.precision.grad_bytes, unsharded=unsharded or frozen
    )
    acts = _update_activations(ctx)
    work = update_peak_items(
        root_gathered=ctx.root_gathered_bytes,
        root_tied=m.tie_word_embeddings,
        gathered_layers=ctx.gathered_layers_bytes,
        saved_activations=acts.saved,
        head_side_activations=acts.head_side,
        prefetched_layer=ctx.gathered_layers_bytes // FSDP_PREFETCH_LAYERS,
        recompute_activations=acts.recompute,
        logits=_logits_bytes(ctx, t, training=True, entropy=entropy),
        layer_backward_temporaries=layer_backward_temporary_bytes(
            acts.tokens, m.hidden_size, m.intermediate_size, c, autocast=ctx.autocast
        ),
        head_grad=head_grad_bytes(E, H, c, unsharded=unsharded or frozen),
        root_grads=root_grads,
        root_reduce_scatter=root_rs,
        # ZeRO-1/2: the IPG bucket the backward's gradients are copied into (memory/zero.py)
        layer_reduce_scatter=layer_reduce_scatter_bytes(
            lora_layer_grad_params(ctx), ctx.precision.grad_bytes, unsharded=unsharded
        )
        + ctx.backward_buffer_bytes,
        all_to_all=all_to_all_buffer_bytes(
            tokens_per_rank=t, q_dim=m.q_dim, kv_dim=m.kv_dim, compute_bytes=c, ulysses_sp=k.ulysses_sp
        ),
        optimizer_step=_optimizer_step_bytes(ctx) + ctx.step_grad_bytes,  # ZeRO's fp32 gradient partition
        weight_casts=ctx.policy_cast_bytes,
        head_weight_cast=head_weight_cast(m, c) if ctx.policy_cast_bytes and not _fp32_head(ctx) else 0,
        head_grad_in_flight=0
        if ctx.sharded or k.fused_logprob or frozen
        else unsharded_head_grad_bytes(m, c, cast=ctx.policy_cast_bytes > 0),
        head_grad_pending=0 if frozen else tied_head_grad_pending_bytes(m, sharded=ctx.sharded),
        embedding_grad=0 if frozen else tied_embedding_grad_bytes(m, sharded=ctx.sharded),
    )
    work.update(lora_transients(ctx))
    return finish(ctx, {**resident(ctx, "update"), **work}, ctx.rollout_leftovers, ctx.trainer_overheads)


def _optimizer_step_bytes(ctx: MemoryContext) -> int:
    """AdamW temporaries on the device: none when the offloaded optimizer steps on the host (streaming
    executors; verl loads it back); the single-tensor loop on cpu; fused where the executor fuses."""
    m = ctx.model
    host_executes = ctx.device.host_executes_ops
    trainable = ctx.lora.adapter_params if ctx.lora is not None else m.num_params
    largest = largest_param_elements(m.vocab_size, m.hidden_size, m.intermediate_size, m.q_dim)
    return adam_step_temporary_bytes(
        -(-trainable // ctx.shard_degree),
        min(largest, trainable),
        on_host=ctx.optimizer_offload and ctx.executor.offload_streams,
        single_tensor=host_executes,
        fused=host_executes and ctx.executor.fused_adamw_on_cpu,
    )


def weight_sync_memory(ctx: MemoryContext) -> dict[str, int]:
    """Weight sync: both sides of the transfer bucket (HF rollout: nothing to transfer on the policy itself; the
    gathered bucket into our engine's replica, memory/hf_rollout.py)."""
    bud, m = ctx.vllm, ctx.model
    if bud is None:  # hf: the static loop's weight copy is built here (HFRollout.wake), or a replica loaded
        copy = hf_decode(ctx, 1).weight_copy_bytes
        work = {"hf_decode_weight_copy": copy} if decode_mode(ctx) != "eager" else {}
        send = finish(ctx, {**resident(ctx, "weight_sync"), **work, **replica_transfer(ctx)}, {}, ctx.trainer_overheads)
        if ctx.hf_replica_bytes and ctx.layout.split:  # memory/hf_rollout.py: the rollout GPU receives from the host
            recv = {REPLICA_ITEM: ctx.hf_replica_bytes, **ctx.rollout_overheads}
            return send if sum(send.values()) >= sum(recv.values()) else recv
        return send
    largest = largest_gathered_bytes(
        largest_param_elements(m.vocab_size, m.hidden_size, m.intermediate_size, m.q_dim),
        ctx.precision.master_bytes,
        ctx.precision.compute_bytes,
    )
    bucket = ctx.overheads.weight_sync_bucket_bytes
    transfer = lora_sync_items(ctx) or {"weight_sync_bucket": bucket, "largest_gathered_tensor": largest}
    kept = SYNC_FIELDS[ctx.knobs.rollout_backend]
    if ctx.executor.keeps_rollout_engine or ctx.layout.split:  # the engine never sleeps: its KV cache stays
        kept += ("kv_cache_bytes",)
    engine = engine_items(ctx.knobs.rollout_backend, bud, include=kept)
    if ctx.layout.split:
        send = finish(ctx, {**resident(ctx, "weight_sync"), **transfer}, {}, ctx.trainer_overheads)
        recv = {**engine, "weight_sync_bucket": bucket, **ctx.rollout_overheads}
        return send if sum(send.values()) >= sum(recv.values()) else recv
    return finish(ctx, {**resident(ctx, "weight_sync"), **transfer}, engine, ctx.trainer_overheads)


def host_memory(ctx: MemoryContext, cluster: Cluster) -> dict[str, int]:
    """Host RAM per node: offloaded shards of the node's training ranks and one process per device."""
    ov = ctx.overheads
    items = host_items(
        trainer_ranks_on_node=ctx.layout.trainer_gpus_per_node,
        processes_on_node=cluster.gpus_per_node,
        shards=HostShards(ctx.master_bytes, ctx.grad_bytes, ctx.adam_bytes, ctx.ref_bytes),
        offloads=HostOffloads(
            params=ctx.param_offload,
            optimizer=ctx.optimizer_offload,
            ref=ctx.ref_offload and ctx.has_ref,
            grads_follow_params=ctx.executor.offload_streams,
        ),
        rss_bytes_per_process=(
            ov.host_rss_bytes_per_gpu_process if ctx.device.caching_allocator else ov.cpu_process_rss_bytes
        ),
    )
    # DeepSpeed ZeRO-1/2 offload_optimizer: each rank's fp32 master, fp32 gradient and bf16 partitions (memory/zero.py)
    zero = {"zero_offloaded_partitions": ctx.layout.trainer_gpus_per_node * ctx.zero_host_bytes}
    return {**items, **(zero if ctx.zero_host_bytes else {}), **family_host_items(ctx)}


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
    ctx = memory_context(model, cluster, workload, knobs, executor=traits_for(target), overheads=overheads)
    if knobs.strategy == "megatron":  # verl's Megatron workers: per-stage states and pipelines
        mega = megatron_memory(ctx, cluster, finish=finish)
        phases, host = mega.phases, mega.host
        kv = RolloutMemory({}, mega.kv_cache_bytes, mega.kv_cache_tokens, mega.max_concurrent_seqs)
    else:
        kv = rollout_memory(ctx)
        phases = {
            "rollout": kv.items,
            "log_prob": log_prob_memory(ctx),
            **critic_phases(ctx, finish, resident),
            "update": update_memory(ctx),
            "weight_sync": weight_sync_memory(ctx),
        }
        host = host_memory(ctx, cluster)
    if ctx.device.caching_allocator:
        k = ctx.knobs
        phases = with_reserve(
            phases,
            allocator=k.allocator,
            release_cache=k.release_cache,
            largest_blocks=largest_blocks(ctx),
            also_released=executor_releases(ctx),
        )
    return MemoryReport.model_construct(  # the search's inner loop: computed values, no validation pass
        phases={phase: PhaseMemory.of(items) for phase, items in phases.items()},
        host=PhaseMemory.of(host),
        kv_cache_bytes_per_gpu=kv.kv_cache_bytes,
        kv_cache_tokens_per_gpu=kv.kv_cache_tokens,
        max_concurrent_seqs=kv.max_concurrent_seqs,
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
    ctx = memory_context(model, cluster, workload, knobs, executor=traits_for(target), overheads=overheads)
    budget = megatron_engine_budget(ctx) if knobs.strategy == "megatron" else ctx.vllm
    assert budget is not None  # rollout_backend 'vllm' or 'sglang'
    return budget.kv_signed_bytes
