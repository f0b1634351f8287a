"""Worker process for user code (`python -m grpo_pilot.engine.data.user_worker`); see `callables.UserFunction`.

Protocol: frames of a 4-byte big-endian length and a pickle, commands on stdin, replies on stdout.
- ("load", ref, role, sys_path, cwd, describe) -> ("loaded", info) | ("input_error", message, hint).
  `describe` is None or "module:function" of trusted code called as describe(fn, ref) -> info.
- ("map", [args, ...]) -> one ("ok", value) per item, in order; at the first item that raises, one
  ("raised", type_name, text) and the rest of that batch is dropped; a value that cannot be pickled
  gives ("unpicklable", type_name).

The worker sends its protocol on private descriptors: fd 0 reads /dev/null and fd 1 writes to stderr, so
a print() or input() in user code cannot break a frame. It starts its own session (the launcher
does), so Ctrl-C in the terminal reaches only grpo-run, which then stops it; it ends when stdin
closes or when its parent process goes away (a watchdog thread polls the parent PID).
"""

from __future__ import annotations

import importlib
import os
import pickle
import struct
import sys
import threading
import time
from typing import Any

HEADER = struct.Struct(">I")


def read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any:
    header = read_exact(fd, HEADER.size)
    if header is None:
        return None
    body = read_exact(fd, HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def write_frame(fd: int, message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = HEADER.pack(len(body)) + body
    while data:
        data = data[os.write(fd, data) :]


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


def _load(message: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    from grpo_pilot.engine.data.callables import load_callable
    from grpo_pilot.errors import InputError

    _, ref, role, sys_path, cwd, describe = message
    sys.path[:] = list(sys_path)
    os.chdir(cwd)
    try:
        fn = load_callable(ref, role=role)
        info = None
        if describe:
            module, name = describe.split(":")
            info = getattr(importlib.import_module(module), name)(fn, ref)
    except InputError as exc:
        return None, ("input_error", exc.message, exc.hint)
    except BaseException as exc:  # SystemExit / KeyboardInterrupt at import time: an error, not an exit
        return None, ("input_error", f"The {role} '{ref}': importing it raised {type(exc).__name__}: {exc}.", "")
    return fn, ("loaded", info)


def serve(cmd_fd: int, out_fd: int) -> None:
    fn = None
    while True:
        message = read_frame(cmd_fd)
        if message is None:
            return
        if message[0] == "load":
            fn, reply = _load(message)
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
    serve(cmd_fd, out_fd)


if __name__ == "__main__":
    main()
