"""Hostile values of grpo-plan's flags and files, the calibration file wherever it is read, the atomic writer's
OS errors, and the one error handler's last resort: each a named one-paragraph error, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_helpers import TINY_MODEL_FLAGS, TINY_PLAN, assert_refused, invoke

import grpo_pilot.atomic as atomic
from grpo_pilot.cli.errors import TRACEBACK_ENV
from grpo_pilot.cli.plan import app
from grpo_pilot.errors import InputError
from grpo_pilot.planner.calibration import CALIBRATION_DIR_ENV
from grpo_pilot.planner.plan import load_plan, save_plan

REPO = Path(__file__).resolve().parents[2]
GPU = ["--model", "qwen-7b", "--gpus", "8xH100", "--trials", "4"]
HUGE = "1" + "0" * 400  # an integer far past float range
FLAG_CASES = [
    (["--host-ram", "1.2.3"], "Cannot read the size --host-ram '1.2.3'"),
    (["--host-ram", "."], "Cannot read the size --host-ram '.'"),
    (["--host-ram", "1e400"], "Cannot read the size --host-ram '1e400'"),
    (["--host-ram", HUGE], "is larger than 1 EiB"),
    (["--host-ram", "0"], "--host-ram '0' is zero"),  # was silently the 1 TiB default
    (["--headroom-gib", "inf"], "--headroom-gib inf is not a finite number"),
    (["--gpus", "1" * 5000 + "xH100"], "asks for more than 9,999,999 GPUs or nodes"),
    (["--gpus", "2x" + "1" * 5000 + "xH100"], "asks for more than"),
    (["--seed", "-1"], "--seed -1 is outside 0 to 4294967295"),
    (["--seed", str(10**29)], "is outside 0 to 4294967295"),
    (["--prompts-per-step", HUGE, "--mini-batch", "8"], "prompts_per_step"),
    (["--n", HUGE], "Bad workload (n)"),
    (["--response-len", str(10**20)], "Bad workload (response_len_tokens)"),
    (["--response-len-std", "1e300"], "Bad workload (response_len_std_tokens)"),
    (["--plot", "x.pdf"], "--plot 'x.pdf' does not end in .png"),
]


@pytest.mark.parametrize("extra,fragment", FLAG_CASES, ids=[f"{c[0][0]}={c[0][1][:12]}" for c in FLAG_CASES])
def test_plan_flag_values(scratch, monkeypatch, extra, fragment):
    monkeypatch.chdir(scratch.root)  # --plot x.pdf would land here
    scratch.mark()
    args = ["--model", "qwen-7b", "--trials", "4", *([] if "--gpus" in extra else ["--gpus", "8xH100"]), *extra]
    assert_refused(invoke(app, args), 2, fragment)
    scratch.check()


@pytest.mark.parametrize("field", ["prompt_tokens", "response_tokens"])
def test_huge_length_in_a_lengths_file(tmp_path, field):
    path = tmp_path / "lengths.jsonl"
    row = {"prompt_tokens": 10, "response_tokens": 20}
    path.write_text(json.dumps(row).replace(f'"{field}": {row[field]}', f'"{field}": {HUGE}') + "\n")
    assert_refused(
        invoke(app, [*GPU, "--lengths", path]), 2, f"'{field}' must be a non-negative integer token count", "…"
    )


def _calibration_cases(root: Path) -> dict[str, tuple[Path, str]]:
    fifo = root / "fifo.json"
    os.mkfifo(fifo)
    deep = root / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    nan = root / "nan.json"
    nan.write_text('{"schema_version": 1, "device_kind": "cpu", "plan_gpu": NaN}')
    return {
        "fifo": (fifo, "is a named pipe, not a regular file"),
        "dev-zero": (Path("/dev/zero"), "is a character device"),
        "deep": (deep, "nested deeper than 64 levels"),
        "nan": (nan, "field 'plan_gpu': NaN is not a JSON number"),
    }


CALIBRATION_KINDS = ["fifo", "dev-zero", "deep", "nan"]


def _plan_process(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """grpo-plan in its own process, with a deadline: a FIFO or /dev/zero must be refused, never read."""
    cmd = [sys.executable, "-c", "from grpo_pilot.cli import plan_entry; plan_entry()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("kind", CALIBRATION_KINDS)
def test_calibration_flag(tmp_path, kind):
    path, fragment = _calibration_cases(tmp_path)[kind]
    done = _plan_process(*TINY_MODEL_FLAGS, "--trials", "4", "--calibration", str(path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and fragment in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", CALIBRATION_KINDS)
def test_default_calibration_location(tmp_path, kind):
    """The default calibration file of the plan's GPU (cpu.json here), whatever is there, on every plain plan."""
    path, fragment = _calibration_cases(tmp_path)[kind]
    cal_dir = tmp_path / "cal"
    cal_dir.mkdir()
    os.symlink(path, cal_dir / "cpu.json")
    done = _plan_process(*TINY_MODEL_FLAGS, "--trials", "4", env={CALIBRATION_DIR_ENV: str(cal_dir)})
    assert done.returncode == 2, done.stderr
    assert fragment in done.stderr and f"Delete or replace {cal_dir / 'cpu.json'}" in done.stderr


