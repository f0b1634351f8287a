"""Load a user callable named `module.path:function` or `path/to/file.py:function`.

Used for data transforms and user reward functions. The part after the last ':' may be dotted
(`Class.method`). A reference whose left part ends in `.py` or contains a path separator is a file,
imported under a private module name; otherwise it is a module imported from `sys.path` plus the
current directory (appended, so it never shadows installed packages). Every failure is an
`InputError` that names the reference and what to fix.

`UserFunction(ref, role=..., timeout_s=...)` is how the engine runs user code: in a worker process
(`user_worker.py`), with a per-call timeout, so that a hang, `sys.exit()`, `KeyboardInterrupt` or a
crashing extension inside the user's function becomes an error naming it instead of ending or hanging
the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import pickle
import select
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Sequence

from grpo_pilot.engine.data.frames import HEADER
from grpo_pilot.engine.proctree import MARKER_ENV, kill_tree, new_token
from grpo_pilot.errors import InputError, RunError


def is_callable_ref(text: str) -> bool:
    """Whether `text` has the shape `left:name` with an identifier (possibly dotted) after the colon."""
    if ":" not in text:
        return False
    left, name = text.rsplit(":", 1)
    return bool(left) and all(part.isidentifier() for part in name.split("."))


def _is_file_ref(left: str) -> bool:
    return left.endswith(".py") or "/" in left or os.sep in left


def _import_file(path_text: str, ref: str, role: str) -> ModuleType:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise InputError(
            f"The {role} '{ref}' points at '{path_text}', which is not a file.",
            f"Give a path to a .py file (relative to {os.getcwd()}) or an importable module name.",
        )
    resolved = path.resolve()
    name = f"grpo_pilot_user_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise InputError(f"The {role} '{ref}': '{path_text}' cannot be loaded as Python.", "Use a .py file.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file failed at import time: report it, do not crash
        del sys.modules[name]
        raise InputError(
            f"The {role} '{ref}': importing '{path_text}' raised {type(exc).__name__}: {exc}.",
            "Fix the file so that it imports cleanly (try `python -c 'import runpy; runpy.run_path(PATH)'`).",
        ) from exc
    return module


def _import_module(module_name: str, ref: str, role: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InputError(
            f"The {role} '{ref}': module '{module_name}' is not importable ({exc}).",
            "Install the package, run from the directory that holds it, or give a file: path/to/file.py:function.",
        ) from exc
    except Exception as exc:
        raise InputError(
            f"The {role} '{ref}': importing module '{module_name}' raised {type(exc).__name__}: {exc}.",
            "Fix the module so that it imports cleanly.",
        ) from exc


def _public_functions(module: ModuleType) -> list[str]:
    return sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_") and inspect.isfunction(v))


def load_callable(ref: str, *, role: str) -> Callable[..., Any]:
    """The callable named by `ref`; `role` ('data transform', 'reward function') appears in errors."""
    if not is_callable_ref(ref):
        raise InputError(
            f"The {role} '{ref}' is not of the form module:function or path/to/file.py:function.",
            "Example: mypkg.rewards:score or ./my_reward.py:score.",
        )
    left, name = ref.rsplit(":", 1)
    module = _import_file(left, ref, role) if _is_file_ref(left) else _import_module(left, ref, role)
    target: Any = module
    for part in name.split("."):
        if not hasattr(target, part):
            available = ", ".join(_public_functions(module)) or "none"
            raise InputError(
                f"The {role} '{ref}': '{left}' has no attribute '{name}'.",
                f"Functions defined there: {available}.",
            )
        target = getattr(target, part)
    if not callable(target):
        raise InputError(f"The {role} '{ref}' is a {type(target).__name__}, not a function.", "Point at a function.")
    return target


DEFAULT_USER_CODE_TIMEOUT_S = 60.0
# The worker's own start-up (a Python interpreter, grpo-pilot's imports: ~1 s, much more on a loaded machine)
# is not the user's: it has this separate, generous limit.
STARTUP_TIMEOUT_S = 300.0


class UserCodeError(Exception):
    """One call of user code failed. `kind`: raised | timeout | died | unpicklable; `text` describes it."""

    def __init__(self, kind: str, text: str, exc_type: str = "") -> None:
        super().__init__(text)
        self.kind, self.text, self.exc_type = kind, text, exc_type

    @property
    def is_exit(self) -> bool:
        return self.exc_type in ("SystemExit", "KeyboardInterrupt")


def user_code_hint(exc: UserCodeError, timeout_s: float, should: str) -> str:
    """What to do about a failed call of user code; `should` says what the function must do instead."""
    if exc.kind == "timeout":
        return (
            f"Make it faster, or allow more time per call: --set user_code_timeout_s=SECONDS "
            f"(now {timeout_s:g}; also a run-config setting)."
        )
    if exc.is_exit:
        return f"User code may not end the run: {should}, or raise an ordinary exception."
    if exc.kind == "died":
        return "Call the function on that input by itself to see why its process ended."
    if exc.kind == "unpicklable":
        return f"{should[0].upper()}{should[1:]} made of plain Python values (numbers, strings, lists, dicts)."
    return f"Fix the function; it must {should}."


class UserFunction:
    """A user callable (`module:function` / `file.py:function`) run in its own worker process.

    Importing and calling happen in the worker (`user_worker.py`): a call that runs longer than
    `timeout_s` is stopped by killing the worker; `SystemExit`, `KeyboardInterrupt` or a crash of the
    interpreter inside the user's code become a `UserCodeError`, never an exit of grpo-run. Load errors
    are the same `InputError`s `load_callable` raises. `info` is what `describe(fn, ref)` returned
    in the worker. The worker ends with `close()`, when this object is collected, or at exit.
    """

    def __init__(
        self, ref: str, *, role: str, timeout_s: float = DEFAULT_USER_CODE_TIMEOUT_S, describe: str | None = None
    ) -> None:
        if not is_callable_ref(ref):
            load_callable(ref, role=role)  # raises the InputError that explains the expected form
        self.ref, self.role, self.timeout_s = ref, role, float(timeout_s)
        self._token = new_token()
        self._proc = _start_worker(self._token)
        self._finalizer = weakref.finalize(self, _stop_worker, self._proc, self._token)
        self._start_up(describe)
        _send(self._proc, ("load", ref, role))
        try:  # the user's limit starts here: importing their module is the first thing it times
            reply = self._receive(self.timeout_s)
        except UserCodeError as exc:
            self.close()
            what = "importing it" if exc.kind == "timeout" else "importing it ended its process:"
            raise InputError(
                f"The {role} '{ref}' could not be loaded: {what} {exc.text} (user_code_timeout_s = "
                f"{self.timeout_s:g} s covers your module's import and each call, not grpo-run's start-up).",
                user_code_hint(exc, self.timeout_s, "import cleanly")
                if exc.kind == "timeout"
                else "Fix the module so that it imports cleanly.",
            ) from None
        if reply[0] == "input_error":
            self.close()
            raise InputError(reply[1], reply[2])
        self.info: Any = reply[1]

    def _start_up(self, describe: str | None) -> None:
        """Wait for the worker's own start-up (interpreter, our imports, the describe module): not timed as
        user code; a worker that does not get there is grpo-run's problem, said as such."""
        try:
            if _receive(self._proc, STARTUP_TIMEOUT_S)[0] == "ready":
                _send(self._proc, ("prepare", list(sys.path), os.getcwd(), describe))
                reply = _receive(self._proc, STARTUP_TIMEOUT_S)
                if reply[0] == "prepared":
                    return
                raise UserCodeError("died", reply[1] if len(reply) > 1 else repr(reply))
            raise UserCodeError("died", "it sent no ready message")
        except UserCodeError as exc:
            self.close()
            raise RunError(
                f"The worker process for the {self.role} '{self.ref}' did not start: {exc.text} (grpo-run's own "
                f"start-up, before any of your code ran; limit {STARTUP_TIMEOUT_S:g} s).",
                "Check that `python -m grpo_pilot.engine.data.user_worker` runs in this environment.",
            ) from None

    def close(self) -> None:
        self._finalizer()

    def _receive(self, timeout_s: float) -> tuple[Any, ...]:
        if not self._finalizer.alive:
            raise UserCodeError("died", "its worker process was stopped after an earlier failure")
        try:
            return _receive(self._proc, timeout_s)
        except UserCodeError:
            self.close()
            raise

    def map(self, calls: Sequence[tuple[Any, ...]]) -> Iterator[Any]:
        """fn(*args) for each args tuple, in order; raises `UserCodeError` at the first failing call."""
        if not calls:
            return
        if not self._finalizer.alive:
            raise UserCodeError("died", "its worker process was stopped after an earlier failure")
        _send(self._proc, ("map", list(calls)))
        for _ in calls:
            reply = self._receive(self.timeout_s)
            if reply[0] == "ok":
                yield reply[1]
            elif reply[0] == "raised":
                raise UserCodeError("raised", f"raised {reply[1]}: {reply[2]}", reply[1])
            else:
                self.close()
                raise UserCodeError("unpicklable", f"returned a {reply[1]}, which cannot be passed back to grpo-run")

    def call(self, *args: Any) -> Any:
        return next(iter(self.map([args])))


