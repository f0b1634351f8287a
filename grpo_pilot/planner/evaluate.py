"""Evaluate one knob configuration: memory + time + constraints → a verdict, and a `Plan`.

`PlanInputs` is everything the user fixed (model, cluster, workload, executor, safety headroom);
`assess(inputs, knobs)` is the search's inner loop (no `Plan` built); `make_plan.py` turns an
assessment into the frozen `Plan` that plan.json stores (`to_plan`, `evaluate`).

Usable GPU memory = device memory − headroom. The memory estimate already itemises the CUDA context,
NCCL buffers and allocator fragmentation of what fragments; the headroom covers what it cannot see:
driver/ECC reservations that vary by driver version, monitoring agents on the GPU, and the estimate's
own error (the traced cross-check agrees to a few percent on tensor bytes). It is `--headroom-gib`
when given, else 5% of the device (4 GiB on an 80 GB GPU); the search never plans into it.

The verdict is judged at the memory quantile of the workload's lengths (`lengths.py`); the plan also
records the worst case — every prompt and response at its maximum — and whether that would fit.
"""

from __future__ import annotations

from typing import Callable

from pydantic import Field

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import Knobs, Target, Workload
from grpo_pilot.planner.constraints import Check, memory_checks, structural_checks
from grpo_pilot.planner.estimate import estimate_memory, rollout_kv_budget_bytes
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads
from grpo_pilot.planner.plan import ModelRef, Provenance
from grpo_pilot.planner.reports import MemoryReport, TimeReport
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS, TimeCoefficients
from grpo_pilot.planner.timing import estimate_time
from grpo_pilot.profiles.catalog import ResolvedModel

DEFAULT_HEADROOM_FRACTION = 0.05


def model_ref(resolved: ResolvedModel) -> ModelRef:
    """The plan's record of the model: what was asked for and what it resolved to."""
    return ModelRef(
        requested=resolved.requested, resolved=resolved.resolved, hub_id=resolved.hub_id, spec=resolved.spec
    )


class PlanInputs(Frozen):
    """What the user fixed; the search never changes any of it."""

    model: ModelRef = Field(description="The model as requested and resolved.")
    cluster: Cluster
    workload: Workload = Field(default_factory=Workload)
    target: Target = Field(default="grpo-pilot", description="Executor whose choices the estimate models.")
    headroom_fraction: float = Field(
        default=DEFAULT_HEADROOM_FRACTION, ge=0.0, lt=1.0, description="Share of device memory kept free."
    )
    headroom_bytes: int | None = Field(
        default=None, ge=0, description="Bytes of device memory kept free (overrides headroom_fraction when set)."
    )
    overheads: Overheads = Field(
        default=DEFAULT_OVERHEADS, description="Named memory constants (analytic defaults or a calibration)."
    )
    time_coefficients: TimeCoefficients = Field(
        default=DEFAULT_TIME_COEFFICIENTS,
        description="Efficiencies and rates of the step-time model (analytic defaults or a calibration).",
    )
    calibration: str | None = Field(
        default=None,
        description="Name of the calibration the overheads and time coefficients come from (None = analytic).",
    )
    calibration_file: str | None = Field(default=None, description="The calibration file it was read from.")
    calibration_versions: tuple[tuple[str, str | None], ...] = Field(
        default=(), description="Software versions the calibration was measured with (pairs: hashable)."
    )
    calibration_skipped: str | None = Field(
        default=None, description="Why the default calibration file was not applied (None: none was skipped)."
    )

    def provenance(self, **search: int | None) -> Provenance:
        """The plan's provenance: the calibration applied (if any), where each constant comes from, and
        the search's counters."""
        return Provenance(
            calibration=self.calibration,
            calibration_file=self.calibration_file,
            calibration_versions=dict(self.calibration_versions) if self.calibration else None,
            calibration_skipped=self.calibration_skipped,
            constant_sources=self.constant_sources(),
            **search,  # type: ignore[arg-type]
        )

    def constant_sources(self) -> dict[str, str]:
        """Where each time constant and the CUDA context come from: 'measured (<calibration>)' for what the
        applied calibration changed, 'scaled (MAMF table)' for the per-GPU matmul efficiency of a measured
        GPU, 'analytic' (the documented default with its source) for the rest."""
        coef, gpu = self.time_coefficients, self.cluster.gpu.name
        sources = {name: "analytic" for name in TimeCoefficients.model_fields}
        if any(name == gpu for name, _ in coef.matmul_efficiency_by_gpu):
            sources["matmul_efficiency_by_gpu"] = "scaled (MAMF table)"
        sources["cuda_context_bytes"] = "analytic"
        if self.calibration is None:
            return sources
        for name in TimeCoefficients.model_fields:
            if getattr(coef, name) != getattr(DEFAULT_TIME_COEFFICIENTS, name):
                sources[name] = f"measured ({self.calibration})"
        if self.overheads.cuda_context_bytes != DEFAULT_OVERHEADS.cuda_context_bytes:
            sources["cuda_context_bytes"] = f"measured ({self.calibration})"
        return sources

    @property
    def device_bytes(self) -> int:
        """Memory of one device (on the cpu pseudo-device: one worker's share of the host RAM)."""
        return self.cluster.device_memory_bytes

    @property
    def reserved_bytes(self) -> int:
        """The safety headroom kept free on every device."""
        if self.headroom_bytes is not None:
            return self.headroom_bytes
        return self.device_bytes - int(self.device_bytes * (1.0 - self.headroom_fraction))

    @property
    def usable_gpu_bytes(self) -> int:
        return max(1, self.device_bytes - self.reserved_bytes)


