"""Split placement's weight sync by executor (`ExecutorTraits.split_sync_via_host`): verl joins both pools in an
NCCL group (one more communicator on each side, the bf16 weights over the link between the pools); our engine
passes master-dtype buckets through host memory (no communicator; device → host, host → device)."""

from __future__ import annotations

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
from grpo_pilot.planner.roofline import host_link_bytes_per_s, param_counts
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS
from grpo_pilot.planner.timing import weight_sync_time_s
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles.catalog import resolve_model

Q7 = resolve_model("qwen2.5-7b").spec
H100x8 = parse_cluster("8xH100")
COMM = DEFAULT_OVERHEADS.nccl_bytes_per_communicator


def _nccl(target: str, placement: str) -> tuple[int, int]:
    knobs = Knobs(placement=placement, split_rollout_gpus_per_node=4 if placement == "split" else 0)
    report = estimate_memory(Q7, H100x8, Workload(), knobs, target=target)
    return report.phases["update"].items["overhead_nccl"], report.phases["rollout"].items["overhead_nccl"]


@pytest.mark.parametrize("target, group", [("verl", 1), ("grpo-pilot", 0)])
def test_a_weight_sync_group_only_where_the_executor_makes_one(target: str, group: int) -> None:
    trainer_colocated, _ = _nccl(target, "colocated")
    trainer_split, rollout_split = _nccl(target, "split")
    # 4 training GPUs instead of 8 keep the FSDP communicator; the sync group comes on top
    assert trainer_split - trainer_colocated == group * COMM
    assert rollout_split == group * COMM


def test_our_split_sync_moves_master_dtype_buckets_through_the_host() -> None:
    knobs = Knobs(placement="split", split_rollout_gpus_per_node=4)
    ours = weight_sync_time_s(Q7, H100x8, knobs, executor=traits_for("grpo-pilot"))
    verl = weight_sync_time_s(Q7, H100x8, knobs, executor=traits_for("verl"))
    host = host_link_bytes_per_s(H100x8.gpu, DEFAULT_TIME_COEFFICIENTS)
    # at least the fp32 weights down to the host and back up: 2 × 4 bytes per parameter over the host link
    params = param_counts(Q7)[0]
    assert ours > 2 * 4 * params / host
    assert verl < 2 * 4 * params / host < ours  # NVLink between the pools: the bf16 weights once
