"""Run untrusted Python code against assert tests in an isolated, resource-limited process.

`run_tests(code, tests, limits, isolation="auto")`:
1. seals the tests (`sealed.py`): every assert becomes a probe; the expected values stay here;
2. starts `_sandbox_harness.py` inside a sandbox (`isolation.py`: bubblewrap, else util-linux
   unshare; as root, as `nobody`), writes the code and the sealed tests on its stdin and reads JSON
   lines from its stdout until it ends, the wall-clock timeout passes or it writes more than
   `MAX_CHANNEL_BYTES`; the harness applies the rlimits before the code runs;
3. kills the sandbox's process group in every case (the PID namespace takes every descendant with
   it) and judges each test here from the reported values.

`isolation="none"` (only with `allow_unsandboxed=True`, the `--allow-unsandboxed-code` flag) runs the
harness directly in a temporary directory: resource limits, a new session, `nobody` when root, but
the code can read what that user can read and use the network. With no PID namespace to end, the job's
processes are found and killed by their parent links and an environment mark (engine/proctree.py):
a `setsid()` grandchild is stopped with the job, even when the code ends the harness with `os._exit`.
`run_many` runs jobs on a small thread
pool (each thread waits on one sandbox).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple, Sequence

from pydantic import Field

from grpo_pilot.engine.proctree import MARKER_ENV, kill_tree, new_token
from grpo_pilot.engine.rewards import isolation as iso
from grpo_pilot.engine.rewards.sealed import judge, seal_tests
from grpo_pilot.errors import InputError, RunError
from grpo_pilot.models import Frozen

HARNESS = Path(__file__).with_name("_sandbox_harness.py")
NOBODY_ID = iso.NOBODY_ID
MAX_CHANNEL_BYTES = 4 << 20
MAX_STDERR_BYTES = 64 << 10
MIB = 1 << 20
Isolation = Literal["auto", "bwrap", "unshare", "none"]


class SandboxLimits(Frozen):
    """Resource limits of one sandboxed run."""

    timeout_s: float = Field(default=5.0, gt=0, le=600, description="Wall-clock limit, process start included.")
    cpu_s: float = Field(default=5.0, gt=0, le=600, description="CPU-time limit (RLIMIT_CPU) for the code.")
    memory_bytes: int = Field(default=512 * MIB, ge=64 * MIB, description="Address-space limit (RLIMIT_AS).")
    max_procs: int = Field(default=16, ge=1, le=4096, description="Processes/threads the code may add (RLIMIT_NPROC).")
    max_file_bytes: int = Field(default=16 * MIB, ge=0, description="Largest file the code may write (RLIMIT_FSIZE).")
    max_open_files: int = Field(default=64, ge=16, description="Open file descriptors (RLIMIT_NOFILE).")
    tmp_bytes: int = Field(default=64 * MIB, ge=MIB, description="Size of the private /tmp and /dev/shm (each).")


class SandboxResult(Frozen):
    """Outcome of one sandboxed run: which tests passed (judged by the parent), and how the process ended."""

    passed: tuple[bool, ...] = Field(description="One flag per test, in order; unfinished tests count as failed.")
    status: Literal["ok", "solution_error", "timeout", "killed"] = Field(
        description="ok: ran to the end; solution_error: the code raised; timeout: wall clock; "
        "killed: a limit or signal."
    )
    wall_s: float = Field(ge=0, description="Wall time of the sandbox, start-up included.")
    isolation: str = Field(
        description="bwrap | unshare | none, and the user the code ran as (e.g. 'bwrap, uid 65534', "
        "'none, nobody+read'); 'unknown' when it ended before reporting."
    )

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


NO_SANDBOX_HINT = (
    "Install bubblewrap (`apt-get install bubblewrap`) or allow unprivileged user namespaces "
    "(sysctl user.max_user_namespaces > 0; on Ubuntu also kernel.apparmor_restrict_unprivileged_userns=0), "
    "then check with `grpo-run --check-sandbox`. Or pass --allow-unsandboxed-code to run it with resource "
    "limits only: the code can then read every file your user can read and use the network."
)


def resolve_isolation(requested: Isolation, *, allow_unsandboxed: bool) -> iso.Mechanism:
    """The mechanism a run uses; `InputError` when none isolates and unsandboxed code is not allowed."""
    if requested == "none":
        if not allow_unsandboxed:
            raise InputError("The 'code' reward was asked to run without a sandbox (sandbox=none).", NO_SANDBOX_HINT)
        return "none"
    report = iso.choose(requested)
    if report.available:
        return report.mechanism
    if requested == "auto" and allow_unsandboxed:
        return "none"
    reports = [report] if requested != "auto" else [iso.probe("bwrap"), iso.probe("unshare")]
    reasons = "; ".join(f"{r.mechanism}: {r.reason}" for r in reports)
    raise InputError(
        f"The 'code' reward runs the completions' code, and this machine gives no sandbox for it ({reasons}).",
        NO_SANDBOX_HINT,
    )


@lru_cache(maxsize=1)
def _harness_source() -> str:
    return HARNESS.read_text()


def _bare_interpreter() -> iso.Interpreter:
    path = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return iso.Interpreter(path=path, prefix=sys.base_prefix, version="%d.%d.%d" % sys.version_info[:3])


def _bare_env(work: Path) -> dict[str, str]:
    return {**iso.ENV, **iso.ENV_THREADS, "HOME": str(work), "TMPDIR": str(work), "PATH": os.defpath}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Write the payload and close stdin (in a thread: a large payload must not block the reader)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        return


def _collect(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[bytes, bytes, bool]:
    """(stdout, stderr, timed out): read both pipes until EOF on stdout, the deadline or the byte cap."""
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        open_streams = 2
        while open_streams:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), bytes(err), True
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    open_streams -= 1
                    if key.data is out:
                        return bytes(out), bytes(err), False  # the channel closed: every writer is gone
                    continue
                key.data.extend(chunk)
                if len(out) > MAX_CHANNEL_BYTES:
                    return bytes(out[:MAX_CHANNEL_BYTES]), bytes(err), False
                if len(err) > MAX_STDERR_BYTES:
                    selector.unregister(key.fileobj)
                    open_streams -= 1
    return bytes(out), bytes(err), False


def _messages(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for line in raw.split(b"\n"):
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(message, dict):
            out.append(message)
    return out


class _Launch(NamedTuple):
    """Where and as whom the harness runs: bare mode's private directory and process marker, the interpreter,
    its environment and the Popen user arguments."""

    work: Path | None
    token: str | None
    interpreter: iso.Interpreter
    env: dict[str, str]
    user: dict[str, object]


def _launch(mechanism: iso.Mechanism) -> _Launch:
    """Bare mode (`none`): a fresh directory (the harness's, owned by nobody when we are root) and a marker
    token; a namespace mechanism: the sandbox user's interpreter and environment."""
    if mechanism == "none":
        work = Path(tempfile.mkdtemp(prefix="grpo_pilot_sandbox_"))
        if os.geteuid() == 0:  # the harness drops to nobody: it may only write in its directory
            os.chown(work, NOBODY_ID, NOBODY_ID)
        token = new_token()  # marks the job's processes, setsid ones included (proctree.py)
        return _Launch(work, token, _bare_interpreter(), {**_bare_env(work), MARKER_ENV: token}, {})
    uid = iso.sandbox_uid()
    found = iso.interpreter_for(uid)
    assert found is not None, "resolve_isolation checked that an interpreter exists"
    return _Launch(None, None, found, iso.launch_env(mechanism), iso.as_user(uid))


def run_tests(
    code: str,
    tests: Sequence[str],
    limits: SandboxLimits,
    *,
    isolation: Isolation = "auto",
    allow_unsandboxed: bool = False,
) -> SandboxResult:
    """Run `code`, then each assert test, isolated; see the module docstring."""
    mechanism = resolve_isolation(isolation, allow_unsandboxed=allow_unsandboxed)
    sealed = seal_tests(tests)
    payload: dict[str, Any] = {"code": code, "tests": list(sealed.sources), "limits": limits.model_dump()}
    work, token, interpreter, env, user = _launch(mechanism)
    if work is not None:
        payload["workdir"] = str(work)
    mode = "bare" if mechanism == "none" else "ns"
    try:
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                iso.command(
                    mechanism=mechanism,
                    interpreter=interpreter,
                    program=_harness_source(),
                    argument=mode,
                    tmp_bytes=limits.tmp_bytes,
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=str(work) if work else "/",
                env=env,
                start_new_session=True,
                close_fds=True,
                **user,  # type: ignore[arg-type]
            )
        except OSError as exc:
            raise RunError(
                f"The code sandbox ({mechanism}) could not be started: {exc}.", "Check `grpo-run --check-sandbox`."
            ) from None
        writer = threading.Thread(target=_feed, args=(proc, json.dumps(payload).encode()), daemon=True)
        writer.start()
        try:
            out, err, timed_out = _collect(proc, limits.timeout_s)
        finally:
            if mechanism == "none":  # no PID namespace: the harness's tree and what left its session
                kill_tree(proc.pid, token)
            _kill_group(proc.pid)  # the sandbox (and with it its PID namespace) ends here in every case
            proc.wait()
            writer.join()
            for stream in (proc.stdout, proc.stderr):
                assert stream is not None
                stream.close()
        wall_s = time.perf_counter() - start
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    messages = _messages(out)
    ready = next((m for m in messages if m.get("k") == "ready"), None)
    if ready is None and not timed_out:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise RunError(
            f"The code sandbox ({mechanism}) failed to start: {' | '.join(tail) or f'exit status {proc.returncode}'}.",
            "Check it with `grpo-run --check-sandbox`.",
        )
    solution = next((m for m in messages if m.get("k") == "solution"), {})
    done = any(m.get("k") == "done" for m in messages)
    finished = "ok" if solution.get("ok") is True else "solution_error"
    status = "timeout" if timed_out else finished if done else "killed"
    who = str(ready.get("user", "unknown")) if ready else "unknown"
    return SandboxResult(passed=judge(sealed, messages), status=status, wall_s=wall_s, isolation=f"{mechanism}, {who}")


def run_many(
    jobs: Sequence[tuple[str, Sequence[str]]],
    limits: SandboxLimits,
    *,
    workers: int,
    isolation: Isolation = "auto",
    allow_unsandboxed: bool = False,
) -> list[SandboxResult]:
    """`run_tests` for each (code, tests) job, `workers` at a time; results in job order."""
    if not jobs:
        return []

    def one(job: tuple[str, Sequence[str]]) -> SandboxResult:
        return run_tests(job[0], job[1], limits, isolation=isolation, allow_unsandboxed=allow_unsandboxed)

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs))), thread_name_prefix="sandbox") as pool:
        return list(pool.map(one, jobs))
