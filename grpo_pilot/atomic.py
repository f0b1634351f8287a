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


def atomic_write_with(path: str | os.PathLike[str], writer: Callable[[object], object]) -> Path:
    """Call `writer(binary_file)` on a temp file next to `path`, then rename it over `path`."""
    target = Path(path)
    refuse_non_regular(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except (FileExistsError, NotADirectoryError, PermissionError, IsADirectoryError) as exc:
        raise InputError(
            f"Cannot write '{target}': {exc.strerror or exc} ('{exc.filename or target.parent}').",
            "Choose a path in a writable directory.",
        ) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            writer(handle)
            handle.flush()
            os.fsync(handle.fileno())
        refuse_non_regular(target)  # swapped for a device or a directory while we wrote
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    return target
