"""Per-phase wall time and peak memory of every step, and `profile.json` (measured beside predicted).

Phases: rollout, reward, log_prob, update, weight_sync (the plan predicts all but reward). A phase
entered several times in one step (DAPO refill rounds) sums its wall time and keeps the largest peak.

Peak memory, by device, always labelled with where it comes from:
- cuda: `torch.cuda.reset_peak_memory_stats()` at phase start, `torch.cuda.max_memory_allocated()` at
  the end — tensor bytes of this process (no CUDA context, NCCL or allocator slack); beside it the
  allocator's peak reserve (`max_memory_reserved`) and the device footprint (that reserve plus what the
  device holds outside the allocator, from `mem_get_info`: engine/device_memory.py), what nvidia-smi shows.
- cpu, "tensors": `LiveTensorBytes`, a `TorchDispatchMode` that sees every aten op's outputs and
  counts the bytes of each distinct live storage (freed storages are subtracted through weakref
  finalizers). It starts from every tensor alive when it is installed (a `gc` scan), so model
  weights, optimizer states and an in-process engine's buffers are included. Comparable to the plan's
  tensor items.
- cpu, always: process peak RSS of the phase (Linux `VmHWM` after resetting it through
  `/proc/self/clear_refs`; lifetime `ru_maxrss` where that file cannot be written) — includes the
  interpreter and libraries, so it is an upper bound, never compared with the plan's tensor bytes.

Every worker profiles its own phases (engine/worker.py); the driver times each phase end to end and
the reward phase, which it runs itself. profile.json's `phases` aggregate over workers (time: the
slowest worker's, or the driver's where no worker ran the phase; memory: the largest peak) and
`ranks` keeps each worker's own figures.

Memory cap (`memory_cap_bytes`, per worker): on CUDA `torch.cuda.set_per_process_memory_fraction`
makes the allocator fail past it; on CPU the tensor tracker raises `torch.OutOfMemoryError` as soon as
the live tensor bytes exceed it (the tracker is then on even with cpu_memory = "rss"). Either way
the worker turns it into an `OutOfMemoryRunError` naming itself, the phase and the step.
"""

from __future__ import annotations

import gc
import resource
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from pydantic import Field

from grpo_pilot.atomic import atomic_write_text
from grpo_pilot.engine.device_memory import AllocatorReport, cuda_phase_peaks
from grpo_pilot.models import Frozen
from grpo_pilot.planner.rules import RUN_PHASES

PEAK_FIELDS = ("peak_bytes", "rss_peak_bytes", "reserved_peak_bytes", "device_peak_bytes")  # maxima, never sums


class PhaseSample(Frozen):
    """One phase of one step."""

    wall_s: float
    peak_bytes: int | None = None
    rss_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None  # CUDA: torch.cuda.max_memory_reserved
    device_peak_bytes: int | None = None  # CUDA: the device footprint (engine/device_memory.py)


