"""User code that exits, hangs or crashes: rewards and transforms fail with a message naming them.

Hostile inputs for issue 10 item 4: `SystemExit(0)`, `SystemExit(3)`, `KeyboardInterrupt`, a sleep past
the per-call timeout, `os._exit`, a segfault, and output on stdout, in reward functions and in data
transforms; at the CLI the run exits 1 (reward) or 2 (transform), never 0 or 3, with no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_pilot.engine.data import PromptRecord, load_prompts
from grpo_pilot.engine.rewards import RewardSettings, build_reward
from grpo_pilot.errors import InputError, RunError

REPO = Path(__file__).resolve().parents[2]
RECS = [PromptRecord(line=1, prompt="p", answer="1"), PromptRecord(line=2, prompt="p", answer="2")]
BODIES = {
    "exit0": "raise SystemExit(0)",
    "exit3": "raise SystemExit(3)",
    "sys_exit": "import sys; sys.exit('bye')",
    "interrupt": "raise KeyboardInterrupt",
    "sleep": "import time; time.sleep(60)",
    "os_exit": "import os; os._exit(0)",
    "segfault": "import ctypes; ctypes.string_at(0)",
}
EXPECTED = {
    "exit0": "raised SystemExit: 0",
    "exit3": "raised SystemExit: 3",
    "sys_exit": "raised SystemExit: bye",
    "interrupt": "raised KeyboardInterrupt",
    "sleep": "did not return within 1 s",
    "os_exit": "its worker process exited with status 0",
    "segfault": "its worker process was killed by signal 11",
}


def reward_file(tmp_path: Path, body: str, *, on_line: int | None = 2) -> str:
    """A reward that runs `body` for the record of `on_line` (every record when None)."""
    path = tmp_path / "hostile_reward.py"
    condition = "True" if on_line is None else f"record.line == {on_line}"
    path.write_text(
        "def score(completion, record):\n"
        f"    if {condition}:\n        {body}\n    print('noise on stdout')\n    return 1.0\n"
    )
    return f"{path}:score"


@pytest.mark.parametrize("kind", sorted(BODIES))
def test_reward_functions_that_exit_hang_or_crash(tmp_path: Path, kind: str) -> None:
    reward = build_reward(reward_file(tmp_path, BODIES[kind]), settings=RewardSettings(user_code_timeout_s=1.0))
    start = time.perf_counter()
    with pytest.raises(RunError) as info:
        reward.score(["a", "b"], RECS)
    message = info.value.message
    assert "hostile_reward.py:score" in message and EXPECTED[kind] in message, message
    assert "prompt line 2" in message and time.perf_counter() - start < 10
    if kind in ("exit0", "exit3", "interrupt", "sys_exit"):
        assert "may not end the run" in info.value.hint
    if kind == "sleep":
        assert "user_code_timeout_s" in info.value.hint


def test_a_reward_that_exits_at_import_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "exits_on_import.py"
    path.write_text("raise SystemExit(0)\n\ndef score(completion, record):\n    return 1.0\n")
    with pytest.raises(InputError, match="raised SystemExit"):
        build_reward(f"{path}:score")


def test_the_worker_keeps_state_between_calls(tmp_path: Path) -> None:
    path = tmp_path / "stateful.py"
    path.write_text("CALLS = []\n\ndef score(completion, record):\n    CALLS.append(1)\n    return len(CALLS)\n")
    reward = build_reward(f"{path}:score")
    assert reward.score(["a", "b"], RECS).total == (1.0, 2.0)
    assert reward.score(["a"], RECS[:1]).total == (3.0,)


def write_data(tmp_path: Path) -> Path:
    data = tmp_path / "raw.jsonl"
    data.write_text("".join(json.dumps({"q": f"question {i}", "a": str(i)}) + "\n" for i in range(1, 4)))
    return data


def transform_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "hostile_transform.py"
    path.write_text(
        "def pick(raw):\n"
        f"    if raw['a'] == '2':\n        {body}\n    return {{'prompt': raw['q'], 'answer': raw['a']}}\n"
    )
    return f"{path}:pick"


@pytest.mark.parametrize("kind", ["exit0", "exit3", "interrupt"])
def test_transforms_that_exit_are_line_problems(tmp_path: Path, kind: str) -> None:
    data, ref = write_data(tmp_path), transform_file(tmp_path, BODIES[kind])
    with pytest.raises(InputError) as info:
        load_prompts(data, transform=ref)
    assert f"{data}:2: field '<transform>'" in info.value.message and EXPECTED[kind] in info.value.message
    kept = load_prompts(data, transform=ref, skip_invalid=True)
    assert [r.line for r in kept.records] == [1, 3] and kept.skipped == 1


@pytest.mark.parametrize("kind", ["sleep", "os_exit"])
def test_transforms_that_hang_or_die_stop_the_load(tmp_path: Path, kind: str) -> None:
    data, ref = write_data(tmp_path), transform_file(tmp_path, BODIES[kind])
    with pytest.raises(InputError) as info:
        load_prompts(data, transform=ref, skip_invalid=True, timeout_s=1.0)
    assert "hostile_transform.py:pick" in info.value.message and "on line 2" in info.value.message
    assert EXPECTED[kind] in info.value.message


def grpo_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", "from grpo_pilot.cli import run_entry; run_entry()", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("kind", ["exit0", "exit3"])
def test_grpo_run_reports_an_exiting_reward_and_exits_1(tmp_path: Path, kind: str) -> None:
    ref = reward_file(tmp_path, BODIES[kind], on_line=None)
    common = ["--config", str(REPO / "examples/tiny/run.toml"), "--steps", "1", "--out", str(tmp_path / "run")]
    out = grpo_run(str(REPO / "examples/tiny/plan.json"), *common, "--reward", ref, "--quiet", cwd=REPO)
    assert out.returncode == 1, (out.returncode, out.stderr[-1500:])
    assert "failed: The reward function" in out.stderr and EXPECTED[kind] in out.stderr
    assert "Traceback" not in out.stderr


def test_grpo_run_reports_an_exiting_transform_and_exits_2(tmp_path: Path) -> None:
    data, ref = write_data(tmp_path), transform_file(tmp_path, BODIES["exit3"])
    out = grpo_run(
        str(REPO / "examples/tiny/plan.json"),
        *("--config", str(REPO / "examples/tiny/run.toml"), "--steps", "1", "--out", str(tmp_path / "run")),
        *("--dataset", str(data), "--transform", ref, "--quiet"),
        cwd=REPO,
    )
    assert out.returncode == 2 and "raised SystemExit: 3" in out.stderr and "Traceback" not in out.stderr


def slow_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """Every worker Python started from now on runs `body` first (a sitecustomize on its PYTHONPATH):
    a start-up that is grpo-run's, not the user's."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(body)
    monkeypatch.syspath_prepend(str(site))


