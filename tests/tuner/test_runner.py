"""One trial as a subprocess: every way a run can end becomes a TrialOutcome (no real engine here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from grpo_pilot.tuner.runner import SubprocessRunner, TrialRequest, read_outcome

PROFILE = {
    "schema_version": 1,
    "device": "cpu",
    "memory_source": "live tensor bytes (TorchDispatchMode tracker)",
    "steps_measured": [2, 3],
    "phases": {
        "rollout": {"measured_wall_s": 0.05, "measured_peak_bytes": 2_900_000, "measured_rss_peak_bytes": 480_000_000},
        "update": {"measured_wall_s": 0.08, "measured_peak_bytes": 7_300_000, "measured_rss_peak_bytes": 481_000_000},
        "log_prob": {"measured_wall_s": None, "measured_peak_bytes": None},
    },
    "step": {"measured_wall_s": 0.13},
    "measured_tokens_per_s": 5700.5,
    "a_field_a_newer_engine_adds": {"x": 1},
}


def _write_run(path, *, profile=PROFILE, steps=(1, 2, 3), partial_line=False):
    path.mkdir(parents=True, exist_ok=True)
    (path / "profile.json").write_text(json.dumps(profile))
    lines = [json.dumps({"step": s, "tokens_per_s": 1000.0 * s}) for s in steps]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + ('{"step": 4, "tok' if partial_line else ""))


def test_success_reads_profile_and_measured_steps(tmp_path):
    _write_run(tmp_path, partial_line=True)
    out = read_outcome(tmp_path, returncode=0, wall_s=7.5)
    assert out.status == "ok" and out.failure is None
    assert out.tokens_per_s == 5700.5 and out.step_s == 0.13
    assert out.steps_measured == (2, 3)
    assert out.step_tokens_per_s == (2000.0, 3000.0)  # step 1 is warm-up; the partial line is skipped
    assert out.phases["update"].peak_bytes == 7_300_000 and out.phases["update"].wall_s == 0.08
    assert out.phases["log_prob"].wall_s is None
    assert out.peak_bytes == 7_300_000
    assert out.device == "cpu" and out.wall_s == 7.5


def test_engine_failure_json_is_the_reason(tmp_path):
    _write_run(tmp_path)  # a profile from earlier steps must not turn a failure into a success
    (tmp_path / "failure.json").write_text(
        json.dumps({"kind": "oom", "worker": "rank1", "phase": "update", "step": 2, "message": "cap 8 MiB exceeded"})
    )
    out = read_outcome(tmp_path, returncode=1, wall_s=3.0)
    assert out.status == "oom" and out.tokens_per_s is None
    assert (out.failure.worker, out.failure.phase, out.failure.step) == ("rank1", "update", 2)
    assert out.failure.message == "cap 8 MiB exceeded"


def test_worker_died_and_unknown_kinds(tmp_path):
    (tmp_path / "failure.json").write_text(json.dumps({"kind": "worker_died", "worker": 3, "message": "SIGKILL"}))
    out = read_outcome(tmp_path, returncode=1, wall_s=1.0)
    assert out.status == "worker_died" and out.failure.worker == "3"
    (tmp_path / "failure.json").write_text(json.dumps({"kind": "meltdown", "message": "?"}))
    assert read_outcome(tmp_path, returncode=1, wall_s=1.0).status == "crash"
    (tmp_path / "failure.json").write_text('{"kind": "oom", ')
    out = read_outcome(tmp_path, returncode=1, wall_s=1.0)
    assert out.status == "crash" and "failure.json is unreadable" in out.failure.message


def test_nonzero_exit_without_failure_json_quotes_the_log(tmp_path):
    (tmp_path / "grpo-run.log").write_text("loading...\nerror: No run config at 'x.toml'.\n")
    out = read_outcome(tmp_path, returncode=2, wall_s=1.0)
    assert out.status == "crash" and out.returncode == 2
    assert "status 2" in out.failure.message and "No run config at 'x.toml'" in out.failure.message


def test_success_without_profile_or_throughput_is_a_crash(tmp_path):
    out = read_outcome(tmp_path, returncode=0, wall_s=1.0)
    assert out.status == "crash" and "no profile.json" in out.failure.message
    _write_run(tmp_path, profile={**PROFILE, "measured_tokens_per_s": None})
    assert "no measured throughput" in read_outcome(tmp_path, returncode=0, wall_s=1.0).failure.message
    (tmp_path / "profile.json").write_text("{")
    assert "profile.json is unreadable" in read_outcome(tmp_path, returncode=0, wall_s=1.0).failure.message


FAKE_ENGINE = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    out = sys.argv[sys.argv.index("--out") + 1]
    os.makedirs(out, exist_ok=True)
    json.dump(sys.argv[1:], open(os.path.join(out, "argv.json"), "w"))
    mode = os.environ["FAKE_MODE"]
    if mode == "hang":  # a worker in the same process group, then hang
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open(os.path.join(out, "child.pid"), "w").write(str(child.pid))
        open(os.path.join(out, "engine.pid"), "w").write(str(os.getpid()))
        time.sleep(120)
    elif mode == "oom":
        json.dump({"kind": "oom", "worker": None, "phase": "update", "step": 1, "message": "over cap"},
                  open(os.path.join(out, "failure.json"), "w"))
        print("engine: out of memory", flush=True)
        sys.exit(1)
    """
)


