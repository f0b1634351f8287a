"""`grpo-run`'s end-of-run table: measured vs predicted time and memory per phase (from a `RunProfile`)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

GIB = float(1 << 30)
MIB = float(1 << 20)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.0f}%"


def _bytes(value: int | None) -> str:
    if value is None:
        return "—"
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / MIB:.1f} MiB"


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}s"


def summary_table(profile: Any) -> Table:
    """End-of-run table: measured vs predicted time and peak memory per phase (from a `RunProfile`).

    Memory is compared like with like — tracked tensor bytes with the plan's tensor items, or process RSS
    with the plan's phase total — and not at all when the plan describes another setup (`memory_compared`
    False: e.g. another rollout backend): the plan and error columns then stay empty and the caption says
    why (a LoRA run on a plan that does not model adapters keeps the plan's full-fine-tune figures, no error).
    On CPU with the tensor tracker, the process's peak RSS is shown beside it (allocated tensor bytes
    can exceed what is resident: an engine may reserve memory it never touches)."""
    tensors = any(row.measured_peak_bytes is not None for row in profile.phases.values())
    compared = getattr(profile, "memory_compared", True)
    with_rss = tensors and any(row.measured_rss_peak_bytes is not None for row in profile.phases.values())
    memory = (
        f"{profile.memory_source} vs the plan's tensor items"
        if tensors
        else f"{profile.rss_source} vs the plan's phase total"
    )
    if not compared:
        memory = (
            f"{profile.memory_source if tensors else profile.rss_source}, not compared: {profile.memory_not_compared}"
        )
    if with_rss:
        memory += f"; rss: {profile.rss_source}"
    table = Table(
        title=f"measured vs predicted on {profile.device}",
        caption=f"time: median of steps {_steps(profile.steps_measured)}; memory: {memory}",
    )
    # CUDA: the device footprint (allocator reserve + context etc.) beside the plan's phase total
    device = any(row.measured_device_peak_bytes is not None for row in profile.phases.values())
    table.add_column("phase", no_wrap=True)
    device_cols = ("device", "plan total", "err") if device else ()
    for col in ("time", "plan", "err", "peak mem", "plan", "err", *(("rss",) if with_rss else ()), *device_cols):
        table.add_column(col, justify="right", no_wrap=True)
    for name, row in profile.phases.items():
        mem = (
            (row.measured_peak_bytes, row.predicted_tensor_bytes, row.memory_rel_error)
            if tensors
            else (row.measured_rss_peak_bytes, row.predicted_total_bytes, row.rss_rel_error)
        )
        planned = (_bytes(mem[1]), _pct(mem[2])) if compared else ("—", "—")
        if getattr(profile, "plan_memory_full_ft", False):  # a LoRA run: the full fine-tune figure, not an error
            planned = (_bytes(mem[1]), "—")
        extra = (_bytes(row.measured_rss_peak_bytes),) if with_rss else ()
        dev = (
            (_bytes(row.measured_device_peak_bytes), _bytes(row.predicted_total_bytes), _pct(row.device_rel_error))
            if device
            else ()
        )
        table.add_row(
            name,
            _secs(row.measured_wall_s),
            _secs(row.predicted_wall_s),
            _pct(row.time_rel_error),
            _bytes(mem[0]),
            *planned,
            *extra,
            *dev,
        )
    s = profile.step
    blank = ("",) * (3 + (1 if with_rss else 0) + len(device_cols))
    table.add_row("step", _secs(s.measured_wall_s), _secs(s.predicted_wall_s), _pct(s.time_rel_error), *blank)
    return table


def _steps(steps: tuple[int, ...]) -> str:
    if not steps:
        return "—"
    return f"{steps[0]}–{steps[-1]}" if len(steps) > 1 else str(steps[0])