def test_the_user_code_limit_excludes_the_workers_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3 s start-up of the worker (before any user code) under a 0.5 s limit: the load succeeds, and the
    limit still stops a call that sleeps past it."""
    slow_start_up(tmp_path, monkeypatch, "import time\ntime.sleep(3)\n")
    reward = build_reward(reward_file(tmp_path, BODIES["sleep"]), settings=RewardSettings(user_code_timeout_s=0.5))
    assert reward.score(["a"], RECS[:1]).total == (1.0,)  # line 1 does not sleep
    with pytest.raises(RunError, match="did not return within 0.5 s on the completion for prompt line 2"):
        reward.score(["b"], RECS[1:])


def test_a_slow_import_is_named_as_the_users(tmp_path: Path) -> None:
    path = tmp_path / "slow_import.py"
    path.write_text("import time\ntime.sleep(60)\n\ndef score(completion, record):\n    return 1.0\n")
    with pytest.raises(InputError) as info:
        build_reward(f"{path}:score", settings=RewardSettings(user_code_timeout_s=0.5))
    message = info.value.message
    assert "could not be loaded: importing it did not return within 0.5 s" in message, message
    assert "not grpo-run's start-up" in message and "user_code_timeout_s" in info.value.hint


def test_a_worker_that_cannot_start_is_said_to_be_grpo_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow_start_up(tmp_path, monkeypatch, "import os\nos._exit(7)\n")
    with pytest.raises(RunError) as info:
        build_reward(reward_file(tmp_path, "pass"))
    assert "did not start" in info.value.message and "before any of your code ran" in info.value.message
    assert "exited with status 7" in info.value.message


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"  # a zombie is dead, waiting for its parent to reap it


@pytest.mark.parametrize("then", ["returns", "os_exit"])
def test_no_process_a_reward_started_outlives_it(tmp_path: Path, then: str) -> None:
    """A reward that starts a new session's grandchild (setsid + fork + sleep), then returns or kills its
    own worker: closing the reward leaves no process behind."""
    pid_file = tmp_path / "grandchild.pid"
    body = (
        "import os, time\n        if os.fork() == 0:\n            os.setsid()\n            if os.fork() == 0:\n"
        f"                open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
        f"                os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\n"
        "                time.sleep(600)\n            os._exit(0)\n"
        f"        while not os.path.exists({str(pid_file)!r}):\n            time.sleep(0.01)\n"
        + ("        os._exit(0)" if then == "os_exit" else "        pass")
    )
    reward = build_reward(reward_file(tmp_path, body, on_line=1), settings=RewardSettings(user_code_timeout_s=30))
    if then == "os_exit":
        with pytest.raises(RunError, match="exited with status 0"):
            reward.score(["a"], RECS[:1])
    else:
        assert reward.score(["a"], RECS[:1]).total == (1.0,)
    grandchild = int(pid_file.read_text())
    if then == "returns":  # it runs on, in a session of its own, until the reward is closed
        assert _alive(grandchild) and os.getsid(grandchild) not in (os.getsid(0), os.getpgid(0))
    reward.close()  # (a worker that died was already stopped, with its tree, when the failure was reported)
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(grandchild)
