"""Calibration files: round trip, damaged files, which plans they apply to, and the plan's provenance."""

from __future__ import annotations

import json

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.calibration import (
    CALIBRATION_DIR_ENV,
    Calibration,
    FitError,
    calibrated,
    choose_calibration,
    default_calibration_path,
    load_calibration,
    mismatch,
    save_calibration,
)
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import PlanInputs, model_ref
from grpo_pilot.planner.make_plan import evaluate, make_plan
from grpo_pilot.planner.overheads import Overheads
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS
from grpo_pilot.profiles import resolve_model

VERSIONS = {"torch": "2.13.0+cpu", "transformers": "5.19.0", "vllm": None, "python": "3.11.7"}
SMALL = Workload(prompts_per_step=8, mini_batch_prompts=8, n=4, prompt_len_tokens=32, response_len_tokens=16)


def cpu_inputs() -> PlanInputs:
    return PlanInputs(model=model_ref(resolve_model("examples/tiny")), cluster=parse_cluster("1xcpu"), workload=SMALL)


def calibration(plan_gpu: str = "cpu", versions=None, dispatch: float = 0.004) -> Calibration:
    coef = DEFAULT_TIME_COEFFICIENTS.model_copy(update={"train_dispatch_s_per_layer_pass": dispatch})
    return Calibration(
        name="test-cal",
        device_kind="cpu" if plan_gpu == "cpu" else "NVIDIA H100 80GB HBM3",
        plan_gpu=plan_gpu,
        versions=dict(VERSIONS if versions is None else versions),
        time_coefficients=coef,
        num_trials=3,
        num_observations=6,
        fit_error=FitError(
            tokens_per_s_before=20.0, tokens_per_s_after=1.2, phase_time_before=9.0, phase_time_after=1.1
        ),
        created_at="2026-11-24T06:00:00+00:00",
    )


def test_round_trip_and_damaged_files(tmp_path):
    cal = calibration()
    path = save_calibration(cal, tmp_path / "cal.json")
    assert load_calibration(path) == cal
    assert not list(tmp_path.glob(".*tmp"))  # atomic: no temp file left behind
    cases = {
        "missing": (None, "No calibration file"),
        "notjson": ("{oops", "not valid JSON"),
        "foreign": ('{"hello": 1}', "not a grpo-pilot calibration file"),
        "newer": (json.dumps({**json.loads(cal.to_json()), "schema_version": 99}), "schema_version 99"),
        "damaged": (
            json.dumps({**json.loads(cal.to_json()), "num_trials": "many"}),
            "damaged calibration file: field 'num_trials'",
        ),
    }
    for name, (text, needle) in cases.items():
        p = tmp_path / f"{name}.json"
        if text is not None:
            p.write_text(text)
        with pytest.raises(InputError) as info:
            load_calibration(p)
        assert needle in info.value.message and "--calibrate-only" in info.value.hint


def test_mismatch_by_gpu_and_versions():
    cal = calibration()
    assert mismatch(cal, "cpu", VERSIONS) is None
    assert "plan is for H100-80G" in mismatch(cal, "H100-80G", VERSIONS)
    assert "torch 2.13.0+cpu (installed: 2.12.0)" in mismatch(cal, "cpu", {**VERSIONS, "torch": "2.12.0"})
    # a component not installed when it was measured (vLLM here) does not pin anything; python is not matched
    assert mismatch(cal, "cpu", {**VERSIONS, "vllm": "0.32.0", "python": "3.12.1"}) is None


def test_calibrated_plan_uses_the_constants_and_records_provenance(tmp_path):
    inputs = cpu_inputs()
    knobs = Knobs(rollout_backend="hf", micro_batch_size_per_gpu=1, gradient_checkpointing=False)
    analytic = evaluate(inputs, knobs)
    cal = calibration(dispatch=0.004)
    plan = evaluate(calibrated(inputs, cal, tmp_path / "cal.json"), knobs)
    # 32 micro-batches of one sequence each, 3 layer passes of 2 layers: 32 * 6 * (0.004 - analytic) more
    extra = 32 * 3 * 2 * (0.004 - DEFAULT_TIME_COEFFICIENTS.train_dispatch_s_per_layer_pass)
    assert plan.phase_times_s["update"] - analytic.phase_times_s["update"] == pytest.approx(extra)
    p = plan.provenance
    assert (p.calibration, p.calibration_file) == ("test-cal", str(tmp_path / "cal.json"))
    assert p.calibration_versions == VERSIONS
    assert analytic.provenance.calibration is None and analytic.provenance.calibration_versions is None
    searched = make_plan(calibrated(inputs, cal, "f.json"), pins={"rollout_backend": "hf"}, trials=8)
    assert searched.provenance.calibration == "test-cal" and searched.provenance.calibration_file == "f.json"


def test_choose_explicit_default_and_skipped(tmp_path):
    inputs = cpu_inputs()
    env = {CALIBRATION_DIR_ENV: str(tmp_path / "cals")}
    assert default_calibration_path("cpu", env) == tmp_path / "cals" / "cpu.json"
    # nothing at the default location: analytic, no note
    assert choose_calibration(inputs, None, use_default=True, versions=VERSIONS, environ=env) == (inputs, None)
    # an explicit file that applies
    save_calibration(calibration(), tmp_path / "mine.json")
    chosen, note = choose_calibration(inputs, tmp_path / "mine.json", use_default=True, versions=VERSIONS, environ=env)
    assert chosen.calibration == "test-cal" and "applied" in note
    # an explicit file for another GPU or other software is an input error
    save_calibration(calibration("H100-80G"), tmp_path / "h100.json")
    with pytest.raises(InputError, match="does not apply to this plan: it was measured for H100-80G"):
        choose_calibration(inputs, tmp_path / "h100.json", use_default=True, versions=VERSIONS, environ=env)
    with pytest.raises(InputError, match="measured with torch 2.13.0"):
        choose_calibration(
            inputs, tmp_path / "mine.json", use_default=True, versions={**VERSIONS, "torch": "2.14"}, environ=env
        )
    # the default file: applied when it matches, skipped (and said so in the plan) when it does not
    save_calibration(calibration(), default_calibration_path("cpu", env))
    chosen, note = choose_calibration(inputs, None, use_default=True, versions=VERSIONS, environ=env)
    assert chosen.calibration_file == str(default_calibration_path("cpu", env))
    assert choose_calibration(inputs, None, use_default=False, versions=VERSIONS, environ=env) == (inputs, None)
    other = {**VERSIONS, "transformers": "4.57.0"}
    chosen, note = choose_calibration(inputs, None, use_default=True, versions=other, environ=env)
    assert chosen.calibration is None and "not applied: it was measured with transformers 5.19.0" in note
    plan = evaluate(chosen, Knobs(rollout_backend="hf"))
    assert plan.provenance.calibration_skipped == note
    # a corrupt default file is an input error that names the file and the way out
    default_calibration_path("cpu", env).write_text("{")
    with pytest.raises(InputError) as info:
        choose_calibration(inputs, None, use_default=True, versions=VERSIONS, environ=env)
    assert "--no-calibration" in info.value.hint


def test_a_calibration_written_with_the_retired_fragmentation_factor_still_loads():
    # files from before planner/memory/allocator.py carry the factor; it is dropped on load, nothing else moves
    old = Overheads.model_validate({"fragmentation_factor": 1.1, "cuda_context_bytes": 123})
    assert old == Overheads(cuda_context_bytes=123)
    with pytest.raises(ValueError):
        Overheads.model_validate({"no_such_constant": 1})