def _tensor_tracker_class() -> type:
    """Build the dispatch-mode class lazily (keeps torch out of module import)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    class LiveTensorBytes(TorchDispatchMode):
        """Live bytes of distinct CPU/GPU storages; `peak_bytes` since the last `reset_peak()`.

        With `cap_bytes`, an op whose outputs take the live bytes past it raises `torch.OutOfMemoryError`.
        """

        def __init__(self, cap_bytes: int | None = None) -> None:
            super().__init__()
            self.live_bytes = 0
            self.peak_bytes = 0
            self.cap_bytes = cap_bytes
            self._seen: Any = WeakIdKeyDictionary()

        def _free(self, nbytes: int) -> None:
            self.live_bytes -= nbytes

        def track(self, tensor: Any) -> None:
            # fake tensors (FakeTensorMode: a trace, torch.compile's or grpo-plan --verify's, left alive in the
            # process) hold no memory, and a symbolic one's nbytes is a SymInt that would turn every sum symbolic
            if tensor.device.type == "meta" or tensor.is_sparse or getattr(tensor, "fake_mode", None) is not None:
                return
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
                return
            if storage in self._seen:
                return
            nbytes = storage.nbytes()
            if type(nbytes) is not int:  # a symbolic size (a fake storage reached through a view)
                return
            self._seen[storage] = nbytes
            if nbytes:
                self.live_bytes += nbytes
                weakref.finalize(storage, self._free, nbytes)
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)

        def track_existing(self) -> None:
            """Count every tensor alive now (weights, optimizer states, engine buffers).

            `gc.get_objects()` skips objects in the permanent generation; vLLM `gc.freeze()`s the
            heap after start-up, so frozen objects are unfrozen for the scan and frozen again.
            """
            frozen = gc.get_freeze_count() > 0
            if frozen:
                gc.unfreeze()
            try:
                tensor_type = torch.Tensor
                for obj in gc.get_objects():
                    if issubclass(type(obj), tensor_type):  # type(), not isinstance(): no lazy-module __class__ hooks
                        self.track(obj)
            finally:
                if frozen:
                    gc.freeze()

        def reset_peak(self) -> None:
            self.peak_bytes = self.live_bytes

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for leaf in tree_flatten(out)[0]:
                if isinstance(leaf, torch.Tensor):
                    self.track(leaf)
            if self.cap_bytes is not None and self.live_bytes > self.cap_bytes:
                raise torch.OutOfMemoryError(
                    f"{self.live_bytes} bytes of live tensors exceed memory_cap_bytes = {self.cap_bytes} ({func})"
                )
            return out

    return LiveTensorBytes


class _Rss:
    """Peak resident set size of this process between `reset()` and `peak_bytes()`."""

    def __init__(self) -> None:
        self.resettable = self._clear()
        self.source = (
            "process peak RSS (VmHWM, reset per phase)"
            if self.resettable
            else "process peak RSS since start (ru_maxrss)"
        )

    @staticmethod
    def _clear() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")  # Linux >= 4.0: "5" resets the peak RSS (VmHWM) to the current RSS
            return True
        except OSError:
            return False

    def reset(self) -> None:
        if self.resettable:
            self._clear()

    def peak_bytes(self) -> int:
        hwm = self._vm_hwm_bytes() if self.resettable else None
        return (
            hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        )  # Linux reports KiB

    @staticmethod
    def _vm_hwm_bytes() -> int | None:
        try:
            with open("/proc/self/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None


class PhaseProfiler:
    """`with prof.phase("update"): ...` records wall time and peak memory into the current step.

    `device`: "cpu" or "cuda[:i]". `cpu_memory`: "tensors" (dispatch tracker + RSS) or "rss".
    Call `start()` once before the loop (installs the CPU tracker), `close()` at the end.
    """

    def __init__(self, device: str, *, cpu_memory: str = "tensors", memory_cap_bytes: int | None = None) -> None:
        self.device = device
        self.is_cuda = device.startswith("cuda")
        self.memory_cap_bytes = memory_cap_bytes
        self._tracker: Any = None
        self._rss = None if self.is_cuda else _Rss()
        self._want_tensors = (cpu_memory == "tensors" or memory_cap_bytes is not None) and not self.is_cuda
        self.current: dict[str, PhaseSample] = {}
        self.active: str | None = None  # the phase running now (for error messages)
        if self.is_cuda:
            self.memory_source = "torch.cuda.max_memory_allocated (reset per phase)"
        elif self._want_tensors:
            self.memory_source = "live tensor bytes (TorchDispatchMode tracker)"
        else:
            self.memory_source = self._rss.source if self._rss else ""
        self.rss_source = self._rss.source if self._rss else None

    def start(self) -> None:
        if self.is_cuda and self.memory_cap_bytes is not None:
            import torch

            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.memory_cap_bytes / total), self.device)
        if self._want_tensors and self._tracker is None:
            self._tracker = _tensor_tracker_class()(cap_bytes=self.memory_cap_bytes)
            self._tracker.track_existing()
            self._tracker.__enter__()

    def close(self) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            self._tracker = None

    def begin_step(self) -> None:
        self.current = {}

    def end_step(self) -> dict[str, PhaseSample]:
        done, self.current = self.current, {}
        return done

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        import torch

        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        if self._tracker is not None:
            self._tracker.reset_peak()
        if self._rss is not None:
            self._rss.reset()
        t0 = time.perf_counter()
        self.active = name
        try:
            yield
            self.active = None
        finally:
            if self.is_cuda:
                torch.cuda.synchronize(self.device)
            wall = time.perf_counter() - t0
            peak = reserved = footprint = None
            if self.is_cuda:
                peak, reserved, footprint = cuda_phase_peaks(self.device)
            elif self._tracker is not None:
                peak = int(self._tracker.peak_bytes)
            rss = self._rss.peak_bytes() if self._rss is not None else None
            self._record(
                name,
                PhaseSample(
                    wall_s=wall,
                    peak_bytes=peak,
                    rss_peak_bytes=rss,
                    reserved_peak_bytes=reserved,
                    device_peak_bytes=footprint,
                ),
            )

    def _record(self, name: str, sample: PhaseSample) -> None:
        old = self.current.get(name)
        if old is None:
            self.current[name] = sample
            return

        def top(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else max(a, b)

        self.current[name] = PhaseSample(
            wall_s=old.wall_s + sample.wall_s,
            **{key: top(getattr(old, key), getattr(sample, key)) for key in PEAK_FIELDS},
        )


def write_profile_json(path: str | Path, profile: Frozen) -> Path:

    return atomic_write_text(path, profile.model_dump_json(indent=2) + "\n")


# ---------------------------------------------------------------------------------------------------
# profile.json: measured (medians of later steps) beside the plan's prediction


class PhaseComparison(Frozen):
    """One phase: measured vs predicted. Relative error = measured / predicted − 1 (None when either is missing)."""

    measured_wall_s: float | None = None
    predicted_wall_s: float | None = None
    time_rel_error: float | None = None
    measured_peak_bytes: int | None = None
    predicted_tensor_bytes: int | None = None
    predicted_total_bytes: int | None = None
    memory_rel_error: float | None = None
    measured_rss_peak_bytes: int | None = None
    rss_rel_error: float | None = Field(
        default=None,
        description="Process peak RSS vs the plan's phase total (which carries the process overhead item).",
    )
    measured_reserved_peak_bytes: int | None = Field(
        default=None, description="CUDA: the caching allocator's peak reserve (torch.cuda.max_memory_reserved)."
    )
    measured_device_peak_bytes: int | None = Field(
        default=None,
        description="CUDA: the device footprint, the reserve plus the device memory outside the allocator "
        "(cudaMemGetInfo; what nvidia-smi shows).",
    )
    device_rel_error: float | None = Field(
        default=None, description="Device footprint vs the plan's phase total (overheads included)."
    )


class RankProfile(Frozen):
    """One worker's measured phases (medians of the same steps; peaks are maxima)."""

    worker: str = Field(description="As in workers.json and error messages, e.g. 'worker 1 (trainer+rollout)'.")
    device: str
    phases: dict[str, PhaseComparison] = Field(description="Only the measured fields; the phases it ran.")


