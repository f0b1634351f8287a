"""`grpo-plan --algorithm / --compare` and the launch families end to end."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from grpo_pilot.cli.plan import app

runner = CliRunner()
FAST = ["--trials", "20"]


def run(*args: str):
    return runner.invoke(app, list(args))


def test_compare_prints_grpo_beside_ppo_per_phase() -> None:
    r = run("--model", "qwen2.5-7b", "--gpus", "8xH100", "--compare", "ppo", *FAST)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "GRPO beside PPO" in out and "target verl" in out  # verl runs both
    for phase in ("rollout", "log_prob", "values", "critic_update", "update", "weight_sync"):
        assert re.search(rf"│ {phase} +│", r.output), phase
    # the critic's phases exist only in the PPO plan
    assert re.search(r"│ values +│ +— +│ +[0-9.]+ +│ +— +│ +[0-9.]+ +│", r.output)
    assert "PPO model states per GPU at their largest (GiB): actor" in out and "critic" in out


def test_algorithm_ppo_plans_the_critic_for_verl() -> None:
    r = run("--model", "qwen2.5-7b", "--gpus", "8xH100", "--algorithm", "ppo", "--json", *FAST)
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["target"] == "verl" and plan["workload"]["algorithm"] == "ppo"
    assert {"values", "critic_update"} <= set(plan["phases"]) and plan["phase_times_s"]["critic_update"] > 0


def test_ppo_megatron_and_sglang_are_refused_for_our_engine() -> None:
    r = run("--model", "qwen2.5-7b", "--gpus", "8xH100", "--algorithm", "ppo", "--target", "grpo-pilot")
    assert r.exit_code == 2 and "grpo-run does not run PPO" in r.output and "--target verl" in r.output
    for pin in ("strategy=megatron", "rollout_backend=sglang"):
        r = run("--model", "qwen2.5-7b", "--gpus", "8xH100", "--pin", pin, *FAST)
        assert r.exit_code == 2 and "cannot be planned for --target grpo-pilot" in r.output, (pin, r.output)


def test_bad_algorithm_flags_are_usage_errors() -> None:
    assert run("--model", "qwen2.5-7b", "--gpus", "8xH100", "--algorithm", "dpo").exit_code == 2
    same = run("--model", "qwen2.5-7b", "--gpus", "8xH100", "--compare", "grpo")
    assert same.exit_code == 2 and "compare grpo with ppo" in same.output
    assert run("--model", "qwen2.5-7b", "--gpus", "8xH100", "--compare", "ppo", "--json").exit_code == 2


def test_emit_verl_writes_the_megatron_launch() -> None:
    r = run(
        "--model",
        "qwen2.5-7b",
        "--gpus",
        "8xH100",
        "--target",
        "verl",
        "--pin",
        "strategy=megatron",
        "--emit",
        "verl",
        *FAST,
    )
    assert r.exit_code == 0, r.output
    assert "--config-name=ppo_megatron_trainer" in r.output
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=" in r.output