def _start_worker(token: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path), **{MARKER_ENV: token})
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_pilot.engine.data.user_worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,  # Ctrl-C in the terminal goes to grpo-run only
        close_fds=True,
    )


def _stop_worker(proc: subprocess.Popen[bytes], token: str) -> None:
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            continue
    # the worker, its descendants (orphans included: it is their subreaper) and what left its session
    # (proctree.py), while the worker still holds them; then its process group, for what was never ours to see
    kill_tree(proc.pid, token)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    pidfd = getattr(proc, "_grpo_pidfd", -1)
    if pidfd is not None and pidfd >= 0:
        os.close(pidfd)
        proc._grpo_pidfd = -1  # type: ignore[attr-defined]


def _send(proc: subprocess.Popen[bytes], message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        assert proc.stdin is not None
        proc.stdin.write(HEADER.pack(len(body)) + body)
        proc.stdin.flush()
    except (BrokenPipeError, OSError):
        raise UserCodeError("died", _ended(proc)) from None


def _ended(proc: subprocess.Popen[bytes]) -> str:
    code = proc.wait()
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return f"its worker process {how} (os._exit, a crash, or the memory limit)"


EXIT_POLL_S = 0.2  # where pidfd_open is missing (Linux < 5.3, other systems): how often to check the worker


def _exit_watch(proc: subprocess.Popen[bytes]) -> list[int]:
    """A pidfd of the worker (readable once it exits: pidfd_open(2), Linux >= 5.3), kept on the process."""
    pidfd = getattr(proc, "_grpo_pidfd", None)
    if pidfd is None and hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:
            pidfd = -1
        proc._grpo_pidfd = pidfd  # type: ignore[attr-defined]
    return [pidfd] if pidfd is not None and pidfd >= 0 else []


def _receive(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[Any, ...]:
    """One reply frame, waiting at most `timeout_s` for it."""
    assert proc.stdout is not None
    fd, deadline = proc.stdout.fileno(), time.monotonic() + timeout_s
    buffer = b""
    need = HEADER.size
    header_done = False
    exited = _exit_watch(proc)
    while True:
        while len(buffer) < need:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd, *exited], [], [], max(0.0, min(left, EXIT_POLL_S if not exited else left)))
            if fd not in ready:
                # the worker ended while a process it forked still holds the pipe open (no EOF would come)
                if (exited and ready) or proc.poll() is not None:
                    raise UserCodeError("died", _ended(proc))
                if time.monotonic() >= deadline:
                    raise UserCodeError("timeout", f"did not return within {timeout_s:g} s")
                continue
            chunk = os.read(fd, min(need - len(buffer), 1 << 20))  # never past this frame
            if not chunk:
                raise UserCodeError("died", _ended(proc))
            buffer += chunk
        if header_done:
            try:
                return pickle.loads(buffer[:need])
            except Exception as exc:  # a value whose class exists only in the worker
                raise UserCodeError("unpicklable", f"returned a value grpo-run cannot rebuild ({exc})") from None
        need = HEADER.unpack(buffer[: HEADER.size])[0]
        buffer = buffer[HEADER.size :]
        header_done = True
