"""planner/memory/allocator.py: which phases' cached blocks a phase still finds, and the reserve per setting."""

from __future__ import annotations

import pytest

from grpo_pilot.engine.device_memory import RELEASE_POINTS
from grpo_pilot.planner.adapters import AdapterSettings
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory, executor_releases, largest_blocks
from grpo_pilot.planner.memory.allocator import (
    RELEASED_AFTER,
    RESERVE_ITEM,
    reserve_bytes,
    segment_bytes,
    since_last_release,
    with_reserve,
)
from grpo_pilot.planner.memory.context import memory_context
from grpo_pilot.planner.memory.releases import fsdp_critic_releases
from grpo_pilot.planner.memory.rollout_engines import ENGINE_ITEM_NAMES
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
from grpo_pilot.planner.reports import OVERHEAD_PREFIX
from grpo_pilot.planner.traits import traits_for
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
        ("verl", "rollout", ()),  # and after it
        ("before_sync_after_rollout", "rollout", ("weight_sync",)),  # verl v0.3.0: not after the sync
        ("before_sync_after_rollout", "weight_sync", ()),
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


PPO = ("rollout", "log_prob", "values", "critic_update", "update", "weight_sync")


def test_the_critic_shares_the_actors_process_and_cache() -> None:
    """verl fuses every role of a GPU into one worker process (memory/releases.py): the critic's phases find the
    log-prob pass's cached blocks and the update finds theirs, unless the critic's offload empties the cache."""
    assert since_last_release("update", PPO, "verl") == ("log_prob", "values", "critic_update")
    assert since_last_release("values", PPO, "verl") == ("log_prob",)
    offloaded = fsdp_critic_releases(critic_param_offload=True, release_cache="verl")
    assert since_last_release("update", PPO, "verl", offloaded) == ()
    assert since_last_release("critic_update", PPO, "verl", offloaded) == ()
    # before #556 update_critic emptied the cache itself, compute_values never did
    old = fsdp_critic_releases(critic_param_offload=False, release_cache="each_phase")
    assert since_last_release("critic_update", PPO, "each_phase", old) == ("values",)
    assert since_last_release("update", PPO, "each_phase", old) == ()
    assert fsdp_critic_releases(critic_param_offload=False, release_cache="verl") == frozenset()


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
    param_offload (estimate.py `executor_releases`, memory/releases.py): the update then holds only its own
    stranded segment, as with a release after every phase, unless a separate reference pass ran last."""
    each = _update_reserve(workload, param_offload=True, release_cache="each_phase")
    verl = _update_reserve(workload, param_offload=True, release_cache="verl")
    assert each > GiB  # the update's own carved logits segment
    assert (verl == each) is released and verl >= each
    # without param_offload nothing offloads: the log-prob pass's segment stays cached through the update
    assert _update_reserve(workload, param_offload=False, release_cache="verl") > _update_reserve(
        workload, param_offload=False, release_cache="each_phase"
    )


MODEL, GPUS = spec("qwen2.5-0.5b"), cluster("1xH100")


def _plan(workload: Workload, **knobs):
    """The report and the largest blocks of a verl plan under the default allocator."""
    k = Knobs(allocator="default", **knobs)
    ctx = memory_context(MODEL, GPUS, workload, k, executor=traits_for("verl"), overheads=DEFAULT_OVERHEADS)
    return estimate_memory(MODEL, GPUS, workload, k, target="verl"), largest_blocks(ctx), ctx


def _trainer_bytes(items: dict[str, int]) -> int:
    """A phase's trainer tensors (what allocator.with_reserve measures transients by)."""
    return sum(v for k, v in items.items() if not k.startswith(OVERHEAD_PREFIX) and k not in ENGINE_ITEM_NAMES)


def _reserve(report, phase: str) -> int:
    return report.phases[phase].items[RESERVE_ITEM]


def _policy_alone(report, *, release_cache: str, blocks: dict[str, int]) -> dict[str, int]:
    """The reserve the policy alone would give on the same phases (no executor releases)."""
    phases = {p: {k: v for k, v in m.items.items() if k != RESERVE_ITEM} for p, m in report.phases.items()}
    out = with_reserve(phases, allocator="default", release_cache=release_cache, largest_blocks=blocks)
    return {p: items[RESERVE_ITEM] for p, items in out.items()}


