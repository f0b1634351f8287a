"""Run one trial: `grpo-run trialplan.json --config run.toml --steps K --out TRIALDIR -q --force --no-checkpoint`
as a subprocess.

The engine writes, in TRIALDIR: `profile.json` (per-phase medians of every step but the first, beside
the plan's prediction), `metrics.jsonl` (one record per step) and, when it fails (exit status 1),
`failure.json`: `{"kind": "oom" | "worker_died" | "crash", "worker", "phase", "step", "message"}`.
A trial that outlives its timeout is stopped by signalling its whole process group (the engine's
workers too): SIGTERM, then SIGKILL after `KILL_GRACE_S`; a tuner killed outright takes its trial
with it (Linux parent-death signal). Every way a trial can end becomes a
`TrialOutcome`; nothing here raises for a failed run. The engine's console output goes to
TRIALDIR/grpo-run.log.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field

import grpo_pilot
from grpo_pilot.models import Frozen

Status = Literal["ok", "oom", "worker_died", "crash", "timeout"]
FAILURE_KINDS: tuple[str, ...] = ("oom", "worker_died", "crash")
KILL_GRACE_S = 10.0  # SIGTERM → SIGKILL: time for the engine to shut its workers down
LOG_TAIL_CHARS = 600  # of grpo-run's output quoted in a crash without failure.json
LOG_NAME = "grpo-run.log"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class TrialRequest(Frozen):
    """One real run of a trial plan."""

    plan_path: str = Field(description="trialplan.json.")
    config_path: str = Field(description="The sweep's run config (TOML/JSON).")
    out_dir: str = Field(description="TRIALDIR: the engine's output directory for this trial.")
    steps: int = Field(ge=1, description="GRPO steps (the first is warm-up; the later ones are measured).")
    timeout_s: float = Field(gt=0, description="Wall-clock limit of the whole run, start-up included.")
    settings: dict[str, Any] = Field(default_factory=dict, description="Extra run settings passed as --set K=V.")


class PhaseMeasurement(Frozen):
    """One phase's medians from profile.json."""

    wall_s: float | None = None
    peak_bytes: int | None = Field(default=None, description="Peak tensor bytes (tracker or max_memory_allocated).")
    rss_peak_bytes: int | None = Field(default=None, description="Process peak RSS (CPU runs).")


class Failure(Frozen):
    """Why a trial produced no measurement (the engine's failure.json, or what the runner saw)."""

    kind: Literal["oom", "worker_died", "crash", "timeout"]
    worker: str | None = None
    phase: str | None = None
    step: int | None = None
    message: str = ""


class TrialOutcome(Frozen):
    """What one real run gave: measurements, or the failure."""

    status: Status
    tokens_per_s: float | None = Field(default=None, description="Median trained tokens/s of the measured steps.")
    step_s: float | None = Field(default=None, description="Median step wall time of the measured steps.")
    phases: dict[str, PhaseMeasurement] = Field(default_factory=dict)
    steps_measured: tuple[int, ...] = ()
    step_tokens_per_s: tuple[float, ...] = Field(default=(), description="tokens/s of each measured step.")
    device: str | None = Field(default=None, description="Where the engine ran (profile.json 'device').")
    memory_source: str | None = None
    prompt_len_mean_tokens: float | None = Field(default=None, description="Mean prompt of the measured steps.")
    response_len_mean_tokens: float | None = Field(default=None, description="Mean response of the measured steps.")
    failure: Failure | None = None
    returncode: int | None = None
    wall_s: float = Field(default=0.0, ge=0.0, description="Wall time of the whole run (start-up included).")

    @property
    def peak_bytes(self) -> int | None:
        peaks = [p.peak_bytes for p in self.phases.values() if p.peak_bytes is not None]
        return max(peaks) if peaks else None


class TrialRunner(Protocol):
    def run(self, request: TrialRequest) -> TrialOutcome: ...


def grpo_run_command() -> list[str]:
    """`grpo-run` of this interpreter's environment (the console script, else the entry point via -c)."""
    script = Path(sys.executable).with_name("grpo-run")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from grpo_pilot.cli import run_entry; run_entry()"]


