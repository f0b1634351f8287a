"""Profiling: per-phase tensor tracker, RSS, accumulation over repeated phases, profile.json building."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_pilot.engine.profiling import PhaseProfiler, PhaseSample, build_profile, write_profile_json
from grpo_pilot.planner.plan import load_plan

MIB = 1 << 20


def test_tensor_tracker_sees_phase_peak_including_tensors_alive_before():
    resident = torch.zeros(2 * MIB // 4)  # 2 MiB alive before the tracker starts
    prof = PhaseProfiler("cpu", cpu_memory="tensors")
    prof.start()
    try:
        prof.begin_step()
        with prof.phase("update"):
            tmp = torch.ones(4 * MIB // 4)  # 4 MiB transient
            del tmp
        with prof.phase("log_prob"):
            small = torch.ones(MIB // 4)
        samples = prof.end_step()
    finally:
        prof.close()
    assert resident.numel() > 0 and small.numel() > 0
    base_update = samples["update"].peak_bytes
    assert base_update >= 6 * MIB  # resident + transient
    # the 4 MiB transient was freed before log_prob: its peak is resident + 1 MiB, 4 MiB lower
    assert base_update - samples["log_prob"].peak_bytes == pytest.approx(3 * MIB, abs=64 * 1024)
    assert samples["update"].rss_peak_bytes > 0
    assert "tensor" in prof.memory_source


def test_tensor_tracker_ignores_fake_tensors_left_alive_by_a_trace():
    """A trace (FakeTensorMode, symbolic sizes: torch.compile, grpo-plan --verify) that leaves fake tensors alive
    in the process must not reach the tracker: they hold no memory, and a symbolic nbytes would turn its sums
    into SymInts."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
    symbolic = mode.from_tensor(torch.empty(4, 6), symbolic_context=dynamic, source=ConstantSource("x"))
    with mode:
        concrete = torch.empty(1000, 1000)
    assert type(symbolic.untyped_storage().nbytes()) is not int  # what the tracker would have summed
    prof = PhaseProfiler("cpu", cpu_memory="tensors")
    prof.start()
    try:
        before = prof._tracker.live_bytes
        prof.begin_step()
        with prof.phase("update"):
            tmp = torch.ones(MIB // 4)
            del tmp
        samples = prof.end_step()
    finally:
        prof.close()
    assert concrete.numel() == 10**6
    assert type(before) is int and type(samples["update"].peak_bytes) is int
    assert samples["update"].peak_bytes - before == pytest.approx(MIB, abs=64 * 1024)


def test_repeated_phase_sums_time_and_keeps_largest_peak():
    prof = PhaseProfiler("cpu", cpu_memory="rss")
    prof.begin_step()
    prof._record("rollout", PhaseSample(wall_s=1.0, peak_bytes=5, rss_peak_bytes=7))
    prof._record("rollout", PhaseSample(wall_s=0.5, peak_bytes=9, rss_peak_bytes=3))
    got = prof.end_step()["rollout"]
    assert (got.wall_s, got.peak_bytes, got.rss_peak_bytes) == (1.5, 9, 7)
    assert "RSS" in prof.memory_source


def test_build_profile_medians_skip_warmup_and_compare_with_plan(tmp_path):
    plan = load_plan("examples/tiny/plan.json")

    def step(i, update_s, peak):
        phases = {"update": PhaseSample(wall_s=update_s, peak_bytes=peak), "reward": PhaseSample(wall_s=0.01)}
        return (i, phases, update_s * 2, 1000.0)

    steps = [step(1, 9.0, 10**9), step(2, 0.1, 100), step(3, 0.3, 300), step(4, 0.2, 200)]
    prof = build_profile(plan, steps, device="cpu", memory_source="live tensor bytes")
    up = prof.phases["update"]
    assert prof.steps_measured == (2, 3, 4) and prof.steps_run == 4
    assert up.measured_wall_s == pytest.approx(0.2)  # warm-up step 1 (9 s) left out
    assert up.measured_peak_bytes == 300
    tensor_items = sum(v for k, v in plan.phases["update"].items.items() if not k.startswith("overhead_"))
    assert up.predicted_tensor_bytes == tensor_items and up.predicted_total_bytes == plan.phases["update"].total_bytes
    assert up.memory_rel_error == pytest.approx(300 / tensor_items - 1)
    assert up.time_rel_error == pytest.approx(0.2 / plan.phase_times_s["update"] - 1)
    assert prof.phases["reward"].predicted_wall_s is None and prof.phases["reward"].time_rel_error is None
    assert prof.step.measured_wall_s == pytest.approx(0.4)
    assert prof.measured_tokens_per_s == pytest.approx(1000.0 / 0.4)
    path = write_profile_json(tmp_path / "profile.json", prof)
    data = json.loads(path.read_text())
    assert set(data["phases"]) == {"weight_sync", "rollout", "reward", "log_prob", "update"}


def _render(table) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(table)
    return console.export_text()


def test_memory_of_another_rollout_backend_is_not_compared():
    """An hf plan run with --backend vllm: vLLM's reserved KV cache against the hf plan's items would read
    '+19429 %'; the profile keeps the measured peaks and says why nothing is compared."""
    from grpo_pilot.cli.run_render import summary_table

    plan = load_plan("examples/tiny/plan.json")
    assert plan.knobs.rollout_backend == "hf"
    phases = {
        "rollout": PhaseSample(wall_s=0.1, peak_bytes=1_560_000_000, rss_peak_bytes=900 * MIB),
        "update": PhaseSample(wall_s=0.2, peak_bytes=30 * MIB, rss_peak_bytes=950 * MIB),
    }
    steps = [(1, phases, 1.0, 100.0), (2, phases, 1.0, 100.0)]
    other = build_profile(plan, steps, device="cpu", memory_source="live tensor bytes", rollout_backend="vllm")
    assert not other.memory_compared and "--pin rollout_backend=vllm" in other.memory_not_compared
    assert other.phases["rollout"].measured_peak_bytes == 1_560_000_000
    assert all(p.memory_rel_error is None and p.rss_rel_error is None for p in other.phases.values())
    text = _render(summary_table(other))
    row = next(line for line in text.splitlines() if "rollout" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[0] == "rollout" and cells[4:] == ["1.45 GiB", "—", "—", "900.0 MiB"]  # peak, plan, err, rss
    assert "not compared: the plan predicts the memory of its 'hf' rollout, this run used 'vllm'" in " ".join(
        text.split()
    )
    assert "1.45 GiB" in text and "900.0 MiB" in text  # the tracker's allocation beside the resident set
    same = build_profile(plan, steps, device="cpu", memory_source="live tensor bytes", rollout_backend="hf")
    assert same.memory_compared and same.phases["update"].memory_rel_error is not None


def test_cuda_profile_compares_the_device_footprint_with_the_plans_total():
    from rich.console import Console

    from grpo_pilot.cli.run_render import summary_table

    plan = load_plan("examples/tiny/plan.json")
    total = plan.phases["update"].total_bytes

    def step(i):
        sample = PhaseSample(wall_s=0.1, peak_bytes=100, reserved_peak_bytes=150, device_peak_bytes=total * 11 // 10)
        return (i, {"update": sample}, 0.2, 1000.0)

    prof = build_profile(plan, [step(1), step(2)], device="cuda:0", memory_source="torch.cuda.max_memory_allocated")
    up = prof.phases["update"]
    assert (up.measured_reserved_peak_bytes, up.measured_device_peak_bytes) == (150, total * 11 // 10)
    assert up.device_rel_error == pytest.approx((total * 11 // 10) / total - 1)
    console = Console(width=200, record=True)
    console.print(summary_table(prof))
    text = console.export_text()
    assert "device" in text and "plan total" in text and "+10" in text