class Assessment(Frozen):
    """One configuration evaluated: its memory, time and every rule's check."""

    knobs: Knobs
    memory: MemoryReport
    time: TimeReport
    checks: tuple[Check, ...]

    @property
    def fits(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def total_excess(self) -> float:
        """Sum of positive excesses: how far from feasible (0 when it fits)."""
        return sum(max(0.0, c.excess) for c in self.checks)


def cheap_checks(inputs: PlanInputs, knobs: Knobs) -> tuple[Check, ...]:
    """Rules that need no memory estimate (used to prune search trials)."""
    return structural_checks(inputs.model.spec, inputs.cluster, inputs.workload, knobs, target=inputs.target)


def assess(inputs: PlanInputs, knobs: Knobs, structural: tuple[Check, ...] | None = None) -> Assessment:
    """Memory estimate → rollout concurrency → time estimate → all checks."""
    spec, cluster, workload = inputs.model.spec, inputs.cluster, inputs.workload
    memory = estimate_memory(spec, cluster, workload, knobs, target=inputs.target, overheads=inputs.overheads)
    time = estimate_time(
        spec,
        cluster,
        workload,
        knobs,
        target=inputs.target,
        kv_cache_tokens_per_gpu=memory.kv_cache_tokens_per_gpu,
        coefficients=inputs.time_coefficients,
        overheads=inputs.overheads,
    )
    kv_short = knobs.rollout_backend != "hf" and memory.kv_cache_tokens_per_gpu < workload.seq_len_tokens
    kv_budget = (
        rollout_kv_budget_bytes(spec, cluster, workload, knobs, target=inputs.target, overheads=inputs.overheads)
        if kv_short
        else None
    )
    checks = (structural if structural is not None else cheap_checks(inputs, knobs)) + memory_checks(
        memory,
        workload,
        knobs,
        usable_gpu_bytes=inputs.usable_gpu_bytes,
        host_ram_bytes=cluster.host_ram_bytes_per_node,
        kv_budget_bytes=kv_budget,
        device_bytes=inputs.device_bytes,
    )
    # the search's inner loop: every field computed here, so no validation (pydantic at the edges only)
    return Assessment.model_construct(knobs=knobs, memory=memory, time=time, checks=checks)


def worst_case_memory(inputs: PlanInputs, knobs: Knobs) -> MemoryReport:
    """The memory estimate with every prompt and response at its maximum."""
    spec, workload = inputs.model.spec, inputs.workload.worst_case()
    return estimate_memory(spec, inputs.cluster, workload, knobs, target=inputs.target, overheads=inputs.overheads)


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest step in [lo, hi] that fits, `lo` known to fit (bisection: fitting is monotone in the step)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
