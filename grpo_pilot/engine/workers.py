"""The driver's view of the workers: fan a step's work out, gather the results, name whoever failed.

    group = WorkerGroup.start(setup, address=None)   in-process for one worker, Ray actors otherwise
    group.sync_weights(); group.generate(rows, sampling); group.sleep_rollout()
    group.log_probs(samples, ref=...); group.update(samples, advantages, loss, old=..., ref=...)
    with group.phase(name): ...                      the driver's wall time of a phase (reward: its own work)
    group.begin_step(step); group.end_step() -> (per-worker phase samples, driver phase walls)
    group.save_state(dir) / group.load_state(dir); group.close()

One code path from 1 to N workers: a one-worker run (no `--address`) keeps its `Worker` in this
process and calls it directly (no Ray start-up cost; the tiny example and benchmarks/engine_cpu.py
run this way); more workers, or `--address`, run the same `Worker` class as Ray actors. The
splitting below is the same in both cases:
- rollout rows: contiguous, near-equal chunks, one per rollout replica (every member of a vLLM
  tensor-parallel replica gets the same chunk; the first member's completions are kept); replica r
  samples with `partition.replica_seed(seed, r)` (replica 0: the step's seed, as a one-worker run);
- log-prob and update samples: balanced by tokens over the training ranks; an update passes every
  rank the whole mini-batch's trained tokens and sequences as loss denominators (engine/actor.py),
  so the ranks compute the one-process update;
- weights: colocated, every worker gathers and loads its own engine (`Worker.sync_weights`); split,
  the training ranks publish buckets to the Ray object store and the rollout workers pull them.

Failures (Ray): a worker's own exception (out of memory, a crash) comes back as its cause and is
re-raised as is; a worker process that is gone (`RayActorError`: killed, segfault, lost node) becomes
`WorkerDiedError` naming the worker, the phase and the step. Either way every other worker is killed
at once (they may be blocked in a collective with the dead one) before the error propagates.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, Iterator

from grpo_pilot.engine.failures import CrashError, WorkerDiedError
from grpo_pilot.engine.partition import balance_by_tokens, contiguous_chunks, replica_seed
from grpo_pilot.engine.ray_cluster import connect, place_workers
from grpo_pilot.engine.topology import Topology
from grpo_pilot.engine.worker import Worker, WorkerInfo, WorkerSetup
from grpo_pilot.errors import GrpoPilotError


class WorkerGroup:
    """See the module docstring. `handles[i]` is worker i: a `Worker` (local) or a Ray actor handle."""

    def __init__(self, setup: WorkerSetup, handles: list[Any], *, local: bool, connection: Any = None) -> None:
        self.setup = setup
        self.topology: Topology = setup.topology
        self.handles = handles
        self.local = local
        self.connection = connection
        self.infos: list[WorkerInfo] = []
        self.step: int | None = None
        self.current_phase: str | None = None
        self.driver_walls: dict[str, float] = {}
        self._dead = False

    # -- start / stop --------------------------------------------------------------------------------
    @classmethod
    def start(cls, setup: WorkerSetup, *, address: str | None = None) -> "WorkerGroup":
        """Start every worker (process groups, models, engines); in-process when one worker and no address."""
        topo = setup.topology
        if topo.num_workers == 1 and not address:
            group = cls(setup, [Worker(setup, 0)], local=True)
            group.current_phase = "start"
            group.infos = [group.handles[0].start(None, None)]
            group.current_phase = None
            return group

        device_kind = "cpu" if setup.device == "cpu" else topo.device_kind  # a GPU plan needs GPU workers
        conn = connect(address, topo, device_kind)
        try:
            actors = place_workers(conn, setup, Worker, device_kind)
        except BaseException:
            conn.close()
            raise
        group = cls(setup, actors, local=False, connection=conn)
        group.current_phase = "start"
        try:
            train_master = rollout_master = None
            if topo.train_world > 1:
                train_master = group._call([topo.trainers[0].index], "address")[0]
            if topo.rollout_group:
                rollout_master = group._call([topo.rollout_workers[0].index], "address")[0]
            everyone = list(range(topo.num_workers))
            group.infos = group._call(everyone, "start", *[(train_master, rollout_master)] * len(everyone))
        except BaseException:
            group.close()
            raise
        group.current_phase = None
        return group

    def close(self) -> None:
        """Close every engine (best effort), then end the worker processes and our Ray session."""
        if self.local:
            self.handles[0].close()
            return
        import ray

        if not self._dead:
            # closing the engines is best effort: the processes are ended below either way
            with contextlib.suppress(Exception):
                ray.get([h.close.remote() for h in self.handles], timeout=60)
        for h in self.handles:
            with contextlib.suppress(Exception):
                ray.kill(h, no_restart=True)
        if self.connection is not None:
            self.connection.close()

    # -- calls ---------------------------------------------------------------------------------------
    def _call(self, indices: Sequence[int], method: str, *args_per_worker: Any) -> list[Any]:
        """`method(*args)` on workers `indices` (one args tuple each, or none), concurrently; results in order."""
        args = list(args_per_worker) if args_per_worker else [()] * len(indices)
        if self.local:
            return [getattr(self.handles[i], method)(*a) for i, a in zip(indices, args)]
        refs = [getattr(self.handles[i], method).remote(*a) for i, a in zip(indices, args)]
        return self._gather(refs, list(indices))

    def _gather(self, refs: list[Any], indices: list[int]) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        position = {ref: k for k, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            k = position[ready[0]]
            label = self.topology.workers[indices[k]].label
            where = dict(worker=label, phase=self.current_phase, step=self.step)
            try:
                results[k] = ray.get(ready[0])
            except RayActorError as exc:
                self._abort()
                raise WorkerDiedError(
                    f"{label} died during the {self.current_phase} phase of step {self.step} ({death_cause(exc)}).",
                    "The other workers were stopped. `grpo-run ... --resume` continues from the last checkpoint.",
                    **where,
                ) from None
            except RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                self._abort()
                if isinstance(cause, GrpoPilotError):
                    raise cause from None
                raise CrashError(
                    f"{label} failed in the {self.current_phase} phase of step {self.step}: {cause!r}",
                    "This is a bug or an environment problem; the message above names the failing call.",
                    **where,
                ) from None
        return results

    def _abort(self) -> None:
        """Kill every worker now: survivors may be blocked in a collective with the failed one."""
        import ray

        self._dead = True
        for h in self.handles:
            with contextlib.suppress(Exception):
                ray.kill(h, no_restart=True)

    # -- phases --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str, *, driver_work: bool = False) -> Iterator[None]:
        """Time `name` on the driver; `driver_work` (reward): also profile it in the local worker's profiler.
        An exception leaves `current_phase` set: the failure record names the phase it happened in."""
        self.current_phase = name
        t0 = time.perf_counter()
        if driver_work and self.local:
            with self.handles[0].profiler.phase(name):
                yield
        else:
            yield
        self.driver_walls[name] = self.driver_walls.get(name, 0.0) + time.perf_counter() - t0
        self.current_phase = None

    def begin_step(self, step: int) -> None:
        self.step = step
        self.driver_walls = {}
        self._call(range(self.topology.num_workers), "begin_step", *[(step,)] * self.topology.num_workers)

    def end_step(self) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """Each worker's phase samples of the step (by worker index) and the driver's phase walls."""
        return self._call(range(self.topology.num_workers), "end_step"), dict(self.driver_walls)

    # -- the step's work -----------------------------------------------------------------------------
    def sync_weights(self) -> None:
        topo = self.topology
        if topo.placement == "colocated":
            self._call([w.index for w in topo.workers], "sync_weights")
            return
        refs = self._call([w.index for w in topo.trainers], "publish_weights")[0]
        pool = [w.index for w in topo.rollout_workers]
        self._call(pool, "receive_weights", *[(refs,)] * len(pool))

    def generate(self, prompt_ids: list[list[int]], sampling: Any) -> list[Any]:
        """Completions of `prompt_ids`, in order, from every rollout replica's chunk."""
        replicas = self.topology.replicas
        chunks = contiguous_chunks(len(prompt_ids), len(replicas))
        indices, args, leaders = [], [], []
        for r, (members, (start, stop)) in enumerate(zip(replicas, chunks)):
            if stop == start:
                continue
            part = sampling.model_copy(update={"seed": replica_seed(sampling.seed, r)})
            leaders.append(len(indices))
            for w in members:
                indices.append(w.index)
                args.append((prompt_ids[start:stop], part))
        results = self._call(indices, "generate", *args)
        return [gen for k in leaders for gen in results[k]]

    def sleep_rollout(self) -> None:
        self._call([w.index for w in self.topology.rollout_workers], "sleep_rollout")

    def _shares(self, lengths: list[int]) -> list[list[int]]:
        return balance_by_tokens(lengths, self.topology.train_world)

    def log_probs(self, samples: Sequence[Any], *, ref: bool = False) -> list[Any]:
        trainers = self.topology.trainers
        shares = self._shares([s.num_tokens for s in samples])
        results = self._call(
            [w.index for w in trainers], "log_probs", *[([samples[i] for i in idx], ref) for idx in shares]
        )
        out: list[Any] = [None] * len(samples)
        for idx, lps in zip(shares, results):
            for i, lp in zip(idx, lps):
                out[i] = lp
        return out

    def update(
        self,
        samples: Sequence[Any],
        advantages: Any,
        loss: Any,
        *,
        old: Sequence[Any] | None = None,
        ref: Sequence[Any] | None = None,
    ) -> dict[str, float]:
        """One optimizer step over a mini-batch split across the training ranks; the mini-batch's metrics."""
        trainers = self.topology.trainers
        shares = self._shares([s.num_tokens for s in samples])
        trained_tokens = sum(len(s.response_ids) for s in samples if not (loss.mask_truncated and s.truncated))
        args = []
        for idx in shares:
            kwargs = dict(
                old_logprobs=[old[i] for i in idx] if old is not None else None,
                ref_logprobs=[ref[i] for i in idx] if ref is not None else None,
                global_num_tokens=trained_tokens,
                global_num_seqs=len(samples),
            )
            args.append(([samples[i] for i in idx], advantages[idx], loss, kwargs))
        results = self._call([w.index for w in trainers], "update", *args)
        return results[0]

    def shared_forwards(self) -> int:
        return sum(self._call([w.index for w in self.topology.trainers], "shared_forwards"))

    # -- checkpoints ---------------------------------------------------------------------------------
    def save_state(self, directory: str) -> None:
        self.current_phase = "checkpoint"
        self._call(range(self.topology.num_workers), "save_state", *[(directory,)] * self.topology.num_workers)
        self.current_phase = None

    def load_state(self, directory: str) -> None:
        self.current_phase = "checkpoint"
        self._call(range(self.topology.num_workers), "load_state", *[(directory,)] * self.topology.num_workers)
        self.current_phase = None


def death_cause(exc: BaseException) -> str:
    """A short cause from Ray's actor-death message: pid, host and exit type, when it says them (Ray lists
    possible reasons — a signal, the OOM killer, a lost node — but cannot tell which one it was)."""
    import re

    text = str(exc)
    parts = []
    pid, ip = re.search(r"\bpid: (\d+)", text), re.search(r"\bip: ([\w.:-]+)", text)
    if pid:
        parts.append(f"process {pid.group(1)}" + (f" on {ip.group(1)}" if ip else ""))
    kind = re.search(r"Worker exit type: (\w+)", text)
    if kind:
        parts.append(f"exit type {kind.group(1)}")
    first = text.strip().splitlines()[0].strip() if text.strip() else type(exc).__name__
    return "; ".join(parts) if parts else first