def test_megatron_workers_release_after_every_method() -> None:
    """megatron_workers.py: compute_log_prob / compute_ref_log_prob end with an empty_cache whatever the offload
    flags (memory/releases.py), so the update holds only its own carved logits segment — the policy alone would
    leave it the log-prob pass's segment too."""
    w = Workload(use_kl_loss=True)
    report, blocks, ctx = _plan(w, strategy="megatron", release_cache="verl")
    assert executor_releases(ctx) == {"log_prob", "update", "rollout"}
    own, inherited = segment_bytes(blocks["update"]), segment_bytes(blocks["log_prob"])
    assert inherited > 0 and _reserve(report, "update") == own
    # without the release the update would still hold the log-prob pass's segments: its carved block, or all the
    # pass's cached bytes beyond the update's tensors where those are more (the reserve is a high-water mark)
    log_prob, update = (_trainer_bytes(report.phases[p].items) for p in ("log_prob", "update"))
    kept = _policy_alone(report, release_cache="verl", blocks=blocks)["update"]
    assert kept == max(own + inherited, log_prob + inherited - update) > own


@pytest.mark.parametrize(
    ("strategy", "policy", "flag"),
    [
        ("megatron", "after_rollout", "param_offload"),  # megatron_workers.py@cc8fca504 generate_sequences
        ("megatron", "after_rollout", "optimizer_offload"),  # offload_megatron_optimizer empties the cache too
        ("fsdp", "before_sync_after_rollout", "param_offload"),  # fsdp_workers.py@3fc3e2b74 generate_sequences
    ],
)
def test_an_offload_after_the_weight_sync_empties_the_cache_before_the_rollout(
    strategy: str, policy: str, flag: str
) -> None:
    """Where the era's policy does not release after the weight sync (Megatron before #2678, FSDP #575-#1081), the
    rollout holds the sync's cached blocks (a high-water mark) unless an offload right after the sync emptied the
    cache: with the flag the rollout holds nothing beyond its tensors, without it the sync's transient excess."""
    w = Workload(use_kl_loss=False)
    off, _, ctx = _plan(w, strategy=strategy, release_cache=policy, **{flag: True})
    on, _, _ = _plan(w, strategy=strategy, release_cache=policy)
    assert "weight_sync" in executor_releases(ctx)
    assert _reserve(off, "rollout") == 0
    sync, rollout = (_trainer_bytes(on.phases[p].items) for p in ("weight_sync", "rollout"))
    assert sync > rollout and _reserve(on, "rollout") == sync - rollout
    # today's policy releases after the sync either way
    assert _reserve(_plan(w, strategy=strategy, release_cache="verl")[0], "rollout") == 0


def test_the_critics_offload_empties_the_cache_before_the_actors_update() -> None:
    """PPO in verl: the critic shares the actor's allocator; under critic_param_offload compute_values and
    update_critic end with offload_fsdp_model_to_cpu's empty_cache, so the actor's update no longer holds the
    log-prob pass's carved logits segment — exactly that segment less."""
    w = Workload(algorithm="ppo", use_kl_loss=False)
    off, blocks, ctx = _plan(w, release_cache="verl", critic_param_offload=True)
    kept, kept_blocks, _ = _plan(w, release_cache="verl")
    assert {"values", "critic_update"} <= executor_releases(ctx)
    assert blocks == kept_blocks and _reserve(off, "update") == segment_bytes(blocks["update"])
    assert _reserve(kept, "update") - _reserve(off, "update") == segment_bytes(blocks["log_prob"])


def test_grpo_run_releases_where_the_planner_charges_each_policy() -> None:
    """engine/device_memory.py's release points are the planner's RELEASED_AFTER sets, policy by policy (the
    release before the weight sync is the one after the update)."""
    phase_of = {
        "before_weight_sync": "update",
        "after_weight_sync": "weight_sync",
        "after_rollout": "rollout",
        "after_log_prob": "log_prob",
    }
    assert set(RELEASE_POINTS) == set(RELEASED_AFTER)
    for policy, points in RELEASE_POINTS.items():
        assert {phase_of[p] for p in points} == RELEASED_AFTER[policy], policy
