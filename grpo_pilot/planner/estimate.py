"""The memory orchestrator: per-GPU peak bytes of every GRPO phase, itemised, plus host RAM per node.

`estimate_memory` combines the leaves of `planner/memory/` in this order (reference/memory-model.md
is the spec; each leaf cites its sources):

1. resolve the layout (FSDP degree D over the training GPUs, colocated or split rollout pool),
   the element sizes of the executor (`target`) and device, and the tokens per rank of one update and
   one log-prob micro-batch;
2. decide, per phase, what of the trainer's state is resident on the GPU: sharded fp32 master params,
   grads (update only — every target frees them after the optimizer step: verl's update_policy ends
   with `zero_grad()`, TRL/HF Trainer and our engine zero with set_to_none), Adam states and the
   reference shard. Offload semantics differ by target:
     grpo-pilot, trl — FSDP2 CPUOffloadPolicy / ZeRO-3 offload: an offloaded shard never returns to
       the GPU; layers are gathered from host memory and the optimizer steps on the host.
     verl — load-use-offload around each call (fsdp_workers): actor params come back for the old
       log-prob pass and the update, Adam states for the update, the reference for its pass.
3. decide what the rollout engine leaves behind outside rollout: verl frees weights and KV cache
   (free_cache_engine, sleep level 2) and our engine does the same; CUDA graphs and non-torch
   buffers stay. TRL colocate keeps everything (vllm_enable_sleep_mode defaults to False), except
   the profile-run activation peak, which is free cache the trainer reuses in the same process;
4. add each phase's working set at its peak moment (memory/moments.py: the update peaks at the
   logits, inside the last layer's backward, at the root's reduce-scatter or in the optimizer step;
   a forward-only pass inside a layer or at the logits) — transients of different moments never add;
5. add overheads (CUDA context, cuBLAS workspace, NCCL communicators, allocator fragmentation on the
   trainer's tensors; on the cpu pseudo-device only the process baseline RSS).

Split placement reports, per phase, the GPU that peaks: the rollout pool's GPU for rollout, a training
GPU for log-prob and update, and whichever side of the transfer is larger for weight sync.
"""

from __future__ import annotations

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.planner.config import Knobs, Target, Workload, old_logprob_pass_needed
from grpo_pilot.planner.memory.activations import (
    attention_mask_bytes,
    boolean_mask_bytes,
    forward_activation_bytes,
    layer_activation_bytes_per_token,
    layer_backward_temporary_bytes,
    recompute_activation_bytes,
    saved_activation_bytes,
)
from grpo_pilot.planner.memory.fsdp import (
    gathered_layers_bytes,
    head_grad_bytes,
    layer_reduce_scatter_bytes,
    root_gathered_bytes,
    root_grad_bytes,
)
from grpo_pilot.planner.memory.hf_generate import hf_generate_memory
from grpo_pilot.planner.memory.host import host_items
from grpo_pilot.planner.memory.kv_cache import concurrent_sequences, kv_bytes_per_token, kv_tokens
from grpo_pilot.planner.memory.layout import layout_for
from grpo_pilot.planner.memory.logits import logprob_logits_bytes
from grpo_pilot.planner.memory.moments import log_prob_peak_items, update_peak_items
from grpo_pilot.planner.memory.model_states import actor_state_bytes, sharded_bytes
from grpo_pilot.planner.memory.optimizer import adam_step_temporary_bytes
from grpo_pilot.planner.memory.precision import precision_for
from grpo_pilot.planner.memory.tokens import (
    packed_tokens_per_rank,
    padded_tokens_per_rank,
    scored_tokens,
    sequences_per_sp_group,
)
from grpo_pilot.planner.memory.ulysses import all_to_all_buffer_bytes
from grpo_pilot.planner.memory.vllm_budget import VllmBudget, forward_bytes_per_token, vllm_budget
from grpo_pilot.planner.memory.weight_sync import largest_gathered_bytes, largest_param_elements
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads
from grpo_pilot.planner.reports import MemoryReport, PhaseMemory
from grpo_pilot.profiles.spec import ModelSpec


