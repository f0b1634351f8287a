"""The training side of the step-time model, shared by the actor's passes (timing.py), the critic's
(critic_time.py) and Megatron's (megatron_time.py): what a pass derives from the inputs (`train_side`), the
micro-batch loop (`micro_loop_s`), the host's op dispatch and the optimizer step on the host.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.hardware.gpus import GPUSpec
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.lengths import Lengths, lengths_of, tokens_per_sequence_for_time
from grpo_pilot.planner.memory.precision import Precision, precision_for
from grpo_pilot.planner.memory.tokens import sequences_per_sp_group
from grpo_pilot.planner.roofline import collective_bytes_per_s, host_link_bytes_per_s, param_counts, pools
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS, TimeCoefficients
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec

# AdamW step traffic per parameter of the shard: read fp32 param, grad, m, v (16 B), write param, m,
# v (12 B) = 28 B at HBM speed (PyTorch foreach/fused AdamW is bandwidth-bound).
ADAM_BYTES_PER_PARAM = 28


def micro_loop_s(
    *,
    seqs: int,
    per_micro: int,
    tokens_per_seq: float,
    compute_s_per_token: float,
    comm_s_per_micro: float,
    serial_s_per_token: float,
    dispatch_s_per_micro: float = 0.0,
) -> float:
    """Full micro-batches of `per_micro` sequences and one partial one: each lasts max(compute,
    overlapped communication) plus its non-overlapped per-token time (`tokens_per_seq` per rank) plus
    the host's eager op dispatch (`train_dispatch_s`).

    Dispatch adds rather than hides behind the device work: every executor reads results back once per
    micro-batch (verl's `update_policy` appends `.item()` metrics per micro-batch, TRL gathers its logged
    losses, our engine sums its loss terms), so the GPU cannot run ahead of the host for long, and at the
    sizes measured on a GPU (../shared/measurements/h200-2026-11-26.json: 1k–33k tokens per micro-batch)
    the sum explains the measured update and log-prob times within 0.73–1.3× where max(device, dispatch)
    leaves 0.63–1.55× (geometric error 1.24× vs 1.45×); on the cpu pseudo-device the dispatching thread
    runs the ops itself, so the two add there anyway."""

    def one(n: int) -> float:
        tokens = n * tokens_per_seq
        device_s = max(tokens * compute_s_per_token, comm_s_per_micro)
        return device_s + dispatch_s_per_micro + tokens * serial_s_per_token

    per_micro = max(1, min(per_micro, seqs))
    full, rest = divmod(seqs, per_micro)
    return full * one(per_micro) + (one(rest) if rest else 0.0)


def seqs_per_token_budget(budget_tokens: int, sp: int, seq_tokens: float, executor: ExecutorTraits) -> int:
    """Whole sequences one packed micro-batch (one SP group) holds; at least one (verl multiplies the
    per-GPU budget by the Ulysses degree: `ExecutorTraits.budget_scaled_by_sp`)."""
    group_budget = budget_tokens * sp if executor.budget_scaled_by_sp else budget_tokens
    return max(1, int(group_budget // max(1.0, seq_tokens)))


def train_dispatch_s(spec: ModelSpec, passes: int, coefficients: TimeCoefficients) -> float:
    """Host time to dispatch one micro-batch's eager ops: `passes` layer passes (forward 1, backward 2,
    recomputed forward 1) at `train_dispatch_s_per_layer_pass` each (training runs without CUDA graphs)."""
    return passes * spec.num_layers * coefficients.train_dispatch_s_per_layer_pass


def cpu_adam_s(
    shard_params: float, cluster: Cluster, coefficients: TimeCoefficients = DEFAULT_TIME_COEFFICIENTS
) -> float:
    """AdamW on the host over one rank's shard; every rank of the node shares host memory bandwidth."""
    per_rank = coefficients.host_memory_bytes_per_s / cluster.gpus_per_node
    return shard_params * ADAM_BYTES_PER_PARAM / per_rank


class TrainSide(NamedTuple):
    """What both training-side phases (log-prob passes, update) derive from the inputs."""

    gpu: GPUSpec
    prec: Precision
    lengths: Lengths
    train_gpus: int
    sp: int
    seq: float  # tokens one sequence costs in a pass (expected length; TRL: padded)
    attention_context: float  # average keys one token attends to (causal: half the attention length)
    dp: int  # data-parallel groups: training GPUs / SP degree
    bw: float  # collective bandwidth of the FSDP (shard) group
    shards: int  # GPUs the model states are sharded over (fsdp_size)
    replicas: int  # shard groups (HSDP replicas) whose gradients are all-reduced
    replica_bw: float  # collective bandwidth across the replicas
    shard_params: float  # parameters one training rank holds
    host: float  # host-link bytes/s per rank (offload traffic)


def train_side(
    spec: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    coef: TimeCoefficients,
) -> TrainSide:
    gpu = cluster.gpu
    _, train_gpus = pools(cluster, knobs)
    lengths = lengths_of(workload)
    padding = executor.padding
    shards = knobs.shard_degree(train_gpus)
    # TRL's rows are as wide as the longest of the rank's generation batch (memory/context.py, the same pool)
    batch_rows = sequences_per_sp_group(workload.prompts_per_step * workload.n, train_gpus, knobs.ulysses_sp)

    def bandwidth(ranks: int) -> float:
        spans = cluster.num_nodes > 1 and ranks > cluster.gpus_per_node
        return collective_bytes_per_s(gpu, spans, coef, gpus_per_node=cluster.gpus_per_node)

    return TrainSide(
        gpu=gpu,
        prec=precision_for(
            executor, cluster.device, model_dtype=knobs.model_dtype, state_sharding=knobs.state_sharding
        ),
        lengths=lengths,
        train_gpus=train_gpus,
        sp=knobs.ulysses_sp,
        seq=tokens_per_sequence_for_time(lengths, padding, batch_rows),
        attention_context=attention_seq(lengths, padding, batch_rows) / 2,
        dp=max(1, train_gpus // knobs.ulysses_sp),
        bw=bandwidth(shards),
        shards=shards,
        replicas=max(1, train_gpus // shards),
        # replicas sit in different nodes once a shard group fills a node (a replica group strides over them)
        replica_bw=collective_bytes_per_s(
            gpu, cluster.num_nodes > 1 and train_gpus > shards, coef, gpus_per_node=cluster.gpus_per_node
        ),
        shard_params=param_counts(spec)[0] / shards,
        host=host_link_bytes_per_s(gpu, coef),
    )


def attention_seq(lengths: Lengths, padding: str, batch_rows: int = 1) -> float:
    """Sequence length whose causal attention cost per token matches the batch's: Σ L² / Σ L = E[L²] / E[L]
    over real lengths (padded rows: the padded width, `tokens_per_sequence_for_time`)."""
    if padding == "batch_max":
        return tokens_per_sequence_for_time(lengths, padding, batch_rows)
    second = lengths.seq_mean**2 + lengths.seq_std**2
    return min(float(lengths.seq_max), second / max(lengths.seq_mean, 1.0))
