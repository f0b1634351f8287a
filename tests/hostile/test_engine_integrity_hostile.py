"""grpo-run's engine against hostile input: code tests it cannot judge, forged rewards, poisoned checkpoints,
non-finite numbers, foreign files in --out, signals (issue 16). Each case checks the exit status docs/inputs.md
documents, the one-paragraph message, and that nothing was left half-written."""

from __future__ import annotations

import json

import pytest
from hostile_helpers import RUN_GOOD, TINY_PLAN, assert_refused, invoke

from grpo_pilot.cli.run import app

RUN_CODE = [a if a != "char_fraction:char=a" else "code:timeout_s=5" for a in RUN_GOOD] + ["--allow-unsandboxed-code"]

UNJUDGEABLE_TESTS = [
    ("raise-instead-of-assert", "if add(2, 3) != 5:\n    raise AssertionError", "has no assert"),
    ("no-assert", "add(2, 3)", "has no assert"),
    ("assert-under-if", "if add(2, 3):\n    assert add(2, 3) == 5", "run only on some paths"),
    ("expected-in-sandbox", "x = 5\nassert add(2, 3) == x", "compares two values computed in the sandbox"),
]


@pytest.mark.parametrize("name,test,fragment", UNJUDGEABLE_TESTS, ids=[c[0] for c in UNJUDGEABLE_TESTS])
def test_code_tests_that_cannot_be_judged_are_refused(scratch, tmp_path, name, test, fragment):
    data = tmp_path / "code.jsonl"
    lines = [{"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3"]}] * 2
    lines.append({"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3", test]})
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    scratch.mark()
    args = [TINY_PLAN, *RUN_CODE, "--dataset", data, "--out", scratch.root / "run"]
    assert_refused(invoke(app, args), 2, "cannot judge test 2 of line 3", fragment)
    scratch.check()


