"""`grpo-run` CLI: bad inputs give one paragraph on stderr and exit 2 (never a traceback); a failed run exits 1 with
failure.json; a good run prints the summary."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from grpo_pilot.cli.run import app

torch.set_num_threads(1)
PLAN = "examples/tiny/plan.json"
GOOD = [
    "--dataset",
    "examples/tiny/prompts.jsonl",
    "--reward",
    "char_fraction:char=a",
    "--set",
    "threads=1",
    "--set",
    "cpu_memory=rss",
]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_input_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit)
    err = result.stderr
    assert err.startswith("error: ") and "Traceback" not in result.output
    assert err.strip().count("\n") == 0  # one paragraph
    for needle in needles:
        assert needle in err, err


def test_missing_plan(tmp_path):
    assert_input_error(invoke(str(tmp_path / "nope.json"), *GOOD), "No plan file", "grpo-plan")


def test_corrupt_plan(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text('{"schema_version": 1, "knobs": ')
    assert_input_error(invoke(str(bad), *GOOD), "not valid JSON")


def test_damaged_plan_field(tmp_path):
    raw = json.loads(open(PLAN).read())
    raw["workload"]["n"] = 0
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(raw))
    assert_input_error(invoke(str(bad), *GOOD), "damaged plan", "workload.n")


def test_bad_dataset_line_names_the_line(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "say a: "}\n{"prompt": "ok"}\n{"prompt": \n')
    assert_input_error(invoke(PLAN, *GOOD, "--dataset", str(data), "--out", str(tmp_path / "run")), ":3")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_bad_reward_spec(tmp_path):
    result = invoke(PLAN, *GOOD, "--reward", "no_such_reward", "--out", str(tmp_path / "run"))
    assert_input_error(result, "no_such_reward")


def test_reward_needing_a_missing_field_stops_before_training(tmp_path, monkeypatch):
    # the tiny prompt set has no "answer": exact_match cannot score it, and says so before any worker starts
    from grpo_pilot.engine.workers import WorkerGroup

    def no_workers(*args, **kwargs):
        raise AssertionError("the workers started before the records were checked against the reward")

    monkeypatch.setattr(WorkerGroup, "start", no_workers)
    result = invoke(PLAN, *GOOD, "--reward", "exact_match", "--out", str(tmp_path / "run"))
    assert_input_error(result, "answer")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_missing_reward_setting(tmp_path):
    assert_input_error(
        invoke(PLAN, "--dataset", "examples/tiny/prompts.jsonl", "--out", str(tmp_path / "run")),
        "does not set 'reward'",
    )


def test_unknown_set_key_and_bad_value(tmp_path):
    assert_input_error(invoke(PLAN, *GOOD, "--set", "warp_speed=9"), "Unknown setting 'warp_speed'")
    assert_input_error(invoke(PLAN, *GOOD, "--set", "loss_agg_mode=mean"), "loss_agg_mode")


def test_bad_run_config_file(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text("steps = = 3\n")
    assert_input_error(invoke(PLAN, "--config", str(cfg)), "not valid TOML")
    cfg.write_text('stepz = 3\nreward = "char_fraction:char=a"\ndataset = "x"\n')
    assert_input_error(invoke(PLAN, "--config", str(cfg)), "Unknown setting 'stepz'")


def test_good_run_prints_measured_vs_predicted(tmp_path):
    result = invoke(
        PLAN,
        "--config",
        "examples/tiny/run.toml",
        "--steps",
        "2",
        "--out",
        str(tmp_path / "run"),
        "--set",
        "cpu_memory=rss",
    )
    assert result.exit_code == 0, result.output
    for word in ("rollout", "log_prob", "update", "weight_sync", "predicted", "profile.json"):
        assert word in result.stdout
    profile = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert profile["steps_run"] == 2
    saved = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert saved["steps"] == 2 and saved["lr"] == 2e-3  # flag beat the file; the file gave lr
    # off a terminal (CliRunner's streams are not one): one plain line per step on stderr, in step order
    lines = [line for line in result.stderr.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"], result.stderr
    assert all("reward" in line and "tokens/s" in line and "phases: " in line for line in lines)
    quiet = invoke(PLAN, "--config", "examples/tiny/run.toml", "--steps", "1", "--out", str(tmp_path / "q"), "-q")
    assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr == ""


def _record(step: int) -> dict:
    return {
        "step": step,
        "reward_mean": 0.5,
        "reward_std": 0.1,
        "loss": 0.01,
        "tokens_per_s": 1234.0,
        "step_s": 0.5,
        "phase_s": {"rollout": 0.2, "update": 0.3},
    }


def test_display_writes_each_step_as_it_ends_off_a_terminal():
    """A run launched with its output in a file shows progress while it goes, not only at the end."""
    import io

    from rich.console import Console

    from grpo_pilot.cli.run_display import RunDisplay

    stream = io.StringIO()
    with RunDisplay(Console(file=stream, width=200)) as display:
        display.begin(2, 5)
        display.step_finished(_record(3))
        assert stream.getvalue().splitlines() == [
            "step 3/5  reward 0.500 ± 0.100  loss 0.0100  kl —  entropy —  resp len —  tokens/s 1234  step s 0.50  "
            "phases: rollout 0.20s  update 0.30s"
        ]
        display.note("metrics.jsonl was cut back to step 2")
        assert stream.getvalue().splitlines()[-1] == "note: metrics.jsonl was cut back to step 2"


def test_display_on_a_terminal_is_live_not_lines():
    import io

    from rich.console import Console

    from grpo_pilot.cli.run_display import RunDisplay

    stream = io.StringIO()
    with RunDisplay(Console(file=stream, width=120, force_terminal=True)) as display:
        display.begin(0, 2)
        display.step_finished(_record(1))
        assert display.live_view
    assert "step 1/2" not in stream.getvalue() and "GRPO" in stream.getvalue()


def test_no_checkpoint_flag_writes_no_checkpoint(tmp_path):
    # run.toml asks for a checkpoint every 20 steps (so one at the last step); --no-checkpoint writes none at all
    args = (PLAN, "--config", "examples/tiny/run.toml", "--steps", "1", "--out", str(tmp_path / "run"), "-q")
    result = invoke(*args, "--no-checkpoint", "--set", "cpu_memory=rss", "--set", "max_new_tokens=4")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "profile.json").exists() and not (tmp_path / "run" / "checkpoints").exists()
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["checkpoint"] is False


def test_run_failure_exits_1_with_one_paragraph_and_failure_json(tmp_path):
    out = tmp_path / "run"
    result = invoke(PLAN, *GOOD, "--steps", "2", "--out", str(out), "--set", "memory_cap_bytes=1048576")
    assert result.exit_code == 1, result.output
    err = result.stderr
    assert err.startswith("failed: Out of memory on worker 0 (trainer+rollout)") and "Traceback" not in result.output
    assert err.strip().count("\n") == 0
    failure = json.loads((out / "failure.json").read_text())
    assert failure["kind"] == "oom" and failure["step"] == 1 and failure["worker"] == "worker 0 (trainer+rollout)"


def test_ulysses_is_refused_up_front(tmp_path):
    from grpo_pilot.planner.plan import load_plan, save_plan

    plan = load_plan(PLAN)
    sp = tmp_path / "sp.json"
    save_plan(plan.model_copy(update={"knobs": plan.knobs.model_copy(update={"ulysses_sp": 2})}), sp)
    assert_input_error(invoke(str(sp), *GOOD, "--out", str(tmp_path / "a")), "ulysses_sp=2", "--pin ulysses_sp=1")


def test_unreachable_ray_clusters_are_refused_up_front(tmp_path):
    pytest.importorskip("ray")  # the `ray` extra: only plans with several workers (or --address) need it
    result = invoke(PLAN, *GOOD, "--out", str(tmp_path / "b"), "--address", "127.0.0.1:1")  # nothing listens there
    assert_input_error(result, "Cannot join the Ray cluster at '127.0.0.1:1'", "ray start")
    assert not (tmp_path / "b" / "metrics.jsonl").exists()