def _child_env() -> dict[str, str]:
    """The tuner's environment, with this grpo_pilot first on the path so the trial runs the same code."""
    env = dict(os.environ)
    root = str(Path(grpo_pilot.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL it when the tuner dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: a trial outlives a killed tuner by at most its own run


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the trial's process group, SIGKILL it after the grace period."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class SubprocessRunner:
    """Runs trials through `grpo-run` (or `command`, for tests) in a new session per trial."""

    def __init__(self, command: list[str] | None = None) -> None:
        self.command = command or grpo_run_command()

    def argv(self, request: TrialRequest) -> list[str]:
        args = [request.plan_path, "--config", request.config_path, "--steps", str(request.steps)]
        # --force: the tuner measures what the planner doubts (its own pruning already decided to run it);
        # --no-checkpoint: a trial is never resumed, so it writes none (a 3B model's end-of-run checkpoint is
        # 36 GB of fp32 weights and Adam states, and its write time is not part of what a trial measures)
        args += ["--out", request.out_dir, "-q", "--force", "--no-checkpoint"]
        for key, value in request.settings.items():
            args += ["--set", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
        return self.command + args

    def run(self, request: TrialRequest) -> TrialOutcome:
        out = Path(request.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(out / LOG_NAME, "wb") as log:
            proc = subprocess.Popen(
                self.argv(request),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_child_env(),
                start_new_session=True,  # its own process group: a timeout kills the engine's workers too
                preexec_fn=_die_with_parent,
            )
            try:
                returncode: int | None = proc.wait(timeout=request.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                returncode = None
            except BaseException:  # Ctrl-C / SIGTERM of the tuner: never leave a trial running
                _kill_group(proc)
                raise
        wall = time.monotonic() - t0
        if returncode is None:
            failure = Failure(kind="timeout", message=f"no result after {request.timeout_s:g} s; the run was killed")
            return read_outcome(out, returncode=None, wall_s=wall, forced=failure)
        return read_outcome(out, returncode=returncode, wall_s=wall)


def _log_tail(out: Path) -> str:
    try:
        text = (out / LOG_NAME).read_text(errors="replace").strip()
    except OSError:
        return ""
    return " ".join(text[-LOG_TAIL_CHARS:].split())


def read_failure(out: Path) -> Failure | None:
    """failure.json as the engine wrote it; None when absent; a crash record when unreadable."""
    path = out / "failure.json"
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        kind = raw.get("kind")
        return Failure(
            kind=kind if kind in FAILURE_KINDS else "crash",
            worker=None if raw.get("worker") is None else str(raw["worker"]),
            phase=raw.get("phase"),
            step=raw.get("step"),
            message=str(raw.get("message", "")),
        )
    except (OSError, ValueError, AttributeError) as exc:
        return Failure(kind="crash", message=f"failure.json is unreadable ({exc})")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def read_profile(out: Path) -> dict[str, Any]:
    """The fields of profile.json the tuner uses (read leniently: the engine may add fields)."""
    raw = json.loads((out / "profile.json").read_text())
    phases = {}
    for name, row in (raw.get("phases") or {}).items():
        phases[name] = PhaseMeasurement(
            wall_s=_number(row.get("measured_wall_s")),
            peak_bytes=_int(row.get("measured_peak_bytes")),
            rss_peak_bytes=_int(row.get("measured_rss_peak_bytes")),
        )
    return {
        "tokens_per_s": _number(raw.get("measured_tokens_per_s")),
        "step_s": _number((raw.get("step") or {}).get("measured_wall_s")),
        "phases": phases,
        "steps_measured": tuple(int(s) for s in raw.get("steps_measured") or ()),
        "device": raw.get("device"),
        "memory_source": raw.get("memory_source"),
    }


def read_step_rates(out: Path, measured: tuple[int, ...]) -> tuple[float, ...]:
    """tokens/s of the measured steps from metrics.jsonl (a partial last line is skipped)."""
    path = out / "metrics.jsonl"
    rates = []
    if not path.exists():
        return ()
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        rate = _number(record.get("tokens_per_s"))
        if record.get("step") in measured and rate is not None:
            rates.append(rate)
    return tuple(rates)


def read_lengths(out: Path, measured: tuple[int, ...]) -> dict[str, float]:
    """Mean prompt and response tokens of the measured steps from the engine's lengths.jsonl (empty
    when absent): the lengths the measured time was spent on, which calibration evaluates the planner at."""
    path = out / "lengths.jsonl"
    if not path.exists():
        return {}
    prompts, responses = [], []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        prompt, response = _number(row.get("prompt_tokens")), _number(row.get("response_tokens"))
        if row.get("step") in measured and prompt is not None and response is not None:
            prompts.append(prompt)
            responses.append(response)
    if not prompts:
        return {}
    return {
        "prompt_len_mean_tokens": sum(prompts) / len(prompts),
        "response_len_mean_tokens": sum(responses) / len(responses),
    }


def read_outcome(out: Path, *, returncode: int | None, wall_s: float, forced: Failure | None = None) -> TrialOutcome:
    """The outcome from TRIALDIR's files and the exit status (pure apart from reading files)."""
    failure = forced or read_failure(out)
    if failure is None and returncode != 0:
        tail = _log_tail(out)
        message = f"grpo-run exited with status {returncode}" + (f": {tail}" if tail else "")
        failure = Failure(kind="crash", message=message)
    if failure is None and not (out / "profile.json").exists():
        failure = Failure(kind="crash", message="grpo-run exited 0 but wrote no profile.json")
    profile: dict[str, Any] = {}
    if failure is None:
        try:
            profile = read_profile(out)
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            failure = Failure(kind="crash", message=f"profile.json is unreadable ({exc})")
    if failure is None and not profile.get("tokens_per_s"):
        failure = Failure(kind="crash", message="profile.json has no measured throughput (no step was measured)")
    if failure is not None:
        return TrialOutcome(status=failure.kind, failure=failure, returncode=returncode, wall_s=wall_s)
    return TrialOutcome(
        status="ok",
        step_tokens_per_s=read_step_rates(out, profile["steps_measured"]),
        **read_lengths(out, profile["steps_measured"]),
        returncode=returncode,
        wall_s=wall_s,
        **profile,
    )
