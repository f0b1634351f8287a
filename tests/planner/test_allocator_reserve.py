"""planner/memory/allocator.py: which phases' cached blocks a phase still finds, and the reserve per setting."""

from __future__ import annotations

import pytest

from grpo_pilot.planner.adapters import AdapterSettings
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.memory.allocator import (
    RESERVE_ITEM,
    reserve_bytes,
    segment_bytes,
    since_last_release,
    with_reserve,
)
from tests.planner.conftest import cluster, spec

MiB, GiB = 1 << 20, 1 << 30
GRPO = ("rollout", "log_prob", "update", "weight_sync")
LORA = AdapterSettings(framework="verl", method="lora", rank=32, alpha=32.0, target_modules=("all-linear",))


def test_segment_sizes_follow_get_allocation_size() -> None:
    assert segment_bytes(1) == 2 * MiB and segment_bytes(MiB) == 2 * MiB  # small pool: kSmallBuffer
    assert segment_bytes(MiB + 1) == 20 * MiB and segment_bytes(10 * MiB - 512) == 20 * MiB  # kLargeBuffer
    assert segment_bytes(10 * MiB) == 10 * MiB and segment_bytes(11 * MiB + 1) == 12 * MiB  # kRoundLarge


@pytest.mark.parametrize(
    ("policy", "phase", "since"),
    [
        ("after_rollout", "update", ("log_prob",)),
        ("after_rollout", "rollout", ("weight_sync",)),  # the previous step's update and sync, before the release
        ("after_rollout", "weight_sync", ("log_prob", "update")),
        ("verl", "update", ("log_prob",)),
        ("verl", "weight_sync", ()),  # emptied before the sync
        ("each_phase", "update", ()),
        ("never", "update", ("weight_sync", "rollout", "log_prob")),
    ],
)
def test_phases_since_the_last_release(policy: str, phase: str, since: tuple[str, ...]) -> None:
    got = set(since_last_release(phase, GRPO, policy))
    if policy == "after_rollout" and phase == "rollout":
        assert got == {"log_prob", "update", "weight_sync"}
    else:
        assert got == set(since)


def test_the_critic_process_keeps_its_own_cache() -> None:
    ppo = ("rollout", "log_prob", "values", "critic_update", "update", "weight_sync")
    assert set(since_last_release("update", ppo, "verl")) == {"log_prob"}
    assert set(since_last_release("values", ppo, "verl")) == {"critic_update"}


def test_reserve_per_setting() -> None:
    transients = {"rollout": 0, "log_prob": 8 * GiB, "update": 20 * GiB, "weight_sync": 0}
    blocks = {"log_prob": 7 * GiB, "update": GiB}
    kw = dict(transients=transients, largest_blocks=blocks)
    kept = reserve_bytes(allocator="default", release_cache="after_rollout", **kw)
    # the update strands its own logits segment and still holds the log-prob pass's carved one
    assert kept["update"] == 8 * GiB and kept["log_prob"] == 7 * GiB
    # the sync and the rollout come before the release: they still hold the update's segments (a high-water mark)
    assert kept["weight_sync"] == kept["rollout"] == 20 * GiB + 8 * GiB
    each = reserve_bytes(allocator="default", release_cache="each_phase", **kw)
    assert each["update"] == GiB and each["rollout"] == 0
    expandable = reserve_bytes(allocator="expandable", release_cache="each_phase", **kw)
    assert set(expandable.values()) == {22 * MiB}
    # without releases the mapped pages stay too: the rollout holds the update's
    kept_pages = reserve_bytes(allocator="expandable", release_cache="never", **kw)
    assert kept_pages["update"] == 22 * MiB and kept_pages["rollout"] == 20 * GiB + 22 * MiB
    # a phase that did not run its pass (transients below its block) strands nothing
    idle = reserve_bytes(allocator="default", release_cache="each_phase", transients={**transients, "log_prob": 0},
                         largest_blocks=blocks)  # fmt: skip
    assert idle["log_prob"] == 0


def test_with_reserve_leaves_the_rollout_gpu_of_a_split_placement_alone() -> None:
    phases = {
        "rollout": {"vllm_kv_cache": 30 * GiB, "overhead_cuda_context": MiB},  # the rollout pool's GPU
        "log_prob": {"actor_params": GiB, "logits": 2 * GiB},
        "update": {"actor_params": GiB, "logits": 3 * GiB},
    }
    out = with_reserve(phases, allocator="default", release_cache="never", largest_blocks={"update": GiB})
    assert RESERVE_ITEM not in out["rollout"]
    assert out["update"][RESERVE_ITEM] == GiB
    assert out["log_prob"][RESERVE_ITEM] == GiB + (4 - 3) * GiB  # the update's high-water mark, never released


def test_a_policy_plus_the_executors_own_releases() -> None:
    assert since_last_release("update", GRPO, "verl", frozenset({"log_prob"})) == ()
    assert since_last_release("weight_sync", GRPO, "never", frozenset({"log_prob"})) == ("update",)


def _update_reserve(workload: Workload, **knobs) -> int:
    report = estimate_memory(
        spec("qwen2.5-0.5b"), cluster("1xH100"), workload, Knobs(allocator="default", **knobs), target="verl"
    )
    return report.phases["update"].items[RESERVE_ITEM]


@pytest.mark.parametrize(
    ("workload", "released"),
    [
        (Workload(adapter=LORA, use_kl_loss=True), True),  # the reference is the actor without its adapters
        (Workload(use_kl_loss=False), True),  # no reference pass: the actor's pass is the last
        (Workload(use_kl_loss=True), False),  # a separate reference ran last, without a release
    ],
)
def test_verl_param_offload_empties_the_cache_after_the_actor_log_prob_pass(workload: Workload, released: bool) -> None:
    """verl's `offload_fsdp_model_to_cpu(empty_cache=True)` ends compute_log_prob and update_actor under
    param_offload (estimate.py `offload_releases`): the update then holds only its own stranded segment, as with
    a release after every phase, unless a separate reference pass ran last."""
    each = _update_reserve(workload, param_offload=True, release_cache="each_phase")
    verl = _update_reserve(workload, param_offload=True, release_cache="verl")
    assert each > GiB  # the update's own carved logits segment
    assert (verl == each) is released and verl >= each
    # without param_offload nothing offloads: the log-prob pass's segment stays cached through the update
    assert _update_reserve(workload, param_offload=False, release_cache="verl") > _update_reserve(
        workload, param_offload=False, release_cache="each_phase"
    )