def _budget(model: ModelSpec, cluster: Cluster, knobs: Knobs, rollout_bytes: int, ov: Overheads) -> VllmBudget:
    return vllm_budget(
        cluster.gpu.memory_bytes,
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
        cluster.gpu.is_cpu,
        ov.vllm_non_torch_base_bytes,
        ov.vllm_non_torch_per_extra_tp_rank_bytes,
        ov.vllm_sampler_bytes_per_vocab_entry,
        ov.vllm_cuda_graph_bytes_per_graph,
        ov.vllm_cuda_graph_modes,
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
    prec = precision_for(target, cluster.gpu.is_cpu)
    return _budget(model, cluster, knobs, prec.rollout_bytes, overheads).kv_signed_bytes


def _finish(
    tensors: dict[str, int], vllm: dict[str, int], base_overheads: dict[str, int], frag_factor: float, is_cpu: bool
) -> dict[str, int]:
    """Merge tensor items, rollout-engine items and overheads; fragmentation on the trainer's tensors."""
    items = {**tensors, **vllm, **base_overheads}
    if not is_cpu:
        items["overhead_fragmentation"] = int((frag_factor - 1.0) * sum(tensors.values()))
    return items


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
    """
    ov = overheads
    is_cpu = cluster.gpu.is_cpu
    prec = precision_for(target, is_cpu)
    c = prec.compute_bytes
    lay = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    D, s = lay.trainer_gpus, knobs.ulysses_sp
    verl = target == "verl"

    # ---- model numbers, read once -------------------------------------------------------------
    P, P_layer = model.num_params, model.params_per_layer
    h, q, kvd, inter, a, L, V = (
        model.hidden_size,
        model.q_dim,
        model.kv_dim,
        model.intermediate_size,
        model.num_attention_heads,
        model.num_layers,
        model.vocab_size,
    )
    resp = workload.response_len_tokens
    seq = workload.prompt_len_tokens + resp
    has_ref = workload.use_kl_loss
    vllm_backend = knobs.rollout_backend == "vllm"

    # ---- offload flags (meaningless on the cpu pseudo-device: host RAM is the device) ------------
    p_off = knobs.param_offload and not is_cpu
    o_off = knobs.optimizer_offload and not is_cpu
    r_off = knobs.ref_param_offload and not is_cpu

    # ---- sharded states of one training rank ------------------------------------------------------
    master, grads, adam = actor_state_bytes(P, D, prec.master_bytes, prec.grad_bytes, prec.adam_bytes)
    ref = sharded_bytes(P, prec.ref_bytes, D) if has_ref else 0

    def resident(phase: str, ref_pass: bool = False) -> dict[str, int]:
        """Trainer state on a training GPU during `phase` (see module docstring, step 2)."""
        params_on = (not p_off) or (
            verl and (phase == "update" or (phase in ("log_prob", "rollout_hf") and not ref_pass))
        )
        adam_on = (not o_off) or (verl and phase == "update")
        grads_on = phase == "update" and ((not p_off) or verl)
        ref_on = has_ref and ((not r_off) or (verl and ref_pass))
        return {
            "actor_params": master if params_on else 0,
            "actor_grads": grads if grads_on else 0,
            "optimizer_states": adam if adam_on else 0,
            "ref_params": ref if ref_on else 0,
        }

    # ---- overheads ----------------------------------------------------------------------------
    if is_cpu:
        trainer_oh = {"overhead_process_rss": ov.cpu_process_rss_bytes}
        rollout_oh = dict(trainer_oh)
    else:
        comms = (1 if D > 1 else 0) + (1 if s > 1 else 0) + (1 if lay.split else 0)
        base = {"overhead_cuda_context": ov.cuda_context_bytes, "overhead_cublas_workspace": ov.cublas_workspace_bytes}
        trainer_oh = {**base, "overhead_nccl": comms * ov.nccl_bytes_per_communicator}
        rollout_oh = {
            **base,
            "overhead_nccl": ov.nccl_bytes_per_communicator if lay.split else 0,
        }  # the weight-sync group
    frag = ov.fragmentation_factor

    # ---- rollout engine ---------------------------------------------------------------------------
    bud = _budget(model, cluster, knobs, prec.rollout_bytes, ov) if vllm_backend else None
    vllm_all: dict[str, int] = {}
    leftovers: dict[str, int] = {}
    if bud is not None:
        vllm_all = {
            "vllm_weights": bud.weights_bytes,
            "vllm_activation_peak": bud.activation_bytes,
            "vllm_non_torch": bud.non_torch_bytes,
            "vllm_cuda_graphs": bud.cuda_graph_bytes,
            "vllm_kv_cache": bud.kv_cache_bytes,
        }
        if not lay.split:
            leftovers = {"vllm_non_torch": bud.non_torch_bytes, "vllm_cuda_graphs": bud.cuda_graph_bytes}
            if target == "trl":
                leftovers.update(vllm_weights=bud.weights_bytes, vllm_kv_cache=bud.kv_cache_bytes)

    # ---- FSDP working set and tokens ------------------------------------------------------------
    E, H = model.embedding_params, model.lm_head_params
    gathered = gathered_layers_bytes(P_layer, c, is_cpu)
    root = root_gathered_bytes(E, H, c, is_cpu)
    per_layer_tok = layer_activation_bytes_per_token(
        h, q, kvd, inter, a, c, qk_norm=model.qk_norm, num_kv_heads=model.num_kv_heads
    )
    mini_seqs = sequences_per_sp_group(workload.mini_batch_prompts * workload.n, D, s)
    step_seqs = sequences_per_sp_group(workload.prompts_per_step * workload.n, D, s)
    if knobs.max_token_len_per_gpu is not None:
        t_upd = packed_tokens_per_rank(knobs.max_token_len_per_gpu, seq, mini_seqs, s, verl)
    else:
        t_upd = padded_tokens_per_rank(knobs.micro_batch_size_per_gpu or 1, seq, mini_seqs, s)
    t_lp = packed_tokens_per_rank(knobs.log_prob_max_token_len_per_gpu, seq, step_seqs, s, verl)

    def row(tokens: int) -> int:
        """Tokens per masked attention row (0 = no mask tensor): TRL pads rows of `seq` tokens with a
        padding mask; verl (flash-attention varlen) and our engine (right-padded rows under SDPA's
        `is_causal`, or one varlen-packed row with flash-attention — engine/actor.py) build none."""
        return seq if target == "trl" else 0

    def mask(tokens: int) -> int:
        return attention_mask_bytes(tokens, row(tokens), c)

    def bool_mask(tokens: int) -> int:
        return boolean_mask_bytes(tokens, row(tokens))

    # ---- rollout ---------------------------------------------------------------------------------
    if bud is not None:
        kv_bytes = bud.kv_cache_bytes
        kv_tok = kv_tokens(
            kv_bytes, kv_bytes_per_token(L, model.num_kv_heads, model.head_dim, knobs.rollout_tp, prec.rollout_bytes)
        )
        max_seqs = concurrent_sequences(kv_tok, seq, knobs.max_num_seqs)
        if lay.split:
            rollout_items = {**vllm_all, **rollout_oh}
        else:
            rollout_items = _finish(resident("rollout"), vllm_all, trainer_oh, frag, is_cpu)
    else:
        batch = min(
            knobs.max_num_seqs, sequences_per_sp_group(workload.prompts_per_step * workload.n, D, 1)
        )  # this rank's responses
        gen = hf_generate_memory(
            batch,
            workload.prompt_len_tokens,
            workload.response_len_tokens,
            kv_bytes_per_token(L, model.num_kv_heads, model.head_dim, 1, c),
            forward_bytes_per_token(h, q, kvd, inter, 1, c),
            V,
            c,
        )
        kv_bytes, kv_tok, max_seqs = gen.kv_cache_bytes, gen.kv_cache_tokens, gen.batch_seqs
        work = {
            "gathered_layers": gathered,
            "root_embed_lm_head": root,
            "hf_kv_cache": gen.kv_cache_bytes,
            "hf_prefill_activations": gen.prefill_bytes,
            "hf_sampling_logits": gen.sampling_bytes,
        }
        rollout_items = _finish({**resident("rollout_hf"), **work}, {}, trainer_oh, frag, is_cpu)

    # ---- log-prob passes (old policy, then reference); the larger one is the phase peak ---------
    lp_scored = scored_tokens(t_lp, resp, seq, target)

    def lp_pass(ref_pass: bool) -> dict[str, int]:
        entropy = "metric" if (verl and not ref_pass) else "none"  # verl: compute_log_prob(calculate_entropy=True)
        work = log_prob_peak_items(
            root_gathered=root,
            gathered_layers=gathered,
            layer_forward=forward_activation_bytes(t_lp, h, inter, c, mask(t_lp), bool_mask(t_lp)),
            head_side=2 * c * h * t_lp,
            logits=logprob_logits_bytes(
                lp_scored, V, h, c, target, training=False, fused=knobs.fused_logprob, entropy=entropy
            ),
            all_to_all=all_to_all_buffer_bytes(t_lp, q, kvd, c, s),
        )
        return _finish({**resident("log_prob", ref_pass), **work}, leftovers, trainer_oh, frag, is_cpu)

    passes = ([lp_pass(False)] if old_logprob_pass_needed(workload, target) else []) + (
        [lp_pass(True)] if has_ref else []
    )
    if passes:
        lp_items = max(passes, key=lambda items: sum(items.values()))
    else:  # one on-policy update without KL: no pass runs, only what stays resident
        lp_items = _finish(resident("log_prob", False), leftovers, trainer_oh, frag, is_cpu)

    # ---- update: the largest of the logits / layer-backward / root-reduce / optimizer moments -----
    if target == "grpo-pilot":  # the engine always reports entropy; it carries a gradient with a bonus
        upd_entropy = "grad" if workload.entropy_coeff > 0 else "metric"
    else:
        upd_entropy = "grad" if workload.entropy_coeff > 0 else "none"
    root_grads, root_rs = root_grad_bytes(E, H, c, prec.grad_bytes, is_cpu)
    upd_work = update_peak_items(
        root_gathered=root,
        root_tied=model.tie_word_embeddings,
        gathered_layers=gathered,
        saved_activations=saved_activation_bytes(
            t_upd, L, per_layer_tok, mask(t_upd), bool_mask(t_upd), h, c, knobs.gradient_checkpointing
        ),
        recompute_activations=recompute_activation_bytes(
            t_upd, per_layer_tok, mask(t_upd), knobs.gradient_checkpointing
        ),
        logits=logprob_logits_bytes(
            scored_tokens(t_upd, resp, seq, target),
            V,
            h,
            c,
            target,
            training=True,
            fused=knobs.fused_logprob,
            entropy=upd_entropy,
        ),
        layer_backward_temporaries=layer_backward_temporary_bytes(t_upd, h, inter, c),
        head_grad=head_grad_bytes(E, H, c, is_cpu),
        root_grads=root_grads,
        root_reduce_scatter=root_rs,
        layer_reduce_scatter=layer_reduce_scatter_bytes(P_layer, prec.grad_bytes, is_cpu),
        all_to_all=all_to_all_buffer_bytes(t_upd, q, kvd, c, s),
        # the step runs on the host when the optimizer is offloaded (verl loads it back to the GPU)
        optimizer_step=adam_step_temporary_bytes(
            -(-P // D),
            largest_param_elements(V, h, inter, q),
            o_off and not verl,
            is_cpu,
            fused=is_cpu and target == "grpo-pilot",
        ),  # engine/actor.py: fused AdamW on cpu
    )
    upd_items = _finish({**resident("update"), **upd_work}, leftovers, trainer_oh, frag, is_cpu)

    # ---- weight sync -------------------------------------------------------------------------------
    if bud is None:  # the policy generates itself: nothing to transfer
        sync_items = _finish(resident("weight_sync"), {}, trainer_oh, frag, is_cpu)
    else:
        largest = largest_gathered_bytes(largest_param_elements(V, h, inter, q), prec.master_bytes, c)
        transfer = {"weight_sync_bucket": ov.weight_sync_bucket_bytes, "largest_gathered_tensor": largest}
        engine = {
            "vllm_weights": bud.weights_bytes,
            "vllm_non_torch": bud.non_torch_bytes,
            "vllm_cuda_graphs": bud.cuda_graph_bytes,
        }
        if target == "trl" or lay.split:  # the engine never sleeps: its KV cache stays allocated
            engine["vllm_kv_cache"] = bud.kv_cache_bytes
        if lay.split:
            send = _finish({**resident("weight_sync"), **transfer}, {}, trainer_oh, frag, is_cpu)
            recv = {**engine, "weight_sync_bucket": ov.weight_sync_bucket_bytes, **rollout_oh}
            sync_items = send if sum(send.values()) >= sum(recv.values()) else recv
        else:
            sync_items = _finish({**resident("weight_sync"), **transfer}, engine, trainer_oh, frag, is_cpu)

    # ---- host RAM per node ------------------------------------------------------------------------
    host = host_items(
        lay.trainer_gpus_per_node,
        1 if is_cpu else cluster.gpus_per_node,
        master,
        grads,
        adam,
        ref,
        p_off,
        o_off,
        r_off and has_ref,
        target != "verl",
        ov.cpu_process_rss_bytes if is_cpu else ov.host_rss_bytes_per_gpu_process,
    )

    return MemoryReport(
        phases={
            "rollout": PhaseMemory.of(rollout_items),
            "log_prob": PhaseMemory.of(lp_items),
            "update": PhaseMemory.of(upd_items),
            "weight_sync": PhaseMemory.of(sync_items),
        },
        host=PhaseMemory.of(host),
        kv_cache_bytes_per_gpu=kv_bytes,
        kv_cache_tokens_per_gpu=kv_tok,
        max_concurrent_seqs=max_seqs,
    )
