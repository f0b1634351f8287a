"""`grpo-plan --verify`: the tiny example model traced through the CLI, the JSON shape, the error numbers,
and the message when the engine extra is missing."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from grpo_pilot.cli.plan import app

pytest.importorskip("torch")
runner = CliRunner()
# the tiny example model on two GPUs (the engine shards over 2+ ranks); small lengths keep the trace ~2 s
ARGS = [
    "--model",
    "examples/tiny",
    "--gpus",
    "2xH100",
    "--prompts-per-step",
    "8",
    "--mini-batch",
    "4",
    "--n",
    "4",
    "--prompt-len",
    "32",
    "--response-len",
    "16",
    "--trials",
    "10",
    "--pin",
    "param_offload=false",
    "--pin",
    "optimizer_offload=false",
    "--pin",
    "ulysses_sp=1",
    "--pin",
    "micro_batch_size_per_gpu=2",
]


@pytest.fixture(scope="module")
def json_result() -> dict:
    result = runner.invoke(app, [*ARGS, "--verify", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_verify_prints_traced_vs_analytic_tables() -> None:
    result = runner.invoke(app, [*ARGS, "--verify"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Traced vs analytic" in out and "update phase" in out and "log_prob phase" in out
    assert "sharded params" in out and "total (tensors)" in out
    assert re.search(r"[+-]\d+\.\d%", out)  # relative errors printed


def test_verify_json_shape(json_result: dict) -> None:
    v = json_result["verify"]
    assert json_result["fits"] and "knobs" in json_result  # still the plan
    assert set(v["traced"]) == {"total_bytes", "items"} and set(v["analytic"]) == {"total_bytes", "items"}
    assert set(v["traced"]["items"]) == set(v["analytic"]["items"])
    assert v["log_prob"] is not None and set(v["log_prob"]["traced"]) == {"total_bytes", "items"}
    assert v["world_size"] == 2 and v["trace_s"] > 0
    # 4 prompts x 4 completions per mini-batch over 2 ranks, micro-batch 2: 2 sequences of 47 fed tokens
    assert v["tokens_per_update_micro_batch"] == 2 * (32 + 16 - 1)


def test_verify_json_errors_are_the_numbers(json_result: dict) -> None:
    v = json_result["verify"]
    for phase in (v, v["log_prob"]):
        t, a = phase["traced"], phase["analytic"]
        assert t["total_bytes"] == sum(t["items"].values()) > 0
        assert a["total_bytes"] == sum(a["items"].values()) > 0
        assert phase["relative_error"]["total"] == pytest.approx(
            (a["total_bytes"] - t["total_bytes"]) / t["total_bytes"]
        )
        for row, traced in t["items"].items():
            if traced:
                expected = (a["items"][row] - traced) / traced
                assert phase["relative_error"][row] == pytest.approx(expected), row
        # the fp32 master shard: analytic 4P/D and the trace agree to the 512-B rounding of each tensor
        assert abs(phase["relative_error"]["sharded params"]) < 0.05
    assert "overhead_cuda_context" in v["not_traced"]


def test_plan_json_without_verify_has_no_verify_key() -> None:
    result = runner.invoke(app, [*ARGS, "--json"])
    assert result.exit_code == 0 and "verify" not in json.loads(result.stdout)


def test_missing_engine_extra_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import grpo_pilot.cli.plan_verify as cli_verify

    real = cli_verify.find_spec
    monkeypatch.setattr(cli_verify, "find_spec", lambda name: None if name == "torch" else real(name))
    result = runner.invoke(app, [*ARGS, "--verify"])
    assert result.exit_code == 2
    text = result.output
    assert "torch" in text and "engine extra" in text and "Traceback" not in text


def test_untraceable_plan_is_an_input_error() -> None:
    args = [a if a != "param_offload=false" else "param_offload=true" for a in ARGS]
    result = runner.invoke(app, [*args, "--verify"])
    assert result.exit_code == 2 and "param_offload=True" in result.output


def test_one_trainer_gpu_plan_is_traced_unsharded() -> None:
    """One GPU: the engine's unsharded rank (weights in place under autocast) is traced, its bf16 weight
    casts on a row of their own."""
    args = [a if a != "2xH100" else "1xH100" for a in ARGS]
    result = runner.invoke(app, [*args, "--verify", "--json"])
    assert result.exit_code == 0, result.output
    verify = json.loads(result.stdout)["verify"]
    assert verify["world_size"] == 1
    casts = verify["traced"]["items"]["autocast weight casts"]
    assert casts > 0 and verify["analytic"]["items"]["autocast weight casts"] == pytest.approx(casts, rel=0.01)
    assert abs(verify["relative_error"]["total"]) < 0.05
