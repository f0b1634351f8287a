"""Records, trials.csv, the best plan and the report figure."""

from __future__ import annotations

import pandas as pd
import pytest
from tune_helpers import failed, measured, tiny_plan

from grpo_pilot.planner.calibration import load_calibration
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.plan import load_plan
from grpo_pilot.planner.recheck import plan_inputs
from grpo_pilot.tuner.records import build_record
from grpo_pilot.tuner.report import best_record, pareto_front, write_outputs
from grpo_pilot.tuner.space import build_space, knobs_at

VERSIONS = {"torch": "2.13.0+cpu", "transformers": "5.19.0", "vllm": None}


def record(number, params, outcome, prune=None):
    plan = tiny_plan()
    trial_plan = evaluate(plan_inputs(plan), knobs_at(build_space(plan), params))
    return build_record(
        number=number,
        source="sampler",
        params=params,
        plan=trial_plan,
        outcome=outcome,
        steps=3,
        gpu_kind="cpu",
        versions=VERSIONS,
        prune_reason=prune,
    )


def test_record_holds_prediction_beside_measurement():
    r = record(0, {"update_batch": "micro:8"}, measured(4000.0, peak_bytes=6_000_000))
    update = r.phases["update"]
    assert update.predicted_s > 0 and update.measured_s == pytest.approx(0.025)
    assert update.measured_peak_bytes == 6_000_000
    assert update.predicted_tensor_bytes == sum(
        v for k, v in update.predicted_items.items() if not k.startswith("overhead_")
    )
    assert update.predicted_total_bytes == sum(update.predicted_items.values())
    assert r.phases["reward"].predicted_s is None  # the plan does not predict the reward phase
    assert r.knobs.micro_batch_size_per_gpu == 8 and r.versions == VERSIONS and r.plan_gpu == "cpu"
    assert r.measured_peak_bytes == 6_000_000 and r.predicted_peak_tensor_bytes >= update.predicted_tensor_bytes
    pruned = record(1, {"update_batch": "micro:32"}, None, prune="predicted 3.0x over memory")
    assert pruned.status == "pruned" and pruned.steps == 0 and pruned.phases["update"].measured_s is None


def test_pareto_front():
    points = [(10.0, 100.0, 0), (20.0, 150.0, 1), (15.0, 90.0, 2), (30.0, 140.0, 3), (10.0, 80.0, 4), (5.0, 50.0, 5)]
    assert pareto_front(points) == [(5.0, 50.0, 5), (10.0, 100.0, 0), (20.0, 150.0, 1)]
    assert pareto_front([]) == []


def test_outputs(tmp_path):
    records = [
        record(0, {"update_batch": "micro:16"}, measured(5000.0, peak_bytes=7_000_000)),
        record(1, {"update_batch": "micro:32"}, failed("oom", "over the cap", phase="update", step=2)),
        record(2, {"update_batch": "tokens:768"}, measured(5600.0, peak_bytes=8_000_000)),
        record(3, {"update_batch": "micro:1", "gradient_checkpointing": True}, measured(2100.0, peak_bytes=3_000_000)),
        record(4, {"update_batch": "tokens:1536"}, None, prune="predicted 2.0x over memory"),
    ]
    assert best_record(records).number == 2
    out = write_outputs(tmp_path, tiny_plan(), records)
    assert out.best_trial == 2 and not out.notes
    # the calibration is fitted from the three measured trials (not the oom, not the pruned one)
    assert out.calibration_json == str(tmp_path / "calibration.json")
    assert load_calibration(out.calibration_json).num_trials == 3
    best = load_plan(out.plan_path)
    assert best.knobs.max_token_len_per_gpu == 768 and best.knobs.micro_batch_size_per_gpu == 16
    assert best.workload == tiny_plan().workload and best.model == tiny_plan().model
    frame = pd.read_csv(out.trials_csv)
    assert list(frame["trial"]) == [0, 1, 2, 3, 4]
    assert list(frame["status"]) == ["ok", "oom", "ok", "ok", "pruned"]
    assert frame.loc[2, "measured_tokens_per_s"] == 5600.0
    assert frame.loc[2, "tokens_per_s_error"] == pytest.approx(5600.0 / records[2].predicted_tokens_per_s - 1)
    assert frame.loc[1, "failure_phase"] == "update" and frame.loc[1, "failure_message"] == "over the cap"
    assert frame.loc[4, "prune_reason"] == "predicted 2.0x over memory"
    for column in (
        "update.measured_s",
        "update.predicted_s",
        "update.measured_peak_bytes",
        "update.predicted_tensor_bytes",
        "update.memory_error",
        "rollout.predicted_total_bytes",
        "knob.update_batch",
        "version.torch",
        "gpu_kind",
        "measured_prompt_len_mean_tokens",
        "measured_response_len_mean_tokens",
    ):
        assert column in frame.columns, column
    assert frame.loc[0, "update.measured_peak_bytes"] == 7_000_000
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_no_measurement_no_plan(tmp_path):
    out = write_outputs(tmp_path, tiny_plan(), [record(0, {"update_batch": "micro:32"}, failed("crash", "x"))])
    assert out.plan_path is None and out.best_trial is None
    assert not (tmp_path / "plan.json").exists() and (tmp_path / "trials.csv").exists()
    assert any("plan.json not written" in n for n in out.notes)