class AdapterReport(Frozen):
    """A LoRA run's adapters, measured on its policy (engine/lora.py), and whether the plan modelled them."""

    setting: str = Field(description="The plan's workload.adapter, described (method, rank, targets).")
    trainable_params: int = Field(ge=0, description="Adapter parameters (the only ones AdamW updates).")
    trainable_bytes: int = Field(ge=0, description="Their bytes, whole (a sharded run's ranks each hold a share).")
    plan_models_adapters: bool = Field(
        description="False: the plan's figures are full fine-tuning's (engine/notes.py `adapters_modelled`)."
    )


class RunProfile(Frozen):
    """The content of profile.json."""

    schema_version: int = 1
    device: str
    memory_source: str = Field(
        description="Where measured_peak_bytes comes from (compared with the plan's tensor items)."
    )
    rss_source: str | None = Field(default=None, description="Where measured_rss_peak_bytes comes from (CPU only).")
    steps_run: int = Field(ge=0, description="Steps this process executed.")
    steps_measured: tuple[int, ...] = Field(
        description="Steps whose samples enter the medians (the first step of a process is warm-up)."
    )
    phases: dict[str, PhaseComparison]
    step: PhaseComparison = Field(description="Whole step: wall time vs plan.predicted_step_s.")
    measured_tokens_per_s: float | None = None
    predicted_tokens_per_s: float | None = None
    mean_response_tokens: float | None = Field(
        default=None, description="Measured; the plan assumes response_len_tokens for every response."
    )
    plan_response_len_tokens: int | None = None
    memory_compared: bool = Field(
        default=True,
        description="False when the plan's memory predictions are for another setup than this run's (e.g. another "
        "rollout backend): the *_rel_error of memory are then None, and memory_not_compared says why.",
    )
    memory_not_compared: str | None = Field(default=None, description="Why memory was not compared (or None).")
    plan_memory_full_ft: bool = Field(
        default=False,
        description="Memory is not compared because the plan's figures are full fine-tuning's and this run trains "
        "adapters: those figures are still shown beside the measured ones (grpo-run's table), with no error.",
    )
    num_workers: int = Field(default=1, ge=1, description="Worker processes (ranks) that ran the steps.")
    ranks: tuple[RankProfile, ...] = Field(
        default=(), description="Each worker's own phases (phases above: slowest time, largest peak over these)."
    )
    allocator: AllocatorReport | None = Field(
        default=None, description="The CUDA allocator setting and cache-release policy of the run."
    )
    rollout_weight_copy_bytes: int = Field(
        default=0,
        ge=0,
        description="The hf rollout's bf16 copy of the weights (CUDA), held from the weight sync to the end of the "
        "rollout and counted in those phases' measured peaks; the plan's phases do not include it.",
    )
    rollout_replica_bytes: int = Field(
        default=0,
        ge=0,
        description="The hf rollout's replica of the model on each rollout worker (parameter bytes; 0: it generates on "
        "the trainer's module), resident in every phase and counted in their measured peaks; the plan's "
        "`hf_replica_weights` item.",
    )
    adapter: AdapterReport | None = Field(default=None, description="LoRA / DoRA runs: the adapters (None: full FT).")
    notes: tuple[str, ...] = ()


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def _rel(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or predicted is None or predicted <= 0:
        return None
    return measured / predicted - 1.0


def aggregate_phases(
    worker_phases: list[dict[str, PhaseSample]], driver_walls: dict[str, float]
) -> dict[str, PhaseSample]:
    """One step over all workers: per phase the slowest worker's time (the driver's own where no worker
    ran the phase, e.g. reward) and the largest peaks (None when no worker measured one)."""

    def top(values: list[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    out: dict[str, PhaseSample] = {}
    for name in RUN_PHASES:
        ran = [w[name] for w in worker_phases if name in w]
        if not ran and name not in driver_walls:
            continue
        out[name] = PhaseSample(
            wall_s=max(x.wall_s for x in ran) if ran else driver_walls[name],
            **{key: top([getattr(x, key) for x in ran]) for key in PEAK_FIELDS},
        )
    return out


def _measured(samples: list[PhaseSample]) -> PhaseComparison:
    def top(key: str) -> int | None:
        known = [getattr(x, key) for x in samples if getattr(x, key) is not None]
        return max(known) if known else None

    return PhaseComparison(
        measured_wall_s=_median([x.wall_s for x in samples]),
        measured_peak_bytes=top("peak_bytes"),
        measured_rss_peak_bytes=top("rss_peak_bytes"),
        measured_reserved_peak_bytes=top("reserved_peak_bytes"),
        measured_device_peak_bytes=top("device_peak_bytes"),
    )


def rank_profile(worker: str, device: str, steps: list[dict[str, PhaseSample]]) -> RankProfile:
    """One worker's phases over its steps (the first one, warm-up, left out when there are more)."""
    measured = steps[1:] if len(steps) > 1 else steps
    phases = {
        name: _measured([s[name] for s in measured if name in s])
        for name in RUN_PHASES
        if any(name in s for s in measured)
    }
    return RankProfile(worker=worker, device=device, phases=phases)


def _memory_not_compared(
    plan: Any, rollout_backend: str | None, adapter: AdapterReport | None
) -> tuple[str | None, bool]:
    """Why the plan's memory is not this run's (None: it is), and whether that is because the plan's figures are
    full fine-tuning's while the run trains adapters (`RunProfile.plan_memory_full_ft`)."""
    planned = getattr(getattr(plan, "knobs", None), "rollout_backend", None)
    if rollout_backend is not None and planned is not None and rollout_backend != planned:
        return (
            f"the plan predicts the memory of its '{planned}' rollout, this run used '{rollout_backend}' (re-plan "
            f"with --pin rollout_backend={rollout_backend} to compare)"
        ), False
    if adapter is not None and not adapter.plan_models_adapters:
        return (
            f"the plan predicts full fine-tuning memory, this run trains adapters ({adapter.setting}): grpo-plan does "
            "not model adapters yet"
        ), True
    return None, False


def build_profile(
    plan: Any,
    steps: list[tuple[int, dict[str, PhaseSample], float, float]],
    *,
    device: str,
    memory_source: str,
    rss_source: str | None = None,
    mean_response_tokens: float | None = None,
    notes: tuple[str, ...] = (),
    ranks: tuple[RankProfile, ...] = (),
    rollout_backend: str | None = None,
    allocator: AllocatorReport | None = None,
    rollout_weight_copy_bytes: int = 0,
    rollout_replica_bytes: int = 0,
    adapter: AdapterReport | None = None,
) -> RunProfile:
    """Pure: `steps` = [(step, phase samples aggregated over workers, step wall s, trained tokens)] of this
    process, in order; `ranks` = each worker's own profile (`rank_profile`).

    Times are medians over every step but the first (warm-up: allocator growth, lazy init, first
    optimizer state); with a single step that step is used. Peaks are maxima over the same steps.
    Predicted bytes are the plan's phase items without `overhead_*` (tensor bytes, what the trackers see).
    `rollout_backend`: the run's; when it is not the plan's, the plan's memory items describe another engine
    (vLLM reserves a KV cache the hf decode loop never allocates, and the reverse), so no memory error is
    computed: the measured peaks are kept and `memory_not_compared` says why (like with like, or nothing).
    The same holds for an `adapter` run whose plan does not model adapters (its figures are full fine-tuning's).
    """
    not_compared, full_ft = _memory_not_compared(plan, rollout_backend, adapter)
    measured = steps[1:] if len(steps) > 1 else steps
    phases: dict[str, PhaseComparison] = {}
    for name in RUN_PHASES:
        got = _measured([s[1][name] for s in measured if name in s[1]])
        mem = plan.phases.get(name)
        pred_tensor = mem.tensor_bytes if mem is not None else None
        pred_wall = plan.phase_times_s.get(name)
        pred_total = mem.total_bytes if mem is not None else None
        phases[name] = got.model_copy(
            update={
                "predicted_wall_s": pred_wall,
                "time_rel_error": _rel(got.measured_wall_s, pred_wall),
                "predicted_tensor_bytes": pred_tensor,
                "predicted_total_bytes": pred_total,
                "memory_rel_error": None if not_compared else _rel(got.measured_peak_bytes, pred_tensor),
                "rss_rel_error": None if not_compared else _rel(got.measured_rss_peak_bytes, pred_total),
                "device_rel_error": None if not_compared else _rel(got.measured_device_peak_bytes, pred_total),
            }
        )
    step_wall = _median([s[2] for s in measured])
    tps = _median([s[3] / s[2] for s in measured if s[2] > 0])
    return RunProfile(
        device=device,
        memory_source=memory_source,
        rss_source=rss_source,
        steps_run=len(steps),
        steps_measured=tuple(s[0] for s in measured),
        phases=phases,
        step=PhaseComparison(
            measured_wall_s=step_wall,
            predicted_wall_s=plan.predicted_step_s,
            time_rel_error=_rel(step_wall, plan.predicted_step_s),
        ),
        measured_tokens_per_s=tps,
        predicted_tokens_per_s=plan.tokens_per_s,
        mean_response_tokens=mean_response_tokens,
        plan_response_len_tokens=plan.workload.response_len_tokens,
        memory_compared=not_compared is None,
        memory_not_compared=not_compared,
        plan_memory_full_ft=full_ft,
        num_workers=max(1, len(ranks)),
        ranks=ranks,
        allocator=allocator,
        rollout_weight_copy_bytes=rollout_weight_copy_bytes,
        rollout_replica_bytes=rollout_replica_bytes,
        adapter=adapter,
        notes=notes,
    )
