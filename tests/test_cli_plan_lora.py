"""`grpo-plan --lora-rank`: the adapter a plan carries for grpo-run (examples/tiny/plan-lora.json was made so, by a
grpo-plan that did not model adapters yet: its figures are full fine-tuning's), the adapter's items in a plan made
now, and the flags' bad uses."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from grpo_pilot.cli.plan import app
from grpo_pilot.planner.adapters import adapters_modelled
from grpo_pilot.planner.plan import load_plan

runner = CliRunner()
TINY = ["--model", "examples/tiny", "--gpus", "1xcpu", "--prompts-per-step", "8", "--mini-batch", "8", "--n", "4",
        "--prompt-len", "32", "--response-len", "16", "--pin", "rollout_backend=hf"]  # fmt: skip


def test_the_committed_lora_example_is_what_its_command_makes(tmp_path):
    out = tmp_path / "plan-lora.json"
    result = runner.invoke(app, [*TINY, "--kl", "--lora-rank", "8", "--lora-alpha", "16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    # grpo-plan models the adapters now: a frozen base and adapter states, no full fine-tuning note
    assert "this estimate is full fine-tuning's" not in " ".join(result.output.split())
    made, committed = load_plan(out), load_plan("examples/tiny/plan-lora.json")
    assert made.phases["update"].items["frozen_base"] > 0 and adapters_modelled(made)
    assert made.phases["update"].items["ref_params"] == 0  # the reference is the base with adapters disabled
    # the workload (adapter included) is the command's; the knobs are the search's, which moves with the estimator
    assert made.workload == committed.workload and made.knobs.rollout_backend == committed.knobs.rollout_backend
    adapter = made.workload.adapter
    assert (adapter.framework, adapter.method, adapter.rank, adapter.alpha) == ("grpo-pilot", "lora", 8, 16.0)
    assert adapter.target_modules == ("all-linear",) and adapter.base_quantization is None


def test_targets_and_a_quantized_base_reach_the_plan():
    result = runner.invoke(
        app, [*TINY, "--json", "--lora-rank", "16", "--lora-targets", "q_proj, v_proj", "--quantize-base", "4bit"]
    )
    assert result.exit_code == 0, result.output
    adapter = json.loads(result.output)["workload"]["adapter"]
    assert adapter["target_modules"] == ["q_proj", "v_proj"] and adapter["rank"] == 16
    assert (adapter["base_quantization"], adapter["quant_type"], adapter["double_quant"]) == ("4bit", "nf4", True)


def test_bad_adapter_flags_are_usage_errors():
    for extra, words in (
        (["--lora-alpha", "16"], "need --lora-rank"),
        (["--lora-rank", "8", "--quantize-base", "2bit"], "not 4bit or 8bit"),
        (["--lora-rank", "8", "--lora-targets", ","], "names no module"),
    ):
        result = runner.invoke(app, [*TINY, *extra])
        assert result.exit_code == 2 and words in " ".join(result.output.split()), (extra, result.output)
