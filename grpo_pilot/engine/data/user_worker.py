"""Worker process for user code (`python -m grpo_pilot.engine.data.user_worker`); see `callables.UserFunction`.

Protocol: frames of a 4-byte big-endian length and a pickle, commands on stdin, replies on stdout.
- on start, once our own imports are done and before any user code runs: ("ready",);
- ("prepare", sys_path, cwd, describe) -> ("prepared",) | ("input_error", message, hint): set the paths
  and import the trusted module `describe` names ("module:function", or None) — still our own start-up;
- ("load", ref, role) -> ("loaded", info) | ("input_error", message, hint): import the user's module and
  call describe(fn, ref) -> info (None without a describe) — the first thing the user-code limit times;
- ("map", [args, ...]) -> one ("ok", value) per item, in order; at the first item that raises, one
  ("raised", type_name, text) and the rest of that batch is dropped; a value that cannot be pickled
  gives ("unpicklable", type_name).

The worker sends its protocol on private descriptors: fd 0 reads /dev/null and fd 1 writes to stderr, so
a print() or input() in user code cannot break a frame. It starts its own session (the launcher
does), so Ctrl-C in the terminal reaches only grpo-run, which then stops it; it ends when stdin
closes or when its parent process goes away (a watchdog thread polls the parent PID). It is the child
subreaper of what the user's code starts (engine/proctree.py), so grpo-run can stop every process of
it, `setsid()` ones included.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import threading
import time
from typing import Any

from grpo_pilot.engine.data.callables import load_callable
from grpo_pilot.engine.data.frames import read_frame, write_frame
from grpo_pilot.engine.proctree import become_subreaper
from grpo_pilot.errors import InputError


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def _reply_for(value: Any) -> tuple[Any, ...]:
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # user objects that cannot cross the process boundary
        return ("unpicklable", type(value).__name__)
    return ("ok", value)


def _prepare(message: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    """Paths, and the trusted describe function (our own import: not timed as user code)."""
    _, sys_path, cwd, describe = message
    sys.path[:] = list(sys_path)
    os.chdir(cwd)
    if not describe:
        return None, ("prepared",)
    module, name = describe.split(":")
    try:
        return getattr(importlib.import_module(module), name), ("prepared",)
    except Exception as exc:  # our own module failed to import: an environment problem
        return None, ("input_error", f"grpo-run's own module {module} failed to import ({exc}).", "")


def _load(message: tuple[Any, ...], describe: Any) -> tuple[Any, tuple[Any, ...]]:
    _, ref, role = message
    try:
        fn = load_callable(ref, role=role)
        info = describe(fn, ref) if describe is not None else None
    except InputError as exc:
        return None, ("input_error", exc.message, exc.hint)
    except BaseException as exc:  # SystemExit / KeyboardInterrupt at import time: an error, not an exit
        return None, ("input_error", f"The {role} '{ref}': importing it raised {type(exc).__name__}: {exc}.", "")
    return fn, ("loaded", info)


def serve(cmd_fd: int, out_fd: int) -> None:
    fn = describe = None
    while True:
        message = read_frame(cmd_fd)
        if message is None:
            return
        if message[0] == "prepare":
            describe, reply = _prepare(message)
            write_frame(out_fd, reply)
            continue
        if message[0] == "load":
            fn, reply = _load(message, describe)
            write_frame(out_fd, reply)
            continue
        for args in message[1]:
            try:
                value = fn(*args)  # type: ignore[misc]
            except BaseException as exc:  # user code: SystemExit and KeyboardInterrupt are errors too
                write_frame(out_fd, ("raised", type(exc).__name__, str(exc)[:2000]))
                break
            write_frame(out_fd, _reply_for(value))


def main() -> None:
    cmd_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    become_subreaper()
    write_frame(out_fd, ("ready",))  # our start-up is over: the user-code limit starts counting after this
    serve(cmd_fd, out_fd)


if __name__ == "__main__":
    main()
