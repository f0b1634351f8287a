"""The code reward and its sandbox: correct code scores 1; hangs, memory bombs and forks are contained."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from grpo_pilot.engine.data import PromptRecord, load_prompts
from grpo_pilot.engine.rewards import RewardSettings, SandboxLimits, build_reward, extract_code, isolation, run_tests
from grpo_pilot.errors import InputError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
FAST = SandboxLimits(timeout_s=1.5, cpu_s=1.5, max_procs=16)
ADD_TESTS = ("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4")


def fence(code: str, tag: str = "python") -> str:
    return f"Here you go:\n```{tag}\n{code}\n```\nDone."


def test_extract_code_picks_the_last_python_block() -> None:
    text = "```python\nx = 1\n```\ntext\n```bash\nrm -rf /\n```\n```py\ny = 2\n```"
    assert extract_code(text) == "y = 2\n"
    assert extract_code("```\nz = 3\n```") == "z = 3\n"
    assert extract_code("```python\ntruncated = True") == "truncated = True"
    assert extract_code("```bash\nls\n```") == ""
    assert extract_code("def f(): return 1") == "def f(): return 1"


def test_correct_partial_and_wrong_solutions() -> None:
    records = load_prompts(EXAMPLES / "code.jsonl").records
    reward = build_reward("code:timeout_s=5;workers=2")
    completions = [
        fence("def add(a, b):\n    return a + b"),
        fence("def is_even(n):\n    return n == 2"),  # passes 2 of 3
        fence("def add(a, b):\n    return a - b"),  # passes only add(0, 0) == 0
        "no code at all",
    ]
    result = reward.score(completions, [records[0], records[1], records[0], records[1]])
    assert result.total == pytest.approx((1.0, 2 / 3, 1 / 3, 0.0))
    strict = build_reward("code:mode=all").score(completions[:2], [records[0], records[1]])
    assert strict.total == (1.0, 0.0)


def test_infinite_loop_times_out_fast_and_keeps_finished_tests() -> None:
    start = time.perf_counter()
    code = "def f():\n    return 1\ndef spin():\n    while True:\n        pass"
    result = run_tests(code, ("assert f() == 1", "assert spin() == 1", "assert f() == 1"), FAST)
    assert result.status == "timeout" and result.passed == (True, False, False)
    assert time.perf_counter() - start < FAST.timeout_s + 1.5
    asleep = run_tests("import time\ntime.sleep(60)", ("assert time.time() > 0",), FAST)
    assert asleep.status == "timeout" and asleep.wall_s < FAST.timeout_s + 1.0


def test_memory_bombs_are_stopped_by_the_address_space_limit() -> None:
    start = time.perf_counter()
    one_shot = run_tests("x = bytearray(8 * 1024**3)", ("assert len(x) > 0",), FAST)
    growing = run_tests(
        "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024**2))", ("assert chunks",), FAST
    )
    for result in (one_shot, growing):
        assert result.status in {"solution_error", "killed", "timeout"} and result.passed == (False,)
    assert time.perf_counter() - start < 2 * FAST.timeout_s + 2.0


def test_forks_are_capped_and_reaped() -> None:
    code = (
        "import os, time\nforks = 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
        "    forks += 1\n"
    )
    limits = FAST.model_copy(update={"max_procs": 8})
    result = run_tests(code, ("assert 0 < forks <= 8",), limits)
    assert result.status == "ok" and result.passed == (True,)
    # every forked sleeper is gone: a second run can fork just as many again
    again = run_tests(code, ("assert 0 < forks <= 8",), limits)
    assert again.passed == (True,)


def test_exits_stdin_and_faked_output_do_not_pass() -> None:
    tests = ("assert f() == 1",)
    assert run_tests("import sys\nsys.exit(0)", tests, FAST).status == "solution_error"
    assert run_tests("x = input()", tests, FAST).passed == (False,)  # stdin is closed: EOFError at once
    fake = 'print(\'test 0 pass\')\nprint(\'{"k": "test", "i": 0, "ok": true}\')\ndef f():\n    return 2'
    assert run_tests(fake, tests, FAST).passed == (False,)


def test_code_writes_only_inside_its_sandbox(tmp_path: Path) -> None:
    target = tmp_path / "owned.txt"
    code = f"try:\n    open({str(target)!r}, 'w').write('x')\n    written = True\nexcept OSError:\n    written = False"
    result = run_tests(code, ("assert written",), FAST)
    assert result.passed == (False,) and not target.exists()
    assert result.isolation.split(",")[0] in {"bwrap", "unshare"}
    inside = run_tests(
        "open('scratch.txt', 'w').write('ok')\nok = open('scratch.txt').read()", ("assert ok == 'ok'",), FAST
    )
    assert inside.passed == (True,)


def _no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = isolation.IsolationReport(mechanism="bwrap", available=False, reason="not installed (test)")
    monkeypatch.setattr(isolation, "choose", lambda requested: missing)
    monkeypatch.setattr(isolation, "probe", lambda mechanism: missing.model_copy(update={"mechanism": mechanism}))


def test_without_a_sandbox_the_code_reward_refuses_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_sandbox(monkeypatch)
    with pytest.raises(InputError, match="gives no sandbox for it") as info:
        build_reward("code")
    assert "--allow-unsandboxed-code" in info.value.hint
    with pytest.raises(InputError, match="without a sandbox"):
        build_reward("code:sandbox=none")
    allowed = build_reward("code:timeout_s=5", settings=RewardSettings(allow_unsandboxed_code=True))
    records = load_prompts(EXAMPLES / "code.jsonl").records
    result = allowed.score([fence("def add(a, b):\n    return a + b")], [records[0]])
    assert result.total == (1.0,)


def test_an_explicit_mechanism_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    for mechanism in ("bwrap", "unshare"):
        if not isolation.probe(mechanism).available:
            continue
        result = run_tests("def f():\n    return 1", ("assert f() == 1",), FAST, isolation=mechanism)
        assert result.passed == (True,) and result.isolation.startswith(mechanism)


def test_code_reward_requires_tests_on_every_record() -> None:
    reward = build_reward("code")
    with pytest.raises(InputError, match=r"needs a reference tests, but the records of line\(s\) 5"):
        reward.check_records([PromptRecord(line=5, prompt="write f")])


def test_without_a_sandbox_no_setsid_grandchild_survives() -> None:
    """No PID namespace to end: the job's processes are still all killed, even after os._exit of the harness."""
    import sandbox_cases

    for code_ends in ("os._exit(0)", "pass"):
        marker = f"grpo-bare-escapee-{time.time_ns()}"
        code = (
            "import os, sys, time\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
            f"    os._exit(0)\ntime.sleep(0.3)\n{code_ends}\n"
        )
        result = run_tests(code, ("assert 1 + 1 == 2",), FAST, isolation="none", allow_unsandboxed=True)
        assert result.isolation.startswith("none")
        assert sandbox_cases._processes_with(marker) == [], code_ends
