"""Run untrusted Python code against assert tests in a separate, confined process.

`run_tests(code, tests, limits)` starts `python -I _sandbox_harness.py TMPDIR` in a new session
(its own process group) with stdin/stdout/stderr detached, a minimal environment and a fresh
temporary directory; the child applies CPU-time, address-space, file-size, open-file and process
rlimits and drops root to `nobody` before it runs the code (see `_sandbox_harness.py`). The parent
enforces the wall-clock timeout, kills the whole process group afterwards in every case, and
removes the directory. `run_many` runs several jobs on a small thread pool (each thread waits on
one child process). A completion that hangs, forks, allocates without bound or writes files can
therefore cost at most `timeout_s` of wall time per job and never touches the run's process.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Sequence

from pydantic import Field

from grpo_pilot.models import Frozen

HARNESS = Path(__file__).with_name("_sandbox_harness.py")
NOBODY_ID = 65534
MAX_RESULTS_BYTES = 1 << 20
MIB = 1 << 20


class SandboxLimits(Frozen):
    """Resource limits of one sandboxed run."""

    timeout_s: float = Field(default=5.0, gt=0, le=600, description="Wall-clock limit, process start included.")
    cpu_s: float = Field(default=5.0, gt=0, le=600, description="CPU-time limit (RLIMIT_CPU) for the code.")
    memory_bytes: int = Field(default=512 * MIB, ge=64 * MIB, description="Address-space limit (RLIMIT_AS).")
    max_procs: int = Field(default=16, ge=1, le=4096, description="Processes/threads the code may add (RLIMIT_NPROC).")
    max_file_bytes: int = Field(default=16 * MIB, ge=0, description="Largest file the code may write (RLIMIT_FSIZE).")
    max_open_files: int = Field(default=64, ge=16, description="Open file descriptors (RLIMIT_NOFILE).")


class SandboxResult(Frozen):
    """Outcome of one sandboxed run: which tests passed, and how the process ended."""

    passed: tuple[bool, ...] = Field(description="One flag per test, in order; unfinished tests count as failed.")
    status: Literal["ok", "solution_error", "timeout", "killed"] = Field(
        description="ok: ran to the end; solution_error: the code raised; timeout: wall clock; killed: a limit or signal."
    )
    wall_s: float = Field(ge=0, description="Wall time of the child process.")
    isolation: str = Field(
        description="How the child was confined: nobody, nobody+read (root dropped, read access kept), "
        "user (not root: own uid), root (could not leave root), unknown (died before reporting)."
    )

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def _child_env(work: Path) -> dict[str, str]:
    return {
        "PATH": os.defpath,
        "LANG": "C.UTF-8",
        "HOME": str(work),
        "TMPDIR": str(work),
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _read_results(path: Path, nonce: str, num_tests: int) -> tuple[list[bool], bool, bool, str]:
    """(passed flags, solution ran cleanly, reached the end, isolation) from the harness's lines."""
    passed = [False] * num_tests
    solution_ok, done, isolation = False, False, "unknown"
    if not path.exists():
        return passed, solution_ok, done, isolation
    with path.open("rb") as fh:
        text = fh.read(MAX_RESULTS_BYTES).decode("utf-8", "replace")
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2 or words[0] != nonce:
            continue
        if words[1] == "isolation" and len(words) == 3:
            isolation = words[2]
        elif words[1:3] == ["solution", "ok"]:
            solution_ok = True
        elif words[1] == "done":
            done = True
        elif words[1] == "test" and len(words) == 4 and words[2].isdigit() and int(words[2]) < num_tests:
            passed[int(words[2])] = words[3] == "pass"
    return passed, solution_ok, done, isolation


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


def run_tests(code: str, tests: Sequence[str], limits: SandboxLimits) -> SandboxResult:
    """Run `code`, then each assert in `tests`, in a confined child; see the module docstring."""
    root = Path(tempfile.mkdtemp(prefix="grpo_pilot_sandbox_"))
    try:
        work = root / "work"
        work.mkdir()
        if os.geteuid() == 0:  # the child drops to nobody: it may cross root/ but only write in work/
            os.chown(work, NOBODY_ID, NOBODY_ID)
            root.chmod(0o711)
        payload = {"code": code, "tests": list(tests), "limits": limits.model_dump()}
        (root / "payload.json").write_text(json.dumps(payload))
        nonce = secrets.token_hex(16)
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-I", str(HARNESS), str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=root,
            env=_child_env(work),
            start_new_session=True,
            close_fds=True,
        )
        timed_out = False
        try:
            proc.communicate(input=f"{nonce}\n".encode(), timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)  # stray children of the code die with the group, in every case
            proc.wait()
        wall_s = time.perf_counter() - start
        passed, solution_ok, done, isolation = _read_results(root / "results", nonce, len(tests))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if timed_out:
        status = "timeout"
    elif done:
        status = "ok" if solution_ok else "solution_error"
    else:
        status = "killed"
    return SandboxResult(passed=tuple(passed), status=status, wall_s=wall_s, isolation=isolation)


def run_many(jobs: Sequence[tuple[str, Sequence[str]]], limits: SandboxLimits, *, workers: int) -> list[SandboxResult]:
    """`run_tests` for each (code, tests) job, `workers` at a time; results in job order."""
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs))), thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run_tests(job[0], job[1], limits), jobs))
