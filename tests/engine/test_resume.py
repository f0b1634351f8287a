"""Resume: a `grpo-run` killed with SIGKILL mid-run and resumed ends like an uninterrupted run.

Same step count, same prompts in the same order at every step, same rewards (CPU, one thread, the
sampling seed is a function of (seed, step, round), RNG states and the sampler position are checkpointed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpo_pilot.engine.loop import run
from grpo_pilot.engine.run_config import RunConfig
from grpo_pilot.planner.plan import load_plan

torch.set_num_threads(1)
STEPS = 8
SETTINGS = dict(
    dataset="examples/tiny/prompts.jsonl",
    reward="char_fraction:char=a",
    steps=STEPS,
    lr=5e-3,
    seed=3,
    threads=1,
    cpu_memory="rss",
    checkpoint_every=2,
)


def cli(out: Path, *extra: str) -> list[str]:
    args = [
        sys.executable,
        "-c",
        "from grpo_pilot.cli import run_entry; run_entry()",
        "examples/tiny/plan.json",
        "--out",
        str(out),
        "-q",
    ]
    for key, value in SETTINGS.items():
        args += ["--set", f"{key}={value}"]
    return args + list(extra)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


@pytest.mark.slow
def test_killed_run_resumes_without_losing_or_repeating_data(tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(cli(killed), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 120
    while len(lines(metrics)) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)  # step 3 is logged, checkpoint 2 exists: step 4 is under way
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    before = lines(metrics)
    assert 3 <= len(before) < STEPS

    resumed = subprocess.run(cli(killed, "--resume"), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr

    reference = tmp_path / "reference"
    run(load_plan("examples/tiny/plan.json"), RunConfig(output_dir=str(reference), **SETTINGS))

    got, want = lines(metrics), lines(reference / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)) == [r["step"] for r in want]
    assert [r["prompt_indices"] for r in got] == [r["prompt_indices"] for r in want]
    assert [r["reward_mean"] for r in got] == pytest.approx([r["reward_mean"] for r in want], abs=1e-6)
    assert [r["grad_norm"] for r in got] == pytest.approx([r["grad_norm"] for r in want], rel=1e-4)
    assert (
        json.loads((killed / "profile.json").read_text())["steps_run"] < STEPS
    )  # only the resumed steps ran in the last process
    # every generated sample's lengths, once: the lines of the redone steps were cut back with the checkpoint
    assert lines(killed / "lengths.jsonl") == lines(reference / "lengths.jsonl")
    assert len(lines(killed / "lengths.jsonl")) == STEPS * 32
