"""Step time of verl's Megatron backend: pipelined passes over TP × PP (× VPP) × CP × DP (family_time.py terms).

One micro-batch of T tokens (per DP rank, split over CP) on one stage costs its layers' share of the model's
per-token roofline (`roofline.py`) divided by TP, plus the TP collectives of each layer and pass
(`family_time.megatron_tp_comm_s`: two all-reduces forward and backward without SP, the same ring traffic
with SP's all-gathers and reduce-scatters) and, with CP, the all-gather of each layer's K and V over the
CP ranks. Then:
- update: per mini-batch the 1F1B (interleaved with VPP) pipeline of m micro-batches,
  `pipelined_step_s` = (m + (p − 1)/v) × one micro-batch's forward + backward (+ recomputed forward with
  full or selective recompute) on one stage; the distributed optimizer's reduce-scatter of fp32 grads and
  all-gather of bf16 params over DP; the Adam step over the rank's optimizer shard at HBM speed; verl's
  load-use-offload round trips of params, grads and optimizer states (`offload_round_trip_s`);
- log-prob passes (old policy, reference): forward-only pipelines, (m + p − 1) × one micro-batch's forward
  on one stage; offloaded params come in for the pass;
- weight sync: each TP-sharded tensor all-gathered over TP and handed to the rollout engine, which loads
  its shard at HBM speed; offloaded params come in first.
Per micro-batch the host dispatches every layer pass of its stage (`train_dispatch_s`).
"""

from __future__ import annotations

import math

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.planner.config import Knobs, Workload, old_logprob_pass_needed
from grpo_pilot.planner.family_time import megatron_tp_comm_s, offload_round_trip_s, pipelined_step_s
from grpo_pilot.planner.lengths import lengths_of, tokens_per_sequence_for_time
from grpo_pilot.planner.memory.megatron import MEGATRON_ADAM_BYTES, MEGATRON_GRAD_BYTES, MEGATRON_MASTER_BYTES
from grpo_pilot.planner.memory.megatron_phases import megatron_parallel
from grpo_pilot.planner.roofline import (
    collective_bytes_per_s,
    forward_cost,
    host_link_bytes_per_s,
    logits_traffic_bytes,
    param_counts,
    pools,
    ring_time_s,
    token_seconds,
    training_cost,
)
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS, TimeCoefficients
from grpo_pilot.planner.train_side import ADAM_BYTES_PER_PARAM, attention_seq
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import BF16_BYTES, FP32_BYTES


def _micro_seqs(budget: int | None, fixed: int | None, seq: float, cp: int) -> int:
    """Sequences one micro-batch holds: the fixed count, or a token budget × CP of expected sequences."""
    if budget is not None:
        return max(1, int(budget * cp // max(1.0, seq)))
    return max(1, fixed or 1)


def megatron_times(
    spec: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    coefficients: TimeCoefficients = DEFAULT_TIME_COEFFICIENTS,
) -> dict[str, float]:
    """Seconds of log_prob, update and weight_sync under Megatron (module docstring)."""
    coef, gpu = coefficients, cluster.gpu
    _, train_gpus = pools(cluster, knobs)
    par = megatron_parallel(knobs, train_gpus)
    lengths = lengths_of(workload)
    seq = tokens_per_sequence_for_time(lengths, "remove")
    context = attention_seq(lengths, "remove") / 2
    c = BF16_BYTES
    link = collective_bytes_per_s(gpu, False, coef, gpus_per_node=cluster.gpus_per_node)
    dp_link = collective_bytes_per_s(gpu, cluster.num_nodes > 1 and train_gpus > cluster.gpus_per_node, coef)
    host = host_link_bytes_per_s(gpu, coef)
    ranks_per_replica = par.tp * par.pp
    params_per_rank = param_counts(spec)[0] / ranks_per_replica
    layers = math.ceil(spec.num_layers / par.pp)

    def stage_s(tokens: float, cost_per_token: float, passes: int) -> float:
        local = tokens / par.cp
        compute = local * cost_per_token / ranks_per_replica
        tp = passes * layers * megatron_tp_comm_s(local, spec.hidden_size, c, par.tp, link_bytes_per_s=link)
        cp = passes * layers * ring_time_s(c * tokens * 2 * spec.kv_dim / par.tp, par.cp, link)
        return compute + tp + cp + passes * layers * coef.train_dispatch_s_per_layer_pass

    recompute = knobs.megatron_recompute == "full"
    train_cost = training_cost(
        spec,
        attention_context=context,
        compute_bytes=c,
        logits_bytes=logits_traffic_bytes(spec.vocab_size, c, executor, training=True),
        recompute=recompute,
    )
    fwd_cost = forward_cost(spec, context, c, logits_traffic_bytes(spec.vocab_size, c, executor, training=False))
    # update
    mini_seqs = math.ceil(workload.mini_batch_prompts * workload.n / par.dp)
    micro = _micro_seqs(knobs.max_token_len_per_gpu, knobs.micro_batch_size_per_gpu, seq, par.cp)
    m = math.ceil(mini_seqs / micro)
    micro_s = stage_s(micro * seq, token_seconds(train_cost, gpu, coef), 3 if recompute else 2)
    shard = params_per_rank / (par.dp * par.cp if par.distributed_optimizer else 1)
    dp_s = ring_time_s((FP32_BYTES + BF16_BYTES) * params_per_rank, par.dp * par.cp, dp_link)
    optim_s = shard * ADAM_BYTES_PER_PARAM / gpu.hbm_bytes_per_s
    minis = math.ceil(workload.prompts_per_step / workload.mini_batch_prompts)
    update = workload.ppo_epochs * minis * (pipelined_step_s(micro_s, m, par.pp, par.vpp) + dp_s + optim_s)
    offload = 0.0
    if knobs.param_offload:  # bf16 params back (and the grad buffer re-made) for the phase
        offload += offload_round_trip_s(BF16_BYTES * params_per_rank, host)
    if knobs.optimizer_offload:
        offload += offload_round_trip_s((MEGATRON_MASTER_BYTES + MEGATRON_ADAM_BYTES) * shard, host)
    update += offload + (MEGATRON_GRAD_BYTES * params_per_rank / gpu.hbm_bytes_per_s if knobs.param_offload else 0.0)
    # log-prob passes: forward-only pipelines
    seqs = math.ceil(workload.responses_per_step / par.dp)
    lp_micro = _micro_seqs(
        knobs.log_prob_max_token_len_per_gpu if knobs.log_prob_micro_batch_size_per_gpu is None else None,
        knobs.log_prob_micro_batch_size_per_gpu,
        seq,
        par.cp,
    )
    lp_m = math.ceil(seqs / lp_micro)
    one_pass = (lp_m + par.pp - 1) * stage_s(lp_micro * seq, token_seconds(fwd_cost, gpu, coef), 1)
    load = offload_round_trip_s(BF16_BYTES * params_per_rank, host) / 2
    log_prob = 0.0
    if old_logprob_pass_needed(workload, executor):
        log_prob += one_pass + (load if knobs.param_offload else 0.0)
    if workload.use_kl_loss:
        log_prob += one_pass + (load if knobs.ref_param_offload else 0.0)
    weights = BF16_BYTES * param_counts(spec)[0]
    sync = ring_time_s(weights / par.pp, par.tp, link) + weights / knobs.rollout_tp / gpu.hbm_bytes_per_s
    sync += load if knobs.param_offload else 0.0
    return {"log_prob": log_prob, "update": update, "weight_sync": sync}
