"""Which decode loop our engine's hf rollout runs for a plan (the `hf_decode` knob resolved), and whether the
policy is sharded (FSDP) on its training ranks — one rule for the memory model (`memory/context.py`,
`estimate.rollout_memory`) and the time model (`timing.estimate_time`, `rollout_time.py`).

The engine (engine/rollout/hf.py `resolve_decode`) runs the static loop (`static` / `cuda_graph`) only on
a Llama-family model its step supports (engine/rollout/llama_step.py `unsupported_reason`: the
`kernels.LLAMA_FAMILY_MODEL_TYPES`, no DTensor parameters, no peft adapters) and picks the mode by device
(`kernels.device_decode_mode`: auto = cuda_graph on CUDA, eager on CPU). The plan models the hf rollout on
the trainer's own module, so a sharded policy (its DTensor parameters) and a LoRA policy decode eagerly here;
verl and TRL have no such loop (`ExecutorTraits.missing_knobs`): their HF rollout is eager.
"""

from __future__ import annotations

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.hardware.device_traits import DeviceTraits
from grpo_pilot.kernels import LLAMA_FAMILY_MODEL_TYPES, device_decode_mode
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.memory.layout import layout_for
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


def planned_decode_mode(
    *, knobs: Knobs, device: DeviceTraits, model_type: str, executor: ExecutorTraits, sharded: bool, adapters: bool
) -> str:
    """'eager', 'static' or 'cuda_graph': the loop the plan's hf rollout runs ('eager' for a vLLM plan too, where
    nothing reads it) (module docstring)."""
    if (
        knobs.rollout_backend != "hf"
        or not executor.has_knob("hf_decode")
        or sharded
        or adapters
        or model_type not in LLAMA_FAMILY_MODEL_TYPES
    ):
        return "eager"
    return device_decode_mode(knobs.hf_decode, device.kind)


def plan_decode_mode(
    model: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, *, executor: ExecutorTraits
) -> str:
    """`planned_decode_mode` from the plan's inputs (the time model's entry; the memory model reads its context,
    which derives the same sharding through `policy_sharded`)."""
    device = cluster.device
    layout = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    sharded = policy_sharded(
        trainer_gpus=layout.trainer_gpus,
        device=device,
        executor=executor,
        param_offload=knobs.param_offload and device.offload_meaningful,
        optimizer_offload=knobs.optimizer_offload and device.offload_meaningful,
    )
    return planned_decode_mode(
        knobs=knobs,
        device=device,
        model_type=model.model_type,
        executor=executor,
        sharded=sharded,
        adapters=workload.adapter is not None,
    )
