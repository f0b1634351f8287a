"""`Execution`: the derived numbers the engine needs to run a plan, computed once by the planner.

The engine reads them from the plan (as vLLM's engine reads its `KVCacheConfig`) instead of calling
back into planner internals:
- the layout: training ranks (the FSDP degree), GPUs per node that hold a rollout shard, rollout
  replicas (rollout GPUs / TP; HF rollout: one per GPU it generates on, `hf_decode_mode.hf_rollout_gpus`),
  colocated or split (`memory/layout.py`);
- the rollout engine's KV bytes per token on one of its GPUs (`memory/kv_cache.py`, in the rollout
  element size: bf16 on a GPU, fp32 on the cpu pseudo-device; TP 1 for HF rollout);
- the weight-sync transfer bucket (`Overheads.weight_sync_bucket_bytes`, a calibration may change it);
- whether a step runs an old-policy log-prob pass (`rules.old_logprob_pass_runs`, for the plan's target).
"""

from __future__ import annotations

from pydantic import Field

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import Knobs, Workload, old_logprob_pass_needed
from grpo_pilot.planner.hf_decode_mode import hf_rollout_gpus, plan_replica
from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token_per_gpu
from grpo_pilot.planner.memory.layout import layout_for
from grpo_pilot.planner.memory.precision import rollout_element_bytes
from grpo_pilot.planner.overheads import Overheads
from grpo_pilot.planner.traits import ExecutorTraits
from grpo_pilot.profiles.spec import ModelSpec


class Execution(Frozen):
    """What the engine needs from the planner to execute a plan (module docstring)."""

    trainer_workers: int = Field(ge=1, description="Training ranks: the FSDP degree of actor and reference.")
    rollout_gpus_per_node: int = Field(ge=0, description="GPUs per node that hold a rollout-engine shard.")
    rollout_replicas: int = Field(ge=1, description="Rollout engines generating in parallel.")
    split: bool = Field(description="Rollout and training on separate GPU pools.")
    rollout_kv_bytes_per_token: int = Field(ge=0, description="KV-cache bytes of one token on one rollout GPU.")
    weight_sync_bucket_bytes: int = Field(ge=0, description="Transfer bucket of the trainer → rollout weight sync.")
    old_logprob_pass: bool = Field(description="A step runs an old-policy log-prob pass before the update.")


def execution_of(
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    knobs: Knobs,
    *,
    executor: ExecutorTraits,
    overheads: Overheads,
) -> Execution:
    """The engine's numbers for one configuration (module docstring)."""
    layout = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    hf = knobs.rollout_backend == "hf"
    tp = 1 if hf else knobs.rollout_tp
    if hf:
        rollout_gpus = hf_rollout_gpus(
            layout, cluster.num_nodes, replica=plan_replica(cluster, knobs, executor=executor)
        )
    else:
        rollout_gpus = layout.rollout_gpus_per_node * cluster.num_nodes
    element = rollout_element_bytes(cluster.device)
    return Execution(
        trainer_workers=layout.trainer_gpus,
        rollout_gpus_per_node=layout.rollout_gpus_per_node,
        rollout_replicas=max(1, rollout_gpus // tp),
        split=layout.split,
        rollout_kv_bytes_per_token=kv_bytes_per_token_per_gpu(model, tp, element),
        weight_sync_bucket_bytes=overheads.weight_sync_bucket_bytes,
        old_logprob_pass=old_logprob_pass_needed(workload, executor),
    )
