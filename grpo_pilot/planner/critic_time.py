"""Step time of PPO's critic (verl `compute_values` and `update_critic`), the same roofline as the actor's passes.

- values: a forward over every sequence of the step on the training GPUs, at the critic's forward micro-batch,
  with the value head (h → 1) in place of the vocab projection and log-prob computation (no logits term);
- critic_update: `ppo_epochs` × mini-batches of forward + backward (+ recomputed forward with the critic's
  gradient checkpointing) at the critic's update micro-batch, one fp32 Adam step per mini-batch over the
  critic's shard;
- FSDP: the critic's bf16 all-gathers (twice in training) and fp32 reduce-scatter per micro-batch, overlapped
  with compute as the actor's (`timing.micro_loop_s`); verl loads offloaded critic states for the phase and
  offloads them after (critic.model.fsdp_config.*_offload).
The MI300 PPO log in the corpus (tests/planner/real_runs/cases_families.json: deepseek-llm-7b, 8 MI300X) has
values 1.33 s beside old_log_prob 1.40 s and update_critic 5.99 s beside update_actor 6.84 s: the critic's
passes cost about the actor's minus the vocab head.
"""

from __future__ import annotations

import math

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.memory.critic import critic_params
from grpo_pilot.planner.memory.critic_plan import critic_knobs
from grpo_pilot.planner.memory.shape import shape_of
from grpo_pilot.planner.roofline import TokenCost, forward_cost, ring_time_s, token_seconds
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS, TimeCoefficients
from grpo_pilot.planner.train_side import (
    ADAM_BYTES_PER_PARAM,
    micro_loop_s,
    seqs_per_token_budget,
    train_dispatch_s,
    train_side,
)
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import BF16_BYTES, FP32_BYTES


def _critic_forward_cost(spec: ModelSpec, attention_context: float, compute_bytes: int) -> TokenCost:
    """The actor's forward without the vocab projection (the value head is h FLOPs per token)."""
    actor = forward_cost(spec, attention_context, compute_bytes, 0.0)
    head = 2.0 * spec.vocab_size * spec.hidden_size
    return actor._replace(matmul_flops=max(0.0, actor.matmul_flops - head))


def _per_micro(fixed: int | None, budget: int | None, seq: float, executor: ExecutorTraits) -> int:
    if fixed is not None:
        return fixed
    return seqs_per_token_budget(budget or int(seq), 1, seq, executor)


def critic_times(
    spec: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    coefficients: TimeCoefficients = DEFAULT_TIME_COEFFICIENTS,
) -> dict[str, float]:
    """Seconds of `values` and `critic_update` (empty without a critic; module docstring)."""
    if not workload.has_critic:
        return {}
    ck = critic_knobs(workload, knobs)
    ts = train_side(spec, cluster, workload, ck, executor=executor, coef=coefficients)
    c, params = ts.prec.compute_bytes, critic_params(shape_of(spec))
    shard = params / ts.shards
    fwd = _critic_forward_cost(spec, ts.attention_context, c)
    # values: forward only
    seqs = math.ceil(workload.responses_per_step / ts.dp)
    per_micro = _per_micro(ck.log_prob_micro_batch_size_per_gpu, ck.log_prob_max_token_len_per_gpu, ts.seq, executor)
    gather = ring_time_s(BF16_BYTES * params, ts.shards, ts.bw)
    dispatch = train_dispatch_s(spec, 1, coefficients)
    offload_s = 2 * FP32_BYTES * shard / ts.host if knobs.critic_param_offload else 0.0
    values = micro_loop_s(
        seqs=seqs,
        per_micro=per_micro,
        tokens_per_seq=ts.seq,
        compute_s_per_token=token_seconds(fwd, ts.gpu, coefficients),
        comm_s_per_micro=gather,
        serial_s_per_token=0.0,
        dispatch_s_per_micro=dispatch,
    )
    # update: forward + backward (+ recompute), one Adam step per mini-batch
    recompute = workload.critic_settings.gradient_checkpointing
    passes = 3 if recompute else 2
    train = fwd.times(1 + 2 + (1 if recompute else 0))
    mini_seqs = max(1, math.ceil(workload.mini_batch_prompts * workload.n / ts.dp))
    per_micro = _per_micro(
        None if ck.dynamic_batching else ck.micro_batch_size_per_gpu, ck.max_token_len_per_gpu, ts.seq, executor
    )
    comm = ring_time_s((2 * BF16_BYTES + FP32_BYTES) * params, ts.shards, ts.bw)
    loop = micro_loop_s(
        seqs=mini_seqs,
        per_micro=per_micro,
        tokens_per_seq=ts.seq,
        compute_s_per_token=token_seconds(train, ts.gpu, coefficients),
        comm_s_per_micro=comm,
        serial_s_per_token=0.0,
        dispatch_s_per_micro=train_dispatch_s(spec, passes + 1, coefficients),
    )
    optim = shard * ADAM_BYTES_PER_PARAM / ts.gpu.hbm_bytes_per_s
    minis = math.ceil(workload.prompts_per_step / workload.mini_batch_prompts)
    phase = 2 * 2 * FP32_BYTES * shard / ts.host if knobs.critic_optimizer_offload else 0.0
    update = workload.ppo_epochs * minis * (loop + optim) + offload_s + phase
    return {"values": values + offload_s, "critic_update": update}


def critic_flops_per_step(spec: ModelSpec, workload: Workload, tokens_per_step: float, forward_flops: float) -> float:
    """Useful critic FLOPs: 2·P per token for the values pass, 6·P per token and epoch for its update (the
    vocab projection excluded); 0 without a critic."""
    if not workload.has_critic:
        return 0.0
    critic_forward = max(0.0, forward_flops - 2.0 * spec.vocab_size * spec.hidden_size)
    return tokens_per_step * critic_forward * (1 + 3 * workload.ppo_epochs)