def assert_failed(result, *fragments: str) -> str:
    """Exit 1 (a run failure) through SystemExit, one paragraph starting 'failed: ', no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if not line.startswith(("warning: ", "note: "))]
    assert lines and lines[-1].startswith("failed: ") and len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    return result.stderr


REWARD_VALUES = [
    ("1e39", "1e39", "beyond float32"),  # finite in float64, infinite in float32
    ("1e300", "1e300 if len(completion) % 2 else -1e300", "beyond float32"),
    ("10**400", "10**400", "a number of about 401 digits"),
    ("nan", "float('nan')", "returned nan"),
]


@pytest.mark.parametrize("name,expr,fragment", REWARD_VALUES, ids=[c[0] for c in REWARD_VALUES])
def test_rewards_beyond_float32_stop_the_run_before_any_update(tmp_path, name, expr, fragment):
    reward = tmp_path / "huge.py"
    reward.write_text(f"def score(completion, record):\n    return {expr}\n")
    out = tmp_path / "run"
    args = [TINY_PLAN, *RUN_GOOD, "--reward", f"{reward}:score", "--out", out, "--set", "checkpoint_every=1"]
    assert_failed(invoke(app, args), "The reward", fragment)
    failure = json.loads((out / "failure.json").read_text())
    assert failure["kind"] == "crash" and failure["phase"] == "reward" and failure["step"] == 1
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").glob("step-*"))
    assert not (out / "metrics.jsonl").exists() or (out / "metrics.jsonl").read_text() == ""


def test_a_batched_reward_returning_a_dict_is_refused(tmp_path):
    reward = tmp_path / "keys.py"
    reward.write_text("def score(completions, records):\n    return {0.5: 'a', 1.0: 'b'}\n")
    out = tmp_path / "run"
    args = [TINY_PLAN, *RUN_GOOD, "--reward", f"{reward}:score", "--out", out]
    assert_failed(invoke(app, args), "returned dict, not a list of numbers")


WEIGHTS = [
    ("1e308-each", "char_fraction:char=a;weight=1e308,length=1e308:max_len=16", "beyond float32"),
    ("sum-overflows", "char_fraction:char=a;weight=3e38,length=3e38:max_len=16", "can sum to 6e+38"),
]


@pytest.mark.parametrize("name,spec,fragment", WEIGHTS, ids=[c[0] for c in WEIGHTS])
def test_reward_weights_that_overflow_float32_are_refused(scratch, name, spec, fragment):
    scratch.mark()
    args = [TINY_PLAN, *RUN_GOOD, "--reward", spec, "--out", scratch.root / "run"]
    assert_refused(invoke(app, args), 2, fragment)
    scratch.check()


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_run_like_a_failure(tmp_path, signame):
    """SIGTERM / SIGINT during the reward phase: failure.json says where, the reward's worker is stopped,
    the lock is released, one line is printed and the exit status is 130 (docs/run.md)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from grpo_pilot.outputs import LOCK_NAME, DirectoryLock

    started = tmp_path / "reward-started"
    reward = tmp_path / "slow.py"
    reward.write_text(
        "import os, time\n"
        "def score(completion, record):\n"
        f"    open({str(started)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
        f"    os.replace({str(started)!r} + '.tmp', {str(started)!r})\n"
        "    time.sleep(600)\n"
    )
    out = tmp_path / "run"
    argv = [sys.executable, "-c", "from grpo_pilot.cli import run_entry; run_entry()", TINY_PLAN, *RUN_GOOD]
    argv += ["--reward", f"{reward}:score", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    # a shell without job control starts background jobs with SIGINT ignored, and Python then installs no
    # KeyboardInterrupt handler (it respects SIG_IGN, as grpo-run does): give the run the default disposition
    # a terminal's Ctrl-C reaches, whatever launched this test
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 180
        while not started.exists():  # the event: the reward is running (step 1, reward phase)
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        worker = int(started.read_text())
        proc.send_signal(getattr(signal, signame))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [
        f"interrupted: terminated by signal {signame} in the reward phase of step 1; failure.json records it"
    ]
    failure = json.loads((out / "failure.json").read_text())
    assert failure["kind"] == "interrupted" and failure["phase"] == "reward" and failure["step"] == 1
    assert signame in failure["message"]
    assert not _alive(worker)  # the reward's worker process is gone with the run
    with DirectoryLock(out, "test"):  # the lock was released
        pass
    assert (out / LOCK_NAME).exists() and not list(out.glob("checkpoints/step-*"))


def test_a_gpu_plan_on_a_machine_without_those_gpus_is_refused_before_any_cluster_starts(scratch, tmp_path):
    import sys

    from hostile_helpers import TINY_MODEL_FLAGS

    from grpo_pilot.cli.plan import app as plan_app

    plan = tmp_path / "plan-8gpu.json"
    flags = [f if f != "1xcpu" else "8xH100-80G" for f in TINY_MODEL_FLAGS]
    made = invoke(plan_app, [*flags, "--out", plan])
    assert made.exit_code == 0, made.output
    scratch.mark()
    result = invoke(app, [plan, *RUN_GOOD, "--out", scratch.root / "run"])
    assert_refused(result, 2, "runs 8 GPU worker(s)", "this machine has 0 GPU(s)", "--device cpu")
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()  # refused before Ray was started (or even imported)
    scratch.check()


def test_gpus_smaller_than_the_plans_are_refused():
    from grpo_pilot.engine.ray_cluster import check_local_gpus
    from grpo_pilot.engine.topology import build_topology
    from grpo_pilot.errors import InputError

    topo = build_topology(
        num_nodes=1, per_node=2, placement="colocated", rollout_per_node=0, rollout_tp=1, device_kind="cuda"
    )
    h100 = 80 * 2**30
    check_local_gpus(topo, "cuda", plan_gpu="H100-80G", plan_gpu_bytes=h100, local=[("H100", h100)] * 2)
    check_local_gpus(topo, "cpu", plan_gpu="H100-80G", plan_gpu_bytes=h100, local=[])  # --device cpu
    with pytest.raises(InputError, match="this machine has 1 GPU"):
        check_local_gpus(topo, "cuda", plan_gpu="H100-80G", plan_gpu_bytes=h100, local=[("H100", h100)])
    with pytest.raises(InputError, match="GPU 1 here is RTX 4090 with 24.0 GiB"):
        check_local_gpus(
            topo, "cuda", plan_gpu="H100-80G", plan_gpu_bytes=h100, local=[("H100", h100), ("RTX 4090", 24 << 30)]
        )
