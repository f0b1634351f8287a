"""The CUDA allocator setting, the cache-release policy and the per-phase device figures (CUDA faked on CPU)."""

from __future__ import annotations

import types

import pytest
import torch

from grpo_pilot.engine import device_memory as dm
from grpo_pilot.engine.profiling import PhaseProfiler

CUDA = types.SimpleNamespace(type="cuda")
CPU = torch.device("cpu")


def test_alloc_conf_sets_expandable_and_keeps_the_users_other_options():
    assert dm.alloc_conf("expandable", None) == "expandable_segments:True"
    assert dm.alloc_conf("expandable", "max_split_size_mb:128") == "max_split_size_mb:128,expandable_segments:True"
    assert dm.alloc_conf("expandable", "expandable_segments:False, max_split_size_mb:64") == (
        "max_split_size_mb:64,expandable_segments:True"
    )
    assert dm.alloc_conf("default", "max_split_size_mb:64") == "max_split_size_mb:64"
    assert dm.alloc_conf("default", None) is None


def test_apply_allocator_changes_nothing_on_cpu(monkeypatch):
    monkeypatch.delenv(dm.ENV_VAR, raising=False)
    assert dm.apply_allocator("expandable", CPU) is None
    assert dm.ENV_VAR not in __import__("os").environ


def test_apply_allocator_on_cuda_sets_the_environment_and_the_running_allocator(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", seen.append)
    monkeypatch.setenv(dm.ENV_VAR, "max_split_size_mb:128")
    assert dm.apply_allocator("expandable", CUDA) == "max_split_size_mb:128,expandable_segments:True"
    assert __import__("os").environ[dm.ENV_VAR] == "max_split_size_mb:128,expandable_segments:True"
    assert seen == ["expandable_segments:True"]
    monkeypatch.setenv(dm.ENV_VAR, "max_split_size_mb:128")
    assert dm.apply_allocator("default", CUDA) == "max_split_size_mb:128" and seen == ["expandable_segments:True"]


@pytest.mark.parametrize(
    ("policy", "points"),
    [
        ("verl", {"before_weight_sync", "after_weight_sync", "after_rollout"}),
        ("each_phase", {"before_weight_sync", "after_weight_sync", "after_rollout", "after_log_prob"}),
        ("after_rollout", {"after_rollout"}),
        ("never", set()),
    ],
)
def test_release_cache_runs_empty_cache_where_the_policy_says(monkeypatch, policy, points):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    every = ("before_weight_sync", "after_weight_sync", "after_rollout", "after_log_prob", "before_update")
    ran = {p for p in every if dm.release_cache(policy, p, CUDA)}
    assert ran == points and len(calls) == len(points)
    assert not any(dm.release_cache(policy, p, CPU) for p in every) and len(calls) == len(points)
    with pytest.raises(ValueError, match="release_cache"):
        dm.release_points("sometimes")


def test_allocator_report_says_cpu_is_a_no_op():
    cpu = dm.allocator_report("expandable", "verl", device_type="cpu", conf=None)
    assert cpu.release_points == () and cpu.applies.startswith("no-op on cpu")
    cuda = dm.allocator_report("default", "after_rollout", device_type="cuda", conf="x:1")
    assert (cuda.applies, cuda.release_points, cuda.alloc_conf) == ("cuda", ("after_rollout",), "x:1")


def _fake_cuda(monkeypatch, state):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: state["reserved_peak"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: state["reserved"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (state["free"], state["total"]))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)


def test_device_footprint_is_the_peak_reserve_plus_what_lies_outside_the_allocator(monkeypatch):
    # 100 total, 40 free -> 60 used, of which 20 is the allocator's reserve now: 40 outside it (context, cuBLAS);
    # the reserve peaked at 30 during the phase -> footprint 70
    state = dict(allocated=10, reserved_peak=30, reserved=20, free=40, total=100)
    _fake_cuda(monkeypatch, state)
    assert dm.cuda_phase_peaks("cuda:0") == (10, 30, 70)
    prof = PhaseProfiler("cuda:0")
    prof.begin_step()
    with prof.phase("rollout"):
        pass
    state.update(allocated=12, reserved_peak=50, reserved=50, free=10)  # a second round of the same phase
    with prof.phase("rollout"):
        pass
    got = prof.end_step()["rollout"]
    assert (got.peak_bytes, got.reserved_peak_bytes, got.device_peak_bytes) == (12, 50, 90)
    assert prof.memory_source.startswith("torch.cuda.max_memory_allocated")
