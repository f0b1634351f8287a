"""Atomic file writes: write to a temporary file in the same directory, fsync, then rename.

A reader (or a killed process) never sees a half-written output file. Only regular paths are
written: an existing target that is a directory, a device, a named pipe, a socket or a symbolic link
is refused (`InputError`) rather than replaced — a rename would put a JSON file where `/dev/null` was.
The checks that a command makes before it starts (`outputs.check_output_file`) give the friendlier
message; this one is the last line of defence at the moment of the rename.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

from grpo_pilot.errors import InputError
from grpo_pilot.inputs import kind_of


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    return atomic_write_with(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def refuse_non_regular(target: Path) -> None:
    """`InputError` when `target` exists and is not a regular file (symbolic links count as not regular)."""
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise InputError(f"Cannot write '{target}': a parent of that path is a file.", "Choose another path.") from None
    if not stat.S_ISREG(mode):
        raise InputError(
            f"Refusing to replace '{target}': it is {kind_of(mode)}; only regular files are written.",
            "Choose another output path.",
        )


def _umask() -> int:
    """The process umask, read without changing it (Linux /proc; elsewhere set and restored at once)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(target: Path) -> int:
    """The mode a written file gets: the mode of the file it replaces, else 0666 less the umask — what `open(path,
    "w")` gives (mkstemp's temp files are 0600)."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _cannot_write(target: Path, exc: OSError) -> InputError:
    """An OS refusal (read-only file system, no space left, no permission, ...) as a one-paragraph input error."""
    where = exc.filename or target
    return InputError(
        f"Cannot write '{target}': {exc.strerror or exc} ('{where}'); nothing was written there.",
        "Free space or choose a path on a writable file system.",
    )


def atomic_write_with(path: str | os.PathLike[str], writer: Callable[[object], object]) -> Path:
    """Call `writer(binary_file)` on a temp file next to `path`, then rename it over `path` (mode: `_mode_for`)."""
    target = Path(path)
    refuse_non_regular(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:  # EROFS, EACCES, ENOSPC, a parent that is a file, ...
        raise _cannot_write(target, exc) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            writer(handle)
            handle.flush()
            os.fchmod(handle.fileno(), _mode_for(target))
            os.fsync(handle.fileno())
        refuse_non_regular(target)  # swapped for a device or a directory while we wrote
        os.replace(tmp_name, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError):  # ENOSPC or EIO while writing, EROFS at the rename
            raise _cannot_write(target, exc) from None
        raise
    return target
