"""One worker: the actor (a training rank) and/or a rollout engine (a rollout replica member) on one device.

The same class runs in the driver's process for a one-worker run and as a Ray actor per GPU (per CPU
slot) otherwise (engine/workers.py); the driver calls the methods below in the same order either way:

    info = w.start(train_master, rollout_master)     process groups, model, rollout engine, actor
    w.begin_step(step)
    w.sync_weights()  |  w.publish_weights() → w.receive_weights(refs)     colocated | split
    w.generate(prompt_ids, sampling); w.sleep_rollout()
    w.log_probs(samples, ref=...); w.update(...)
    w.end_step() -> {phase: PhaseSample}
    w.save_state(dir) / w.load_state(dir); w.close()

Every call runs inside its phase of the worker's own profiler (engine/profiling.py) and turns an
out-of-memory (real, or over `memory_cap_bytes`) into `OutOfMemoryRunError` and any other exception
into `CrashError`, both naming the worker, phase and step (engine/failures.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import Field

from grpo_pilot.engine import dist_checkpoint
from grpo_pilot.engine.actor import Actor
from grpo_pilot.engine.device import pick_device
from grpo_pilot.engine.device_memory import apply_allocator, release_cache
from grpo_pilot.engine.failures import CrashError, OutOfMemoryRunError, is_out_of_memory
from grpo_pilot.engine.memory_history import SNAPSHOT_FILE, dump_history, start_history
from grpo_pilot.engine.model_factory import build_model, build_tokenizer
from grpo_pilot.engine.profiling import PhaseProfiler
from grpo_pilot.engine.qlora import load_quantized
from grpo_pilot.engine.rollout import build_rollout
from grpo_pilot.engine.settings import ActorSettings
from grpo_pilot.engine.topology import Topology, WorkerSpec
from grpo_pilot.engine.weight_sync import buckets, from_object_store, policy_weights, stream, to_host
from grpo_pilot.errors import GrpoPilotError, InputError
from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import AllocatorSetting, ReleasePolicy


class RolloutSettings(Frozen):
    """The rollout engine of a run (engine/rollout `build_rollout` keywords)."""

    backend: Literal["hf", "vllm"]
    max_model_len: int = Field(ge=2)
    gpu_memory_utilization: float = Field(gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int = Field(default=8192, ge=1)
    enforce_eager: bool = True
    kv_cache_bytes: int | None = Field(default=None, ge=1)
    seed: int = 0
    hf_decode: Literal["auto", "eager", "static", "cuda_graph"] = "auto"
    weight_sync_bucket_bytes: int = Field(
        default=2 << 30, ge=1, description="Transfer bucket of the weight sync (the plan's `execution`)."
    )


class WorkerSetup(Frozen):
    """Everything a worker needs to build itself (sent to every worker; plain data)."""

    model_source: str = Field(description="Model directory, config.json or bundled alias (model_factory).")
    vocab_size: int | None = Field(
        default=None, description="Vocabulary override (a random model fitted to the tokenizer)."
    )
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads of the worker.")
    cpu_memory: Literal["tensors", "rss"] = "tensors"
    memory_cap_bytes: int | None = Field(default=None, ge=1)
    allocator: AllocatorSetting = "expandable"
    release_cache: ReleasePolicy = "verl"
    memory_history: bool = False
    actor: ActorSettings
    rollout: RolloutSettings
    topology: Topology
    workdir: str = Field(description="Scratch directory; worker i uses <workdir>/worker-i.")


class WorkerInfo(Frozen):
    """What the driver reports about a started worker (workers.json)."""

    index: int
    label: str
    role: str
    pid: int
    host: str
    device: str
    threads: int
    train_rank: int | None = None
    rollout_rank: int | None = None
    memory_source: str = Field(description="Where its measured peaks come from (engine/profiling.py).")
    rss_source: str | None = None
    alloc_conf: str | None = Field(default=None, description="PYTORCH_CUDA_ALLOC_CONF in effect in its process.")
    rollout_weight_copy_bytes: int = Field(default=0, ge=0, description="Its hf rollout's bf16 weight copy.")
    rollout_replica_bytes: int = Field(
        default=0, ge=0, description="Its hf rollout's replica of the model (parameter bytes; 0: on the policy)."
    )
    adapter_params: int = Field(default=0, ge=0, description="Trainable adapter parameters of its policy (0: none).")
    adapter_bytes: int = Field(default=0, ge=0, description="Their bytes (whole, not this rank's shard).")


def free_address() -> tuple[str, int]:
    """This node's address and a free TCP port (a group's rendezvous, asked of its rank 0).

    Inside a Ray worker the address is the one Ray reaches the node by (`get_node_ip_address`); the
    hostname's own resolution can be a loopback address (127.0.1.1 on Debian) other nodes cannot use.
    """
    host = socket.gethostbyname(socket.gethostname())
    with contextlib.suppress(ImportError):
        import ray

        if ray.is_initialized():
            host = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return host, port


class Worker:
    """See the module docstring."""

    def __init__(self, setup: WorkerSetup, index: int) -> None:
        self.setup = setup
        self.spec: WorkerSpec = setup.topology.workers[index]
        self.step: int | None = None
        self.phase_name: str | None = None
        self.actor: Any = None
        self.rollout: Any = None
        self.profiler: Any = None
        self.device: Any = None
        self.history = False  # recording the allocator's history (engine/memory_history.py)

    # -- start-up ------------------------------------------------------------------------------------
    def address(self) -> tuple[str, int]:
        return free_address()

    def start(
        self, train_master: tuple[str, int] | None = None, rollout_master: tuple[str, int] | None = None
    ) -> WorkerInfo:
        with self._located("start"):
            return self._start(train_master, rollout_master)

    def _start(self, train_master: tuple[str, int] | None, rollout_master: tuple[str, int] | None) -> WorkerInfo:
        import numpy as np
        import torch

        st, spec, topo = self.setup, self.spec, self.setup.topology
        if st.threads is not None:
            torch.set_num_threads(st.threads)
        self.device = pick_device(st.device)
        alloc_conf = apply_allocator(st.allocator, self.device)  # before this worker's first CUDA allocation
        self.history = st.memory_history and spec.index == 0 and start_history(self.device)
        if spec.trains and topo.train_world > 1:
            self._join_group(train_master, spec.train_rank or 0, topo.train_world)
        elif spec.rolls_out and topo.rollout_group:
            self._join_group(rollout_master, spec.rollout_rank or 0, len(topo.rollout_workers))
        random.seed(st.seed)
        np.random.seed(st.seed)
        torch.manual_seed(st.seed)
        tokenizer = build_tokenizer(st.model_source)
        policy = self._build_policy()
        if spec.rolls_out:
            self.rollout = self._build_rollout(policy, tokenizer)
        if spec.trains:
            self.actor = Actor(
                policy, device=self.device, settings=st.actor, world_size=topo.train_world, rank=spec.train_rank or 0
            )
        adapters = self.actor.trainable_parameters() if self.actor is not None and self.actor.peft is not None else []
        self.profiler = PhaseProfiler(str(self.device), cpu_memory=st.cpu_memory, memory_cap_bytes=st.memory_cap_bytes)
        self.profiler.start()
        return WorkerInfo(
            index=spec.index,
            label=spec.label,
            role=spec.role,
            pid=os.getpid(),
            host=socket.gethostname(),
            device=str(self.device),
            threads=torch.get_num_threads(),
            train_rank=spec.train_rank,
            rollout_rank=spec.rollout_rank,
            memory_source=self.profiler.memory_source,
            rss_source=self.profiler.rss_source,
            alloc_conf=alloc_conf,
            rollout_weight_copy_bytes=self.rollout.weight_copy_bytes(self.device)
            if hasattr(self.rollout, "weight_copy_bytes")
            else 0,
            rollout_replica_bytes=self.rollout.replica_bytes() if hasattr(self.rollout, "replica_bytes") else 0,
            adapter_params=sum(p.numel() for p in adapters),
            adapter_bytes=sum(p.numel() * p.element_size() for p in adapters),
        )

    def _build_policy(self) -> Any:
        """This worker's model: the plan's base, loaded 8/4-bit for a QLoRA trainer (engine/qlora.py, CUDA only)."""

        st, adapter = self.setup, self.setup.actor.adapter
        if self.spec.trains and adapter is not None and adapter.base_quantization is not None:
            return load_quantized(
                st.model_source,
                adapter,
                seed=st.seed,
                vocab_size=st.vocab_size,
                gradient_checkpointing=st.actor.gradient_checkpointing,
            )
        return build_model(st.model_source, seed=st.seed, vocab_size=st.vocab_size)

    def _join_group(self, master: tuple[str, int] | None, rank: int, world: int) -> None:
        """This process's default torch.distributed group: gloo on CPU, NCCL on GPU (module sharding.py)."""
        import datetime

        import torch.distributed as dist

        assert master is not None, "a multi-rank group needs its rendezvous address"
        timeout = datetime.timedelta(minutes=10)
        store = dist.TCPStore(master[0], master[1], world, rank == 0, timeout=timeout)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)

    def _build_rollout(self, policy: Any, tokenizer: Any) -> Any:
        """The rollout engine: on the policy itself (hf, one unsharded worker) or on its own copy of the weights."""
        import torch

        st, r = self.setup, self.setup.rollout
        on_policy = r.backend == "hf" and self.spec.trains and st.topology.train_world == 1 and not st.actor.offload
        model = policy
        if r.backend == "hf" and not on_policy:  # a replica the trainer's weights are copied into
            model = build_model(st.model_source, seed=st.seed, vocab_size=st.vocab_size)
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
            model = model.to(device=self.device, dtype=dtype).eval().requires_grad_(False)
        rollout = build_rollout(
            r.backend,
            model,
            tokenizer,
            max_model_len=r.max_model_len,
            gpu_memory_utilization=r.gpu_memory_utilization,
            tensor_parallel_size=r.tensor_parallel_size,
            max_num_seqs=r.max_num_seqs,
            max_num_batched_tokens=r.max_num_batched_tokens,
            enforce_eager=r.enforce_eager,
            kv_cache_bytes=r.kv_cache_bytes,
            seed=r.seed,
            workdir=Path(st.workdir) / f"worker-{self.spec.index}",
            hf_decode=r.hf_decode,
        )
        if r.backend == "hf":
            rollout.shares_policy = on_policy
        return rollout

    # -- error location ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _located(self, phase: str) -> Iterator[None]:
        """Errors raised inside name this worker, `phase` and the current step."""

        self.phase_name = phase
        where = dict(worker=self.spec.label, phase=phase, step=self.step)
        try:
            yield
        except GrpoPilotError as exc:
            if hasattr(exc, "worker") or isinstance(exc, InputError):
                raise
            raise CrashError(exc.message, exc.hint, **where) from exc
        except BaseException as exc:
            if is_out_of_memory(exc):
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise OutOfMemoryRunError(
                    f"Out of memory on {self.spec.label} in the {phase} phase of step {self.step} ({first}).",
                    "The plan underestimated this phase: re-plan with a larger --headroom-gib, or pin smaller token "
                    "budgets, offload or gradient checkpointing, and compare profile.json of a shorter run.",
                    **where,
                ) from None
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise CrashError(
                f"{self.spec.label} failed in the {phase} phase of step {self.step}: {type(exc).__name__}: {exc}",
                "This is a bug or an environment problem; the message above names the failing call.",
                **where,
            ) from exc
        finally:
            self.phase_name = None

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        with self._located(name), self.profiler.phase(name):
            yield

    # -- one step ------------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step = step
        self.profiler.begin_step()

    def end_step(self) -> dict[str, Any]:
        return self.profiler.end_step()

    def _release(self, point: str) -> None:
        """The run's cache-release policy at `point` (engine/device_memory.py)."""

        release_cache(self.setup.release_cache, point, self.device)

    def sync_weights(self) -> None:
        """Colocated: gather the trainer's weights bucket by bucket into this worker's own rollout engine (or,
        generating on the trainer's module, refresh the rollout's bf16 copy of it)."""

        self._release("before_weight_sync")  # before the phase: its peaks start from the released cache
        with self._phase("weight_sync"):
            self.rollout.wake()
            if not self.rollout.shares_policy:
                bucket = self.setup.rollout.weight_sync_bucket_bytes
                self.rollout.sync_weights(stream(buckets(policy_weights(self.actor.policy), bucket)))
            self._release("after_weight_sync")

    def publish_weights(self) -> list[Any]:
        """Split, on training ranks: take part in every gather; rank 0 puts each bucket into the object store."""
        import ray

        refs = []
        self._release("before_weight_sync")
        with self._phase("weight_sync"):
            for bucket in buckets(policy_weights(self.actor.policy), self.setup.rollout.weight_sync_bucket_bytes):
                if self.spec.train_rank == 0:
                    refs.append(ray.put(to_host(bucket)))
            self._release("after_weight_sync")
        return refs

    def receive_weights(self, refs: list[Any]) -> None:
        """Split, on rollout workers: load the published buckets one at a time."""

        self._release("before_weight_sync")
        with self._phase("weight_sync"):
            self.rollout.wake()
            self.rollout.sync_weights(stream(from_object_store(refs)))
            self._release("after_weight_sync")

    def generate(self, prompt_ids: list[list[int]], sampling: Any) -> list[Any]:
        with self._phase("rollout"):
            return self.rollout.generate(prompt_ids, sampling)

    def sleep_rollout(self) -> None:
        with self._phase("rollout"):
            self.rollout.sleep()
            self._release("after_rollout")

    def log_probs(self, samples: list[Any], ref: bool = False) -> list[Any]:
        with self._phase("log_prob"):
            out = self.actor.log_probs(samples, ref=ref)
            self._release("after_log_prob")
            return out

    def update(
        self, samples: list[Any], advantages: Any, loss: Any, options: dict[str, Any] | None = None
    ) -> dict[str, float]:
        """`Actor.update` on this rank's share; `options` = its keyword arguments (old/ref log-probs, denominators)."""
        with self._phase("update"):
            return self.actor.update(samples, advantages, loss, **(options or {}))

    def shared_forwards(self) -> int:
        return self.actor.shared_forwards if self.actor is not None else 0

    # -- checkpoints ---------------------------------------------------------------------------------
    def save_state(self, directory: str) -> None:
        """Training ranks write their shards (torch.distributed.checkpoint, collectively); every worker its RNG."""

        with self._located("checkpoint"):
            if self.actor is not None:
                dist_checkpoint.save_actor(self.actor, directory)
            dist_checkpoint.save_rng(directory, self.spec.index)

    def load_state(self, directory: str) -> None:

        with self._located("checkpoint"):
            if self.actor is not None:
                dist_checkpoint.load_actor(self.actor, directory)
            dist_checkpoint.load_rng(directory, self.spec.index)

    def close(self) -> None:
        """Stop the tracker and the rollout engine (vLLM tears the process group down with it)."""
        if self.profiler is not None:
            self.profiler.close()
        if self.history:
            self.history = False
            dump_history(Path(self.setup.workdir) / f"worker-{self.spec.index}" / SNAPSHOT_FILE)
        if self.rollout is not None:
            self.rollout.close()
        if self.actor is not None:
            self.actor.close()
