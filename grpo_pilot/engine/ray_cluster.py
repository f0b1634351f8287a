"""Ray for grpo-run: join or start a cluster, check it can hold the plan, place one actor per worker.

    conn = connect(address, topology, device_kind)      starts a local cluster unless one is running / given
    actors = place_workers(conn, setup)                 a placement group: one bundle per worker, node-major
    conn.close()                                        shuts a cluster we started down; leaves others alone

Ray is imported here only, lazily (`import grpo_pilot.planner` or a one-worker run never imports it).

- Local start (no address): `ray.init` with as many logical CPUs as the plan has workers (at least
  the machine's cores, so `4xcpu` runs on a 2-core laptop: CPU workers then share cores) and the
  machine's GPUs; no dashboard; Ray's own logging at ERROR and the workers' stdout/stderr not
  forwarded (the run's errors come back as exceptions, not as log lines).
- `--address auto` or `HOST:PORT`: join a cluster started with `ray start` (docs/run.md).
- Resources are checked before anything is placed: a cluster with fewer GPUs (or CPUs) than the plan
  has workers is refused with what it has and what the plan needs; so is a GPU node layout that
  cannot hold the plan's nodes (its GPUs per node).
- Bundles: `{"GPU": 1, "CPU": 1}` per GPU worker, `{"CPU": 1}` per CPU worker, strategy PACK
  (the plan's GPUs per node fill a node before the next); the placement group must be ready within
  `PLACEMENT_TIMEOUT_S`, else the run is refused with the cluster's free resources.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from grpo_pilot.engine.topology import Topology
from grpo_pilot.errors import InputError

PLACEMENT_TIMEOUT_S = 120.0
QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
# passed to every worker: offline hub, quiet tokenizers, and the driver's import path (source checkouts)
FORWARDED_ENV = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    "PYTHONPATH",
    "VLLM_CPU_KVCACHE_SPACE",
)


@dataclass
class RayConnection:
    """A Ray session for one run; `started` = this run started the cluster (and stops it)."""

    started: bool
    address: str
    resources: dict[str, float] = field(default_factory=dict)
    placement_group: Any = None

    def close(self) -> None:
        import ray

        if self.placement_group is not None:
            try:
                ray.util.remove_placement_group(self.placement_group)
            except Exception:  # the cluster may already be gone; nothing left to free then
                logging.getLogger(__name__).debug("placement group removal failed", exc_info=True)
            self.placement_group = None
        if self.started and ray.is_initialized():
            ray.shutdown()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise InputError(
            "This plan needs several workers, and they run on Ray, which is not installed.",
            "Install it with `pip install -c constraints.txt -e '.[ray]'` (or `pip install 'ray[default]'`).",
        ) from exc
    return ray


def connect(address: str | None, topology: Topology, device_kind: str) -> RayConnection:
    """Join `address` (or the cluster this process is already connected to) or start a local one; check resources."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    ray = _import_ray()
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False, configure_logging=True)
    if ray.is_initialized():
        conn = RayConnection(started=False, address="(this process's Ray session)")
    elif address:
        _probe(address)
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise InputError(
                f"Cannot join the Ray cluster at '{address}' ({exc}).",
                "Start it with `ray start --head` (docs/run.md), or leave --address out to start a local one.",
            ) from None
        conn = RayConnection(started=False, address=address)
    else:
        cpus = max(os.cpu_count() or 1, topology.num_workers)
        gpus = _local_gpus()
        ray.init(num_cpus=cpus, num_gpus=gpus, include_dashboard=False, **quiet)
        conn = RayConnection(started=True, address="local")
    conn.resources = dict(ray.cluster_resources())
    try:
        check_resources(conn.resources, _gpus_per_node(ray), topology, device_kind)
    except InputError:
        conn.close()  # shuts down only a cluster this run started
        raise
    return conn


def _probe(address: str) -> None:
    """A HOST:PORT nothing answers on is refused at once (Ray itself would retry for minutes)."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "ray://...": Ray resolves those itself
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise InputError(
            f"Cannot join the Ray cluster at '{address}' (nothing answers there: {exc}).",
            "Start it with `ray start --head` (docs/run.md), or leave --address out to start a local one.",
        ) from None


# The catalogue holds the total the driver reports (hardware/gpus.py `memory_bytes`), which is what torch's
# total_memory (cudaGetDeviceProperties totalGlobalMem) gives too; 5 % slack for driver and board variants.
GPU_MEMORY_MATCH = 0.95


def in_ray_session() -> bool:
    """Whether this process is already connected to a Ray cluster (which may span other machines); never
    imports Ray itself."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def local_gpus() -> list[tuple[str, int]]:
    """(name, total bytes) of every GPU torch can see here."""
    try:
        import torch

        return [
            (torch.cuda.get_device_name(i), int(torch.cuda.get_device_properties(i).total_memory))
            for i in range(torch.cuda.device_count())
        ]
    except (ImportError, RuntimeError):
        return []


