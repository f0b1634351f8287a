"""Kill every process a child of ours started, including those that left its session (Linux /proc).

A user's reward function or a completion's code may start processes that call `setsid()` (or double
fork) and so leave the process group the launcher kills. Two marks find them anyway:
- the launched process makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER, Linux >= 3.4,
  man 2 prctl): while it lives, orphans of its descendants are re-parented to it instead of init, so
  they stay in its tree of /proc parent links (`descendants`);
- it is started with an environment variable holding a random token (`MARKER_ENV`), which every
  descendant inherits (unless it clears its environment on purpose): after the launched process is
  gone, `/proc/PID/environ` still names them (`marked`).
`kill_tree(root, token)` SIGKILLs both sets, round after round until none is left (a process forking
while we scan is caught by the next round), and never touches this process or its ancestors.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import time

MARKER_ENV = "GRPO_PILOT_TREE"
PR_SET_CHILD_SUBREAPER = 36  # include/uapi/linux/prctl.h
MAX_ROUNDS = 200


def new_token() -> str:
    return secrets.token_hex(16)


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (module docstring); False where not Linux."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] != b"Z":
            out[int(entry)] = int(fields[1])
    return out


def descendants(root: int, parents: dict[int, int] | None = None) -> set[int]:
    """Every live process below `root` in the /proc parent links."""
    parents = _parents() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def marked(token: str) -> set[int]:
    """Live processes whose environment holds MARKER_ENV=token (those we may read: our uid, or as root)."""
    needle = f"{MARKER_ENV}={token}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.add(int(entry))
    return found


def _protected() -> set[int]:
    """This process and its ancestors: never killed."""
    parents, pid, out = _parents(), os.getpid(), set()
    while pid > 1 and pid not in out:
        out.add(pid)
        pid = parents.get(pid, 1)
    return out


def kill_tree(root: int | None, token: str | None) -> int:
    """SIGKILL `root`, its descendants and every process marked with `token`, until none is left; returns
    how many signals were sent. Zombies are left for their parents to reap."""
    protected, sent = _protected(), 0
    for _ in range(MAX_ROUNDS):
        parents = _parents()
        victims = set(marked(token)) if token else set()
        if root is not None:
            victims |= descendants(root, parents) | ({root} if root in parents else set())
        victims -= protected
        if not victims:
            return sent
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                sent += 1
        time.sleep(0.005)
    return sent
