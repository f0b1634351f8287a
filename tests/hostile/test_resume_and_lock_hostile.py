"""Resume from damaged checkpoints and logs, grpo-tune's --out, and two grpo-runs on one --out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_helpers import RUN_GOOD, TINY_PLAN, assert_refused, invoke

from grpo_pilot.cli.run import app
from grpo_pilot.outputs import LOCK_NAME, DirectoryLock

RESUME = [TINY_PLAN, *[a for a in RUN_GOOD if a not in ("--steps", "1")], "--set", "checkpoint_every=1"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A 2-step tiny run with a checkpoint at both steps (made once for the module)."""
    out = tmp_path_factory.mktemp("base") / "run"
    result = invoke(app, [*RESUME, "--steps", "2", "--out", out])
    assert result.exit_code == 0, result.output
    return out


def _copy(finished_run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    return out


def _state(out: Path) -> Path:
    return out / "checkpoints" / "step-000002" / "state.json"


def _edit_state(out: Path, **changes) -> None:
    state = json.loads(_state(out).read_text())
    for key, value in changes.items():
        if value is None:
            state.pop(key)
        else:
            state[key] = value
    _state(out).write_text(json.dumps(state))


DAMAGE = [
    ("missing-step", lambda out: _edit_state(out, step=None), ["state.json is damaged", "'step'"]),
    ("missing-metrics-bytes", lambda out: _edit_state(out, metrics_bytes=None), ["'metrics_bytes'"]),
    ("string-step", lambda out: _edit_state(out, step="abc"), ["'step'"]),
    ("negative-bytes", lambda out: _edit_state(out, metrics_bytes=-5), ["'metrics_bytes'"]),
    ("huge-number", lambda out: _state(out).write_text('{"step": 1e999}'), ["too large"]),
    ("not-json", lambda out: _state(out).write_text("{"), ["cannot be read"]),
    ("step-mismatch", lambda out: _edit_state(out, step=7), ["says step 7"]),
    ("other-config", lambda out: _edit_state(out, config_hash="0000"), ["different plan or run config"]),
    ("rng-garbage", lambda out: (_state(out).parent / "rng.pt").write_bytes(b"garbage"), ["cannot be read"]),
    ("shard-cut-in-half", lambda out: _cut(_shard(out)), ["is cut short"]),
    ("shard-missing", lambda out: _shard(out).unlink(), ["is missing"]),
    ("rng-planted-pickle", lambda out: _plant(out, "rng.pt"), ["rng.pt' cannot be read", "UnpicklingError"]),
    ("worker-rng-planted-pickle", lambda out: _plant(out, "rng-worker-0.pt"), ["rng-worker-0.pt' cannot be read"]),
    ("metadata-planted-pickle", lambda out: _plant(out, "actor/.metadata"), [".metadata' cannot be read"]),
]


def _shard(out: Path) -> Path:
    return next((_state(out).parent / "actor").glob("*.distcp"))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


class _Planted:
    """Runs code when unpickled: what a hostile file planted in a run directory holds."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _plant(out: Path, name: str) -> None:
    import pickle

    import torch

    marker = str(out / "code-ran")
    target = _state(out).parent / name
    if name.endswith(".metadata"):
        target.write_bytes(pickle.dumps(_Planted(marker)))
    else:
        torch.save({"python": _Planted(marker), "numpy": 1, "torch": 2}, target)


@pytest.mark.parametrize("name,damage,fragments", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_checkpoint_refused(finished_run, tmp_path, name, damage, fragments):
    out = _copy(finished_run, tmp_path)
    damage(out)
    before = (out / "metrics.jsonl").read_bytes()
    result = invoke(app, [*RESUME, "--steps", "3", "--resume", "--out", out])
    assert_refused(result, 2, *fragments)
    assert (out / "metrics.jsonl").read_bytes() == before  # refused before anything was cut or written
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    assert not (out / "code-ran").exists()  # a planted pickle is data, never code


def _steps(out: Path) -> list[int]:
    data = (out / "metrics.jsonl").read_bytes()
    assert b"\x00" not in data  # never padded
    return [json.loads(line)["step"] for line in data.decode().splitlines()]


def test_truncated_metrics_are_cut_back_not_padded(finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    metrics = out / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:-25])  # the step-2 record cut mid-line
    result = invoke(app, [*RESUME, "--steps", "3", "--resume", "--out", out])
    assert result.exit_code == 0, result.output
    assert "did not match the checkpoint of step 2" in result.stderr and "Traceback" not in result.output
    assert _steps(out) == [1, 3]


def test_hand_edited_byte_counts_never_pad(finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    _edit_state(out, metrics_bytes=10**6, lengths_bytes=10**7)  # far past the files' ends
    result = invoke(app, [*RESUME, "--steps", "3", "--resume", "--out", out])
    assert result.exit_code == 0, result.output
    assert "metrics.jsonl did not match" in result.stderr and "lengths.jsonl did not match" in result.stderr
    assert _steps(out) == [1, 2, 3]
    lengths = (out / "lengths.jsonl").read_bytes()
    assert b"\x00" not in lengths and {json.loads(line)["step"] for line in lengths.splitlines()} == {1, 2, 3}


def test_trailing_garbage_is_dropped(finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    with open(out / "metrics.jsonl", "ab") as handle:
        handle.write(b'{"step": 3, "loss": 0.1}\n{"step": 4, "lo')  # steps after the checkpoint and a cut line
    result = invoke(app, [*RESUME, "--steps", "3", "--resume", "--out", out])
    assert result.exit_code == 0, result.output
    assert "did not match" not in result.stderr
    assert _steps(out) == [1, 2, 3]


def test_tune_out_refused(tmp_path):
    from grpo_pilot.cli.tune import app as tune

    (tmp_path / "file").write_text("keep\n")
    base = [TINY_PLAN, "--config", "examples/tiny/run.toml", "--trials", "1", "-q"]
    assert_refused(invoke(tune, [*base, "--out", tmp_path / "file"]), 2, "--out", "is a regular file")
    assert_refused(invoke(tune, [*base, "--out", "/dev/null"]), 2, "is a character device")
    (tmp_path / "tune").mkdir()
    with DirectoryLock(tmp_path / "tune", "grpo-tune"):
        assert_refused(invoke(tune, [*base, "--out", tmp_path / "tune"]), 2, "is in use", f"PID {os.getpid()}")
    assert (tmp_path / "file").read_text() == "keep\n"
    assert sorted(p.name for p in (tmp_path / "tune").iterdir()) == [LOCK_NAME]


def test_two_runs_on_one_out(tmp_path):
    """The second grpo-run is refused naming the first's PID; the first finishes intact."""
    out = tmp_path / "run"
    argv = [sys.executable, "-c", "from grpo_pilot.cli import run_entry; run_entry()", *RESUME, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen([*argv, "--steps", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        lock = out / LOCK_NAME
        while not (lock.exists() and f"PID {first.pid}" in lock.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = subprocess.run([*argv, "--steps", "4"], capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"PID {first.pid}" in second.stderr and "is in use" in second.stderr
        assert "Traceback" not in second.stderr
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err.decode()
    assert _steps(out) == [1, 2, 3, 4]
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


FOREIGN = [
    ("profile.json", b'{"my": "notes"}\n'),
    ("workers.json", b"[1, 2, 3]\n"),
    ("run_config.json", b'{"learning_rate": 0.1}\n'),
    ("failure.json", b"my failures\n"),
    ("lengths.jsonl", b'{"step": 1, "note": "mine"}\n'),
    ("metrics.jsonl", b"step,loss\n1,0.5\n"),
]


@pytest.mark.parametrize("name,content", FOREIGN, ids=[c[0] for c in FOREIGN])
def test_files_with_our_names_that_are_not_ours_are_refused(scratch, name, content):
    out = scratch.root / "run"
    out.mkdir()
    (out / name).write_bytes(content)
    scratch.mark()
    for extra in ([], ["--resume"]):  # a fresh run and a resume alike
        err = assert_refused(invoke(app, [*RESUME, "--steps", "1", "--out", out, *extra]), 2, name, "left untouched")
        assert "not a run's" in err
    scratch.check()


def test_resume_without_checkpoints_never_erases_logs_it_did_not_write(finished_run, tmp_path):
    """Checkpoints gone: another run's logs (or logs with no run_config.json) are refused, not truncated."""
    out = _copy(finished_run, tmp_path)
    shutil.rmtree(out / "checkpoints")
    logs = {name: (out / name).read_bytes() for name in ("metrics.jsonl", "lengths.jsonl")}
    other = [*RESUME, "--set", "lr=3e-6", "--steps", "3", "--resume", "--out", out]  # another run's settings
    assert_refused(invoke(app, other), 2, "found no checkpoint", "would erase them")
    (out / "run_config.json").unlink()
    assert_refused(invoke(app, [*RESUME, "--steps", "3", "--resume", "--out", out]), 2, "found no checkpoint")
    assert {name: (out / name).read_bytes() for name in logs} == logs


def test_resume_without_checkpoints_starts_over_its_own_run(finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    shutil.rmtree(out / "checkpoints")
    result = invoke(app, [*RESUME, "--steps", "1", "--resume", "--out", out])
    assert result.exit_code == 0, result.output
    assert _steps(out) == [1]  # the same run started over: its own logs were cut, not appended to


def test_empty_or_current_directory_as_out_is_refused(scratch, monkeypatch):
    (scratch.root / "my-notes.txt").write_text("mine\n")
    base = [os.path.abspath(a) if a.startswith("examples/") else a for a in RESUME]
    monkeypatch.chdir(scratch.root)
    scratch.mark()
    assert_refused(invoke(app, [*base, "--steps", "1", "--out", ""]), 2, "output directory is empty")
    for out in (".", "./", str(scratch.root)):
        assert_refused(invoke(app, [*base, "--steps", "1", "--out", out]), 2, "is the current directory")
    scratch.check()