def _local_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def _gpus_per_node(ray: Any) -> list[int]:
    return sorted((int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive")), reverse=True)


def check_local_gpus(
    topology: Topology, device_kind: str, *, plan_gpu: str, plan_gpu_bytes: int, local: list[tuple[str, int]]
) -> None:
    """Before any cluster starts (pure): a GPU plan with several workers run on this machine alone (no
    --address) needs as many GPUs, and every GPU it uses at least the plan's GPU memory; `local` = (name,
    total bytes) per GPU. Too few GPUs are refused in a second, not after Ray has started (issue 16); a
    one-worker plan on a machine without GPUs runs on its CPU, as before."""
    if device_kind != "cuda":
        return
    need = topology.num_workers
    if need > 1 and len(local) < need:
        raise InputError(
            f"The plan runs {need} GPU worker(s) ({topology.num_nodes} node(s) × {topology.workers_per_node} "
            f"{plan_gpu}); this machine has {len(local)} GPU(s) that torch can see.",
            "Run it where the GPUs are (several nodes: `ray start` on each, then --address auto), or re-plan for "
            "this machine (grpo-plan --gpus ...), or use --device cpu to run the same workers on CPUs.",
        )
    small = [(i, name, size) for i, (name, size) in enumerate(local[:need]) if size < GPU_MEMORY_MATCH * plan_gpu_bytes]
    if small:
        i, name, size = small[0]
        raise InputError(
            f"The plan was made for {plan_gpu} ({plan_gpu_bytes / 2**30:.0f} GiB each); GPU {i} here is {name} "
            f"with {size / 2**30:.1f} GiB: its memory predictions do not hold on it.",
            "Re-plan for this machine's GPUs (grpo-plan --gpus ...).",
        )


def check_resources(
    resources: dict[str, float], gpus_per_node: list[int], topology: Topology, device_kind: str
) -> None:
    """Refuse, before placing anything, a cluster that cannot hold the plan's workers (pure)."""
    need = topology.num_workers
    if device_kind == "cuda":
        have = int(resources.get("GPU", 0))
        if have < need:
            raise InputError(
                f"The Ray cluster has {have} GPU(s); the plan needs {need} ({topology.num_nodes} node(s) × "
                f"{topology.workers_per_node}).",
                "Add nodes (`ray start --address ...` on each), or re-plan for the GPUs you have "
                "(grpo-plan --gpus ...).",
            )
        fitting = sum(n // topology.workers_per_node for n in gpus_per_node)
        if gpus_per_node and fitting < topology.num_nodes:
            raise InputError(
                f"The plan puts {topology.workers_per_node} GPU workers on each of {topology.num_nodes} node(s); "
                f"the cluster's nodes have {', '.join(str(n) for n in gpus_per_node)} GPU(s).",
                "Re-plan with the cluster's GPUs per node (e.g. --gpus NODESxGPUSxNAME).",
            )
        return
    have = int(resources.get("CPU", 0))
    if have < need:
        raise InputError(
            f"The Ray cluster has {have} CPU(s); the plan needs {need} CPU workers.",
            "Start Ray with more CPUs (`ray start --num-cpus N`), or re-plan with fewer (grpo-plan --gpus Nxcpu).",
        )


def worker_env() -> dict[str, str]:
    return {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}


def place_workers(conn: RayConnection, setup: Any, worker_class: type, device_kind: str) -> list[Any]:
    """One Ray actor per worker in a PACK placement group, bundle i = worker i (refused if it cannot be placed).

    `device_kind` "cuda": a GPU per worker (a GPU plan, unless the run config says device = cpu)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    topo = setup.topology
    bundle = {"GPU": 1, "CPU": 1} if device_kind == "cuda" else {"CPU": 1}
    pg = placement_group([dict(bundle) for _ in topo.workers], strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise InputError(
            f"Ray could not place {topo.num_workers} workers of {bundle} within {PLACEMENT_TIMEOUT_S:.0f} s; "
            f"the cluster has {conn.resources} in all and {ray.available_resources()} free.",
            "Free the cluster (other jobs hold resources) or re-plan for what it has.",
        )
    conn.placement_group = pg
    remote = ray.remote(worker_class)
    env = worker_env()
    if setup.threads is not None:
        env["OMP_NUM_THREADS"] = str(setup.threads)
    return [
        remote.options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i),
            runtime_env={"env_vars": env},
            max_restarts=0,
            max_task_retries=0,
        ).remote(setup, i)
        for i in range(topo.num_workers)
    ]
