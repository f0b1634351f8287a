"""grpo-tune writes calibration.json after a sweep; --calibrate-only fits it from the study alone; the
trial plans of an Nxcpu plan keep the plan's usable memory; the runner reads the measured lengths."""

from __future__ import annotations

import json

from tune_helpers import TINY_CONFIG, TINY_PLAN, FakeRunner, measured
from typer.testing import CliRunner

import grpo_pilot.tuner.runner as runner_module
from grpo_pilot.cli.plan import app as plan_app
from grpo_pilot.cli.tune import app
from grpo_pilot.planner.calibration import load_calibration
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.plan import load_plan
from grpo_pilot.planner.recheck import plan_inputs
from grpo_pilot.tuner.runner import read_lengths
from grpo_pilot.tuner.study import default_storage, open_study

TWO_CPU = "examples/tiny/plan-2xcpu-colocated.json"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def slow_micro_batches(knobs):
    """Each micro-batch costs 40 ms: fewer, larger micro-batches measure faster."""
    micro = knobs.micro_batch_size_per_gpu or 32
    step = 0.05 + 0.04 * 32 / micro
    return measured(1536 / step, peak_bytes=4_000_000, step_s=step)


def test_sweep_writes_calibration_and_calibrate_only_refits_it(tmp_path, monkeypatch):
    fake = FakeRunner(slow_micro_batches)
    monkeypatch.setattr(runner_module, "SubprocessRunner", lambda: fake)
    out = tmp_path / "out"
    result = invoke(TINY_PLAN, "--config", TINY_CONFIG, "--out", str(out), "--trials", "4")
    assert result.exit_code == 0, result.output
    cal = load_calibration(out / "calibration.json")
    assert (cal.plan_gpu, cal.device_kind, cal.num_trials) == ("cpu", "cpu", 4)
    assert cal.source.startswith("study 'grpo-tune' in sqlite:///")
    assert "calibration.json" in result.stdout
    assert cal.fit_error.phase_time_after < cal.fit_error.phase_time_before
    # --calibrate-only: no trial runs, no run config needed; the same study gives the same fitted values
    (out / "calibration.json").unlink()
    again = invoke(TINY_PLAN, "--out", str(out), "--calibrate-only")
    assert again.exit_code == 0, again.output
    assert len(fake.requests) == 4
    refit = load_calibration(out / "calibration.json")
    assert refit.time_coefficients == cal.time_coefficients and refit.overheads == cal.overheads
    assert "calibration 'cpu" in again.stdout and "kept analytic: " in again.stdout
    # and grpo-plan uses it
    plan = CliRunner().invoke(
        plan_app,
        [
            "--model",
            "examples/tiny",
            "--gpus",
            "1xcpu",
            "--no-kl",
            "--prompts-per-step",
            "8",
            "--mini-batch",
            "8",
            "--n",
            "4",
            "--prompt-len",
            "32",
            "--response-len",
            "16",
            "--pin",
            "rollout_backend=hf",
            "--trials",
            "8",
            "--json",
            "--calibration",
            str(out / "calibration.json"),
        ],
    )
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["provenance"]["calibration"] == cal.name


def test_calibrate_only_needs_measured_trials_and_the_right_plan(tmp_path, monkeypatch):
    out = tmp_path / "out"
    nothing = invoke(TINY_PLAN, "--out", str(out), "--calibrate-only")
    assert nothing.exit_code == 2 and "No study storage at sqlite:///" in nothing.stderr
    assert not out.exists()  # nothing created
    out.mkdir()
    open_study(default_storage(out), "grpo-tune")  # a study without trials
    empty = invoke(TINY_PLAN, "--out", str(out), "--calibrate-only")
    assert empty.exit_code == 2 and "No measured trial" in empty.stderr
    fake = FakeRunner(slow_micro_batches)
    monkeypatch.setattr(runner_module, "SubprocessRunner", lambda: fake)
    assert invoke(TINY_PLAN, "--config", TINY_CONFIG, "--out", str(out), "--trials", "2", "--study", "s").exit_code == 0
    other = invoke(TWO_CPU, "--out", str(out), "--calibrate-only", "--study", "s")
    assert other.exit_code == 2 and "was made for another model, cluster" in other.stderr
    usage = invoke(TINY_PLAN, "--out", str(out))
    assert usage.exit_code == 2 and "needs --config and --trials" in usage.stderr


def test_trial_plans_of_a_two_worker_plan_keep_its_usable_memory():
    """On Nxcpu one device is RAM / N: the trial plan of the plan's own knobs is the plan again (it once
    came out with 0 bytes usable and fits=False)."""
    base = load_plan(TWO_CPU)
    again = evaluate(plan_inputs(base), base.knobs)
    assert again.usable_gpu_bytes == base.usable_gpu_bytes and again.fits == base.fits is True


def test_runner_reads_the_measured_steps_lengths(tmp_path):
    rows = [
        {"prompt_tokens": 100, "response_tokens": 100, "step": 1},  # warm-up step: not measured
        {"prompt_tokens": 6, "response_tokens": 16, "step": 2},
        {"prompt_tokens": 8, "response_tokens": 12, "step": 3},
    ]
    (tmp_path / "lengths.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{partial")
    assert read_lengths(tmp_path, (2, 3)) == {"prompt_len_mean_tokens": 7.0, "response_len_mean_tokens": 14.0}
    assert read_lengths(tmp_path, (9,)) == {} and read_lengths(tmp_path / "none", (2,)) == {}
