"""evaluate(): memory + time + constraints → one consistent Plan."""

from __future__ import annotations

import json

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import DEFAULT_HEADROOM_FRACTION, PlanInputs, assess, model_ref
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.plan import load_plan, save_plan
from grpo_pilot.planner.rules import PLAN_PHASES as PHASES
from grpo_pilot.profiles import resolve_model


def inputs(model: str = "qwen2.5-7b", gpus: str = "8xH100", **kw) -> PlanInputs:
    return PlanInputs(model=model_ref(resolve_model(model)), cluster=parse_cluster(gpus), **kw)


def test_plan_is_consistent_with_its_reports() -> None:
    inp = inputs()
    plan = evaluate(inp, Knobs())
    a = assess(inp, Knobs())
    assert plan.fits == a.fits
    assert plan.usable_gpu_bytes == int(parse_cluster("8xH100").gpu.memory_bytes * (1 - DEFAULT_HEADROOM_FRACTION))
    assert plan.peak_gpu_bytes == max(p.total_bytes for p in plan.phases.values())
    assert plan.predicted_step_s == pytest.approx(sum(plan.phase_times_s.values()))
    assert set(plan.phases) == set(PHASES) == set(plan.phase_times_s)
    assert plan.model.resolved == "qwen2.5-7b" and plan.model.requested == "qwen2.5-7b"
    assert plan.provenance.search_trials == 0


def test_fits_iff_no_violation_and_binding_names_phase_item() -> None:
    ok = evaluate(inputs(), Knobs())
    assert ok.fits and ok.violations == ()
    phase, _, item = ok.binding_constraint.partition(".")
    assert phase in PHASES and item in ok.phases[phase].items
    bad = evaluate(inputs("qwen-32b", "8xA100-80G"), Knobs())  # verl defaults: 32B states do not fit 80 GB
    assert not bad.fits and bad.violations
    phase, _, item = bad.binding_constraint.partition(".")
    assert phase in PHASES and item in bad.phases[phase].items
    # violations come worst first: the binding phase's message is the first one
    assert bad.violations[0].startswith(phase)


def test_headroom_shrinks_usable_memory_and_can_flip_the_verdict() -> None:
    knobs = Knobs()
    plan = evaluate(inputs(), knobs)
    share = plan.peak_gpu_bytes / parse_cluster("8xH100").gpu.memory_bytes
    tight = evaluate(inputs(headroom_fraction=1 - share + 0.01), knobs)
    assert tight.usable_gpu_bytes < plan.usable_gpu_bytes
    assert plan.fits and not tight.fits


def test_structural_violation_makes_plan_infeasible_even_if_memory_fits() -> None:
    plan = evaluate(inputs(workload=Workload(prompts_per_step=100, mini_batch_prompts=100)), Knobs())
    assert not plan.fits
    assert plan.binding_constraint == "batch.divisible_by_world"


def test_plan_json_contract_and_round_trip(tmp_path) -> None:
    plan = evaluate(inputs(), Knobs())
    raw = json.loads(plan.to_json())
    for key in ("schema_version", "fits", "knobs", "peak_gpu_bytes", "usable_gpu_bytes", "predicted_step_s", "phases"):
        assert key in raw
    for phase in PHASES:
        entry = raw["phases"][phase]
        assert set(entry) == {"total_bytes", "items"}
        assert sum(entry["items"].values()) == entry["total_bytes"]
    path = save_plan(plan, tmp_path / "plan.json")
    assert load_plan(path) == plan
