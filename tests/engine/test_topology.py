"""Which worker does what (colocated, split, nodes, tensor-parallel replicas), and the Ray resource check."""

from __future__ import annotations

import pytest

from grpo_pilot.engine.ray_cluster import check_resources
from grpo_pilot.engine.topology import build_topology, topology_for
from grpo_pilot.errors import InputError
from grpo_pilot.planner.plan import load_plan


def test_colocated_every_worker_trains_and_rolls_out():
    topo = build_topology(num_nodes=2, per_node=4, placement="colocated", rollout_per_node=4, rollout_tp=2)
    assert topo.num_workers == 8 and topo.train_world == 8 and not topo.rollout_group
    assert [w.node for w in topo.workers] == [0] * 4 + [1] * 4
    assert all(w.role == "trainer+rollout" and w.train_rank == w.rollout_rank == w.index for w in topo.workers)
    assert [[w.index for w in r] for r in topo.replicas] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.workers[5].label == "worker 5 (trainer+rollout)"


def test_split_gives_each_node_a_rollout_pool_and_trainers():
    topo = build_topology(num_nodes=2, per_node=4, placement="split", rollout_per_node=1, rollout_tp=1)
    roles = [w.role for w in topo.workers]
    assert roles == ["rollout", "trainer", "trainer", "trainer"] * 2
    assert [w.index for w in topo.trainers] == [1, 2, 3, 5, 6, 7] and topo.train_world == 6
    assert [w.train_rank for w in topo.trainers] == list(range(6))
    assert [w.index for w in topo.rollout_workers] == [0, 4] and len(topo.replicas) == 2
    tp = build_topology(num_nodes=1, per_node=4, placement="split", rollout_per_node=2, rollout_tp=2)
    assert tp.rollout_group and [[w.index for w in r] for r in tp.replicas] == [[0, 1]]


def test_impossible_layouts_are_input_errors():
    with pytest.raises(InputError, match="at least one rollout and one training worker"):
        build_topology(num_nodes=1, per_node=1, placement="split", rollout_per_node=1, rollout_tp=1)
    with pytest.raises(InputError, match="rollout_tp=3 does not divide"):
        build_topology(num_nodes=1, per_node=4, placement="colocated", rollout_per_node=4, rollout_tp=3)


def test_example_plans_give_their_workers():
    from grpo_pilot.hardware import parse_cluster

    tiny = load_plan("examples/tiny/plan.json")
    assert topology_for(tiny).num_workers == 1 and topology_for(tiny).device_kind == "cpu"
    gpu = topology_for(tiny.model_copy(update={"cluster": parse_cluster("2x4xH100")}))
    assert gpu.device_kind == "cuda" and gpu.num_workers == 8 and gpu.workers_per_node == 4
    colocated = topology_for(load_plan("examples/tiny/plan-2xcpu-colocated.json"))
    assert [w.role for w in colocated.workers] == ["trainer+rollout"] * 2
    split = topology_for(load_plan("examples/tiny/plan-2xcpu-split.json"))
    assert [w.role for w in split.workers] == ["rollout", "trainer"]


def test_resource_check_refuses_a_cluster_too_small_for_the_plan():
    eight = build_topology(num_nodes=1, per_node=8, placement="colocated", rollout_per_node=8, rollout_tp=1)
    with pytest.raises(InputError, match="has 4 GPU\\(s\\); the plan needs 8") as info:
        check_resources({"GPU": 4.0, "CPU": 64.0}, [4], eight, "cuda")
    assert "ray start" in info.value.hint
    two_nodes = build_topology(num_nodes=2, per_node=4, placement="colocated", rollout_per_node=4, rollout_tp=1)
    with pytest.raises(InputError, match="nodes have 6, 2 GPU"):
        check_resources({"GPU": 8.0}, [6, 2], two_nodes, "cuda")  # 8 GPUs, but only one node holds 4
    check_resources({"GPU": 8.0}, [4, 4], two_nodes, "cuda")
    four_cpu = build_topology(num_nodes=1, per_node=4, placement="colocated", rollout_per_node=4, rollout_tp=1)
    with pytest.raises(InputError, match="has 2 CPU\\(s\\); the plan needs 4 CPU workers"):
        check_resources({"CPU": 2.0}, [0], four_cpu, "cpu")
    check_resources({"CPU": 4.0}, [0], four_cpu, "cpu")