@pytest.mark.parametrize("kind", CALIBRATION_KINDS)
def test_plan_provenance_calibration_file_does_not_hang_grpo_run(tmp_path, kind):
    """grpo-run re-checks a calibrated plan with its calibration: an unreadable one is refused at once (the
    re-check then uses the analytic constants), not read forever."""
    path, _ = _calibration_cases(tmp_path)[kind]
    plan = load_plan(TINY_PLAN)
    provenance = plan.provenance.model_copy(update={"calibration": "box", "calibration_file": str(path)})
    planned = save_plan(plan.model_copy(update={"provenance": provenance}), tmp_path / "plan.json")
    code = (
        "import sys\nfrom grpo_pilot.planner.calibration import inputs_of_plan\n"
        "from grpo_pilot.planner.plan import load_plan\n"
        f"inputs = inputs_of_plan(load_plan({str(planned)!r}))\nprint(inputs.calibration)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr


@pytest.mark.parametrize(
    "call,code,word", [("replace", errno.EROFS, "Read-only file system"), ("fsync", errno.ENOSPC, "No space left")]
)
def test_atomic_writer_os_errors_are_named(scratch, monkeypatch, call, code, word):
    """A read-only file system refusing the rename, a full one refusing the data: one paragraph, no temp file."""

    def refuse(*args):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(atomic.os, call, refuse)
    scratch.mark()
    out = scratch.root / "plan.json"
    assert_refused(invoke(app, [*TINY_MODEL_FLAGS, "--trials", "4", "--out", out]), 2, f"Cannot write '{out}'", word)
    scratch.check()
    with pytest.raises(InputError, match=word):
        atomic.atomic_write_text(scratch.root / "x.txt", "x")
    scratch.check()


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_outputs_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        written = atomic.atomic_write_text(tmp_path / "out.json", "{}")
        assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~mask
    finally:
        os.umask(old)
    existing = tmp_path / "kept.json"
    existing.write_text("{}")
    existing.chmod(0o640)
    atomic.atomic_write_text(existing, "[]")  # a replaced file keeps its mode
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640


def test_plan_outputs_are_not_private(tmp_path):
    """plan.json and memory.png from the CLI: 0644 under the usual umask (they were 0600, the temp file's mode)."""
    pytest.importorskip("matplotlib")
    old = os.umask(0o022)
    try:
        plot = tmp_path / "memory.png"
        result = invoke(app, [*TINY_MODEL_FLAGS, "--trials", "4", "--out", tmp_path / "plan.json", "--plot", plot])
        assert result.exit_code == 0, result.output
    finally:
        os.umask(old)
    for name in ("plan.json", "memory.png"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_a_suggestion_never_proposes_the_current_prompts_per_step():
    """At 800,000 GPUs no larger cluster is considered, so no prompts-per-step change is proposed; below it the
    proposed value is a different one that a larger layout divides."""
    huge = ["--model", "llama-405b", "--gpus", "100000x8xA10G", "--prompts-per-step", "1000", "--trials", "4"]
    result = invoke(app, huge)
    assert result.exit_code == 3 and "--prompts-per-step 1000" not in result.stderr, result.stderr
    assert "not even 1-token responses fit" in result.stderr and "64 nodes" not in result.stderr
    small = ["--model", "llama-405b", "--gpus", "8xA10G", "--prompts-per-step", "999", "--n", "1", "--trials", "4"]
    result = invoke(app, small)
    assert result.exit_code == 3 and "with --prompts-per-step 1000 (1000 responses) 40 GPUs divide it" in result.stderr


def test_anything_unexpected_is_one_paragraph(monkeypatch):
    """A bug of ours escaping a command: one paragraph naming it, exit 1 ({TRACEBACK_ENV}=1 shows the traceback)."""

    def broken(*args, **kwargs):
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr("grpo_pilot.cli.plan.make_workload", broken)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    result = invoke(app, TINY_MODEL_FLAGS)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    assert result.stderr.startswith("failed: stopped on an unexpected OverflowError: int too large to convert")
    assert result.stderr.count("\n") == 1 and TRACEBACK_ENV in result.stderr
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    result = invoke(app, TINY_MODEL_FLAGS)
    assert isinstance(result.exception, OverflowError)
