"""Helpers of the hostile-input suite: run a CLI entry in-process, check the refusal, check the scratch area.

Every case asserts the exit status, a fragment of the one-paragraph message, that no traceback was
printed, and that the scratch directory holds no partial or temporary file afterwards (`Scratch`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from grpo_pilot.outputs import LOCK_NAME

TINY_PLAN = "examples/tiny/plan.json"
TINY_DATA = "examples/tiny/prompts.jsonl"
TINY_MODEL_FLAGS = (
    "--model examples/tiny --gpus 1xcpu --prompts-per-step 8 --mini-batch 8 --n 4 --prompt-len 32 "
    "--response-len 16 --no-kl --pin rollout_backend=hf"
).split()
RUN_GOOD = ["--dataset", TINY_DATA, "--reward", "char_fraction:char=a", "--set", "threads=1"]
RUN_GOOD += ["--set", "cpu_memory=rss", "--steps", "1", "-q"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def invoke(app, args: list[str]):
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_refused(result, code: int, *fragments: str) -> str:
    """Exit `code` through SystemExit (not an exception escaping), one paragraph naming `fragments`."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    err = result.stderr
    label = {2: "error: ", 3: "does not fit: "}[code]
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert lines and lines[-1].startswith(label), err
    assert len(lines) == 1, err  # one paragraph
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def _digest(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return "(unreadable)"


@dataclass
class Scratch:
    """A scratch output area; `check()` fails if anything appeared or changed since `mark()` (our lock
    file in a directory that already existed excepted), or if a temporary file was left anywhere."""

    root: Path
    before: dict[str, str] | None = None

    def files(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for directory, dirs, names in os.walk(self.root):
            for name in dirs + names:
                path = os.path.join(directory, name)
                rel = os.path.relpath(path, self.root)
                if os.path.islink(path) or not os.path.isfile(path):
                    found[rel] = "(not a file)" if not os.path.isdir(path) else "(dir)"
                else:
                    found[rel] = _digest(path)
        return found

    def mark(self) -> None:
        self.before = self.files()

    def check(self) -> None:
        after = self.files()
        temps = [p for p in after if ".tmp" in os.path.basename(p)]
        assert not temps, temps
        assert self.before is not None
        new = {p for p in after if p not in self.before and os.path.basename(p) != LOCK_NAME}
        assert not new, sorted(new)
        changed = {p for p in self.before if after.get(p) != self.before[p]}
        assert not changed, sorted(changed)


@pytest.fixture
def scratch(tmp_path) -> Scratch:
    root = tmp_path / "scratch"
    root.mkdir()
    return Scratch(root)
