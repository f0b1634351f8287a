"""Which worker does what: one worker per GPU (per CPU slot on `Nxcpu`), from the plan's cluster and placement.

    topo = topology_for(plan)
    topo.workers            WorkerSpec per worker, node-major (worker i runs in placement-group bundle i)
    topo.trainers           the training ranks: one FSDP2 group (torch.distributed, gloo/NCCL)
    topo.replicas           rollout replicas: rollout_tp consecutive rollout workers each

Placements (planner/memory/layout.py resolves the same knobs into GPU counts for the estimate):
- colocated: every worker trains and rolls out, time-sharing its device (the rollout engine sleeps
  while the trainer works); training ranks = rollout ranks = workers; one torch.distributed group.
- split: on every node the first `rollout GPUs per node` workers only roll out (a dedicated rollout
  pool, as in TRL/Axolotl's vLLM-server layout and verl's split configs), the rest only train. The
  training ranks form one group; the rollout workers form their own group only when vLLM tensor
  parallelism needs one (rollout_tp > 1).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen


class WorkerSpec(Frozen):
    """One worker process."""

    index: int = Field(ge=0, description="Worker index = placement-group bundle index (node-major).")
    node: int = Field(ge=0, description="Node of the plan's cluster it runs on.")
    train_rank: int | None = Field(default=None, ge=0, description="Rank in the training group (None: no training).")
    rollout_rank: int | None = Field(default=None, ge=0, description="Index among rollout workers (None: none).")

    @property
    def trains(self) -> bool:
        return self.train_rank is not None

    @property
    def rolls_out(self) -> bool:
        return self.rollout_rank is not None

    @property
    def role(self) -> str:
        return "trainer+rollout" if self.trains and self.rolls_out else "trainer" if self.trains else "rollout"

    @property
    def label(self) -> str:
        """How messages, workers.json and profile.json name it."""
        return f"worker {self.index} ({self.role})"


class Topology(Frozen):
    """The workers of a run and their groups."""

    placement: Literal["colocated", "split"]
    device_kind: Literal["cpu", "cuda"] = Field(
        default="cpu", description="What each worker needs: a GPU (a GPU plan) or a CPU slot (an Nxcpu plan)."
    )
    num_nodes: int = Field(ge=1)
    workers_per_node: int = Field(ge=1)
    rollout_tp: int = Field(ge=1, description="vLLM tensor parallelism: rollout workers per replica.")
    workers: tuple[WorkerSpec, ...]

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def trainers(self) -> tuple[WorkerSpec, ...]:
        return tuple(sorted((w for w in self.workers if w.trains), key=lambda w: w.train_rank or 0))

    @property
    def rollout_workers(self) -> tuple[WorkerSpec, ...]:
        return tuple(sorted((w for w in self.workers if w.rolls_out), key=lambda w: w.rollout_rank or 0))

    @property
    def train_world(self) -> int:
        return len(self.trainers)

    @property
    def replicas(self) -> tuple[tuple[WorkerSpec, ...], ...]:
        """Rollout replicas: groups of rollout_tp consecutive rollout workers (all get the same prompts)."""
        pool = self.rollout_workers
        return tuple(pool[i : i + self.rollout_tp] for i in range(0, len(pool), self.rollout_tp))

    @property
    def rollout_group(self) -> bool:
        """Split rollout workers need a torch.distributed group of their own (vLLM tensor parallelism)."""
        return self.placement == "split" and self.rollout_tp > 1


def build_topology(
    *,
    num_nodes: int,
    per_node: int,
    placement: str,
    rollout_per_node: int,
    rollout_tp: int,
    device_kind: Literal["cpu", "cuda"] = "cpu",
) -> Topology:
    """Workers for `num_nodes` × `per_node` devices; `rollout_per_node` = rollout workers per node (split)."""

    split = placement == "split"
    if split and not 1 <= rollout_per_node < per_node:
        raise InputError(
            f"placement=split needs at least one rollout and one training worker per node; the plan gives "
            f"{rollout_per_node} of {per_node} to rollout.",
            "Re-plan with --pin split_rollout_gpus_per_node between 1 and the GPUs per node − 1, or colocated.",
        )
    workers, train_rank, rollout_rank = [], 0, 0
    for node in range(num_nodes):
        for slot in range(per_node):
            rollout_only = split and slot < rollout_per_node
            trains = not rollout_only
            rolls_out = rollout_only or not split
            workers.append(
                WorkerSpec(
                    index=len(workers),
                    node=node,
                    train_rank=train_rank if trains else None,
                    rollout_rank=rollout_rank if rolls_out else None,
                )
            )
            train_rank += int(trains)
            rollout_rank += int(rolls_out)
    pool = rollout_rank
    if pool % rollout_tp:
        raise InputError(
            f"rollout_tp={rollout_tp} does not divide the {pool} rollout workers.",
            "Re-plan with a rollout_tp that divides the rollout GPUs.",
        )
    return Topology(
        placement="split" if split else "colocated",
        device_kind=device_kind,
        num_nodes=num_nodes,
        workers_per_node=per_node,
        rollout_tp=rollout_tp,
        workers=tuple(workers),
    )


def topology_for(plan: object) -> Topology:
    """The plan's workers: its cluster (nodes × GPUs, or N CPU workers) and the layout the planner recorded
    (`Plan.execution`: which GPUs of a node roll out)."""
    cluster, knobs, run = plan.cluster, plan.knobs, plan.run  # type: ignore[attr-defined]
    return build_topology(
        num_nodes=cluster.num_nodes,
        per_node=cluster.gpus_per_node,
        placement=knobs.placement,
        rollout_per_node=run.rollout_gpus_per_node,
        rollout_tp=knobs.rollout_tp,
        device_kind=cluster.device.kind,
    )
