"""Where we write: output files and directories are checked before anything is written, and locked.

- `check_output_file(path, flag=..., what=..., ours=...)`: a file we are about to (over)write must be
  absent or a regular file — never a directory, a device, a named pipe, a socket or a symbolic link
  (`--out /dev/null` must not replace the device) — and, when `ours` is given, a file we wrote
  (e.g. an earlier plan.json: `grpo-plan --out README.md` is refused). Its parent must be a directory
  or creatable (a path under a regular file is refused by name).
- `prepare_output_dir(path, flag=..., what=...)`: an output directory (existing, or created with its
  parents); a regular file, a device or a path under a file is refused. Returns whether it was created,
  so a command that rejects its input afterwards can remove what it made (`discard_created_dir`).
- `DirectoryLock`: an exclusive `fcntl.flock` on `<dir>/.grpo-pilot.lock`, held for the life of the
  command, so a second `grpo-run` (or `grpo-tune`) on the same output directory is refused with the PID
  of the process that holds it. The kernel drops the lock when its holder dies (kill -9 included), so
  a stale lock file never blocks anyone.

Refusals are `InputError`s (exit status 2) naming the flag, the path and what is there.
Atomic writes themselves are in `atomic.py` (which refuses non-regular targets too).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path
from typing import Callable

from grpo_pilot.errors import InputError
from grpo_pilot.inputs import kind_of

LOCK_NAME = ".grpo-pilot.lock"


def _where(flag: str, path: Path) -> str:
    return f"{flag} '{path}'" if flag else f"'{path}'"


def _check_parents(path: Path, flag: str, what: str) -> None:
    """Every existing ancestor of `path` is a directory (else: 'a parent is a file')."""
    for parent in path.parents:
        try:
            st = parent.stat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise InputError(f"Cannot use {_where(flag, path)} for the {what} ({exc.strerror or exc}).", "") from None
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(
                f"Cannot write the {what} to {_where(flag, path)}: '{parent}' is {kind_of(st.st_mode)}, "
                "not a directory.",
                "Choose a path in a directory.",
            )
        return


def check_output_file(
    path: str | os.PathLike[str],
    *,
    flag: str = "",
    what: str = "output file",
    ours: Callable[[Path], bool] | None = None,
) -> Path:
    """`path` if a file may be written there (module docstring); else an `InputError`."""
    p = Path(path)
    _check_parents(p, flag, what)
    try:
        st = p.lstat()
    except FileNotFoundError:
        return p
    except OSError as exc:
        raise InputError(f"Cannot use {_where(flag, p)} for the {what} ({exc.strerror or exc}).", "") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(
            f"{_where(flag, p)} is a directory; the {what} is a file.",
            f"Name a file, e.g. {p / 'plan.json'}." if what == "plan file" else "Name a file path.",
        )
    if not stat.S_ISREG(st.st_mode):
        raise InputError(
            f"{_where(flag, p)} is {kind_of(st.st_mode)}; grpo-pilot only replaces regular files it wrote.",
            f"Choose a regular file path for the {what}.",
        )
    if ours is not None and not ours(p):
        raise InputError(
            f"{_where(flag, p)} already exists and is not a {what} grpo-pilot wrote; it was left untouched.",
            "Choose another path, or remove that file first.",
        )
    return p


def prepare_output_dir(path: str | os.PathLike[str], *, flag: str = "", what: str = "output directory") -> bool:
    """Make sure `path` is a directory we may write in; returns True when this call created it."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        st = None  # a parent is not a directory: _check_parents names it
    except OSError as exc:
        raise InputError(f"Cannot use {_where(flag, p)} as the {what} ({exc.strerror or exc}).", "") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(
                f"{_where(flag, p)} is {kind_of(st.st_mode)}, not a directory; the {what} holds several files.",
                "Name a new or existing directory.",
            )
        if not os.access(p, os.W_OK | os.X_OK):
            raise InputError(f"The {what} {_where(flag, p)} is not writable.", "Choose a directory you can write.")
        return False
    _check_parents(p, flag, what)
    try:
        p.mkdir(parents=True)
    except FileExistsError:
        return prepare_output_dir(p, flag=flag, what=what)  # made by someone else meanwhile: check it again
    except OSError as exc:
        raise InputError(
            f"Cannot create the {what} {_where(flag, p)} ({exc.strerror or exc}).", "Choose a writable path."
        ) from None
    return True


def discard_created_dir(path: str | os.PathLike[str]) -> None:
    """Remove a directory `prepare_output_dir` created, when it holds nothing but our lock file."""
    p = Path(path)
    with contextlib.suppress(OSError):
        if {e.name for e in os.scandir(p)} <= {LOCK_NAME}:
            with contextlib.suppress(FileNotFoundError):
                (p / LOCK_NAME).unlink()
            p.rmdir()


class DirectoryLock:
    """Exclusive lock on an output directory for one command (module docstring). Use as a context manager
    or call `acquire()` / `release()`."""

    def __init__(self, directory: str | os.PathLike[str], command: str, *, flag: str = "--out") -> None:
        self.directory = Path(directory)
        self.command = command
        self.flag = flag
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.directory / LOCK_NAME

    def _holder(self, fd: int) -> str:
        with contextlib.suppress(OSError):
            text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            if text:
                return text
        return "another process"

    def acquire(self) -> "DirectoryLock":
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise InputError(
                f"Cannot lock the output directory {_where(self.flag, self.directory)}: '{self.path}' cannot be "
                f"opened ({exc.strerror or exc}).",
                "Remove that path, or choose another directory.",
            ) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise InputError(
                f"Cannot lock {_where(self.flag, self.directory)}: '{self.path}' is {kind_of(st.st_mode)}.",
                "Remove it, or choose another directory.",
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = self._holder(fd)
            os.close(fd)
            raise InputError(
                f"{_where(self.flag, self.directory)} is in use: {holder} holds its lock.",
                f"Wait for that run to finish (or stop it), or give this {self.command} another {self.flag}.",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.command} (PID {os.getpid()})\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