def _runner(tmp_path, mode, monkeypatch):
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_ENGINE)
    monkeypatch.setenv("FAKE_MODE", mode)
    return SubprocessRunner([sys.executable, str(script)])


def _request(tmp_path, **kw):
    fields = dict(plan_path="p.json", config_path="c.toml", out_dir=str(tmp_path / "trial"), steps=3, timeout_s=60.0)
    return TrialRequest(**{**fields, **kw})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie is dead for our purpose
        return handle.read().split()[2] != "Z"


def test_timeout_kills_the_whole_process_group(tmp_path, monkeypatch):
    runner = _runner(tmp_path, "hang", monkeypatch)
    t0 = time.monotonic()
    out = runner.run(_request(tmp_path, timeout_s=3.0))
    assert out.status == "timeout" and out.returncode is None
    assert "no result after 3 s" in out.failure.message
    assert time.monotonic() - t0 < 30
    child = int((tmp_path / "trial" / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_failure_through_the_subprocess_and_the_argv(tmp_path, monkeypatch):
    runner = _runner(tmp_path, "oom", monkeypatch)
    out = runner.run(_request(tmp_path, settings={"memory_cap_bytes": 8_000_000, "cpu_memory": "tensors"}))
    assert out.status == "oom" and out.failure.phase == "update" and out.returncode == 1
    argv = json.loads((tmp_path / "trial" / "argv.json").read_text())
    assert argv == [
        "p.json", "--config", "c.toml", "--steps", "3", "--out", str(tmp_path / "trial"), "-q", "--force",
        "--no-checkpoint", "--set", "memory_cap_bytes=8000000", "--set", "cpu_memory=tensors",
    ]  # fmt: skip
    assert "engine: out of memory" in (tmp_path / "trial" / "grpo-run.log").read_text()


def _wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def test_a_killed_tuner_takes_its_trial_with_it(tmp_path, monkeypatch):
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_ENGINE)
    tuner = tmp_path / "tuner.py"
    tuner.write_text(
        textwrap.dedent(
            f"""
            import sys
            from grpo_pilot.tuner.runner import SubprocessRunner, TrialRequest
            runner = SubprocessRunner([sys.executable, {str(script)!r}])
            runner.run(TrialRequest(plan_path="p", config_path="c", out_dir={str(tmp_path / "trial")!r}, steps=3,
                                    timeout_s=120))
            """
        )
    )
    env = {**os.environ, "FAKE_MODE": "hang", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen([sys.executable, str(tuner)], env=env)
    pid_file = tmp_path / "trial" / "child.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    engine, worker = int((tmp_path / "trial" / "engine.pid").read_text()), int(pid_file.read_text())
    parent.kill()  # SIGKILL: no handler runs in the tuner
    parent.wait()
    assert _wait_dead(engine)  # the trial's process dies with the tuner
    os.kill(worker, signal.SIGKILL)  # its own workers are the engine's to stop; clean up here


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny"


def test_a_real_trial_writes_no_checkpoint_and_leaves_none_behind(tmp_path):
    # the real grpo-run on the tiny example, as the sweep runs it: the run config asks for a checkpoint every step,
    # and the trial still writes none (a trial is never resumed)
    config = tmp_path / "run.toml"
    config.write_text(
        f'dataset = "{EXAMPLE / "prompts.jsonl"}"\nreward = "char_fraction:char=a"\nthreads = 1\n'
        "checkpoint_every = 1\nmax_new_tokens = 4\n"
    )
    request = TrialRequest(
        plan_path=str(EXAMPLE / "plan.json"), config_path=str(config), out_dir=str(tmp_path / "trial"), steps=2,
        timeout_s=600.0, settings={"cpu_memory": "rss"},
    )  # fmt: skip
    out = SubprocessRunner().run(request)
    assert out.status == "ok", out.failure
    assert out.steps_measured == (2,)
    assert (tmp_path / "trial" / "metrics.jsonl").read_text().count("\n") == 2
    assert not (tmp_path / "trial" / "checkpoints").exists()
    assert json.loads((tmp_path / "trial" / "run_config.json").read_text())["checkpoint"] is False
