"""Shared helpers for the planner's memory tests: resolved models, clusters and a one-call estimate."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import pytest

from grpo_pilot.hardware.cluster import Cluster, parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.reports import MemoryReport
from grpo_pilot.profiles import resolve_model
from grpo_pilot.profiles.spec import ModelSpec

PHASE_NAMES = ("rollout", "log_prob", "update", "weight_sync")


@lru_cache(maxsize=None)
def spec(alias: str) -> ModelSpec:
    return resolve_model(alias).spec


@lru_cache(maxsize=None)
def cluster(text: str) -> Cluster:
    return parse_cluster(text)


def _est(
    model: str = "qwen2.5-7b",
    cluster_text: str = "8xA100-80G",
    *,
    target: str = "grpo-pilot",
    workload: Workload | None = None,
    **knobs,
) -> MemoryReport:
    """estimate_memory for an alias, a cluster string and knob overrides."""
    return estimate_memory(spec(model), cluster(cluster_text), workload or Workload(), Knobs(**knobs), target=target)


def _totals(report: MemoryReport) -> dict[str, int]:
    """Phase totals plus the host total, keyed by name."""
    out = {name: report.phases[name].total_bytes for name in PHASE_NAMES}
    out["host"] = report.host.total_bytes
    return out


@pytest.fixture
def est() -> Callable[..., MemoryReport]:
    """`est(model_alias, cluster_text, target=..., workload=..., **knob_overrides) -> MemoryReport`."""
    return _est


@pytest.fixture
def totals() -> Callable[[MemoryReport], dict[str, int]]:
    """`totals(report)`: phase totals plus 'host', keyed by name."""
    return _totals


@pytest.fixture
def spec_of() -> Callable[[str], ModelSpec]:
    """`spec_of(alias) -> ModelSpec` (cached)."""
    return spec


@pytest.fixture
def cluster_of() -> Callable[[str], Cluster]:
    """`cluster_of("8xA100-80G") -> Cluster` (cached)."""
    return cluster
