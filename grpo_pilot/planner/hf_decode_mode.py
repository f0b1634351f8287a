"""Which decode loop our engine's hf rollout runs for a plan (the `hf_decode` knob resolved), whether the
policy is sharded (FSDP) on its training ranks, and whether the rollout generates on a replica of the model —
one rule for the memory model (`memory/context.py`, `estimate.rollout_memory`, `memory/hf_rollout.py`) and the
time model (`timing.estimate_time`, `rollout_time.py`).

The engine (engine/rollout/hf.py `resolve_decode`) runs the static loop (`static` / `cuda_graph`) only on
a Llama-family model its step supports (engine/rollout/llama_step.py `unsupported_reason`: the
`kernels.LLAMA_FAMILY_MODEL_TYPES`, no DTensor parameters, no peft adapters) and picks the mode by device
(`kernels.device_decode_mode`: auto = cuda_graph on CUDA, eager on CPU).

Which module it decodes: on one unsharded training rank colocated with the rollout, the trainer's own
(engine/worker.py `_build_rollout`, `on_policy`), so a LoRA policy (peft adapters) decodes eagerly there. With
several training ranks (the trainer's module FSDP-sharded), offload (FSDP2 CPUOffloadPolicy shards even one
rank) or split placement (the rollout on its own workers), our engine builds a replica instead — a plain,
unsharded module without adapters, loaded by `HFRollout.sync_weights` (merged weights under LoRA:
engine/weight_sync.py `policy_weights`) — so the decode mode follows the replica, not the trainer's sharding
(`hf_replica`, `ExecutorTraits.hf_rollout_replica`). verl and TRL have no such loop
(`ExecutorTraits.missing_knobs`) and no replica: their HF rollout is eager on the trainer's module.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.hardware.device_traits import DeviceTraits
from grpo_pilot.kernels import LLAMA_FAMILY_MODEL_TYPES, device_decode_mode
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.memory.layout import Layout, layout_for
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec


def policy_sharded(
    *, trainer_gpus: int, device: DeviceTraits, executor: ExecutorTraits, param_offload: bool, optimizer_offload: bool
) -> bool:
    """Whether the policy's states are FSDP-sharded on a training rank: more than one training GPU, or (on a GPU)
    an executor that wraps even one rank in FSDP (verl) or offload (FSDP2 CPUOffloadPolicy needs the wrapper).
    Offload flags are the effective ones (meaningless on the cpu device)."""
    offload = param_offload or optimizer_offload
    return trainer_gpus > 1 or (device.caching_allocator and (executor.fsdp_on_one_rank or offload))


def hf_replica(*, knobs: Knobs, executor: ExecutorTraits, sharded: bool, split: bool) -> bool:
    """Whether the plan's hf rollout generates on a replica of the model (module docstring): our engine's, when the
    policy is sharded or the rollout has GPUs of its own (engine/worker.py `_build_rollout`: `on_policy` needs a
    training rank, `train_world == 1` and no offload)."""
    return knobs.rollout_backend == "hf" and executor.hf_rollout_replica and (sharded or split)


def hf_rollout_gpus(layout: Layout, num_nodes: int, *, replica: bool) -> int:
    """GPUs the hf rollout generates on, one replica each (the step's rows split evenly over them:
    engine/workers.py `generate`, `contiguous_chunks`): a replica per split rollout worker (engine/topology.py
    `build_topology`: the first rollout GPUs of each node roll out only), else every training GPU."""
    return layout.rollout_gpus_per_node * num_nodes if replica and layout.split else layout.trainer_gpus


def planned_decode_mode(
    *,
    knobs: Knobs,
    device: DeviceTraits,
    model_type: str,
    executor: ExecutorTraits,
    sharded: bool,
    adapters: bool,
    replica: bool = False,
) -> str:
    """'eager', 'static' or 'cuda_graph': the loop the plan's hf rollout runs ('eager' for a vLLM plan too, where
    nothing reads it) (module docstring). `replica`: it decodes a replica (`hf_replica`), which is unsharded and
    has no adapters whatever the trainer's module."""
    ours = knobs.rollout_backend == "hf" and executor.has_knob("hf_decode")
    if not ours or model_type not in LLAMA_FAMILY_MODEL_TYPES:
        return "eager"
    if not replica and (sharded or adapters):
        return "eager"
    return device_decode_mode(knobs.hf_decode, device.kind)


class HfRolloutPlan(NamedTuple):
    """What the plan's hf rollout runs: its decode loop, whether on a replica, and on how many GPUs."""

    decode_mode: str
    replica: bool
    gpus: int  # `hf_rollout_gpus`


def _plan_sharding(cluster: Cluster, knobs: Knobs, executor: ExecutorTraits) -> tuple[Layout, bool]:
    """The plan's layout and whether its policy is sharded (`policy_sharded` on the effective offloads)."""
    device = cluster.device
    layout = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    sharded = policy_sharded(
        trainer_gpus=layout.trainer_gpus,
        device=device,
        executor=executor,
        param_offload=knobs.param_offload and device.offload_meaningful,
        optimizer_offload=knobs.optimizer_offload and device.offload_meaningful,
    )
    return layout, sharded


def plan_replica(cluster: Cluster, knobs: Knobs, *, executor: ExecutorTraits) -> bool:
    """`hf_replica` from the plan's inputs."""
    layout, sharded = _plan_sharding(cluster, knobs, executor)
    return hf_replica(knobs=knobs, executor=executor, sharded=sharded, split=layout.split)


def plan_hf_rollout(
    model: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, *, executor: ExecutorTraits
) -> HfRolloutPlan:
    """`planned_decode_mode`, `hf_replica` and `hf_rollout_gpus` from the plan's inputs (the time model's entry; the
    memory model reads its context, which derives the same sharding through `policy_sharded`)."""
    layout, sharded = _plan_sharding(cluster, knobs, executor)
    replica = hf_replica(knobs=knobs, executor=executor, sharded=sharded, split=layout.split)
    mode = planned_decode_mode(
        knobs=knobs,
        device=cluster.device,
        model_type=model.model_type,
        executor=executor,
        sharded=sharded,
        adapters=workload.adapter is not None,
        replica=replica,
    )
    return HfRolloutPlan(mode, replica, hf_rollout_gpus(layout, cluster.num_nodes, replica=replica))
