"""vLLM-CPU's tensor-parallel shared memory, made private to one run.

With more than one TP rank on CPU, vLLM's CPU communicator exchanges tensors through POSIX shared memory
(`vllm/distributed/device_communicators/cpu_communicator.py`, `_CPUSHMDistributed`): one segment per rank in
/dev/shm, named `<ident>-<group>-[<ranks>]-cpushm_<rank>`, where `<ident>` comes from the worker's
distributed init method (`vllm/v1/worker/cpu_worker.py` sets `VLLM_DIST_IDENT` from it). Under the
`external_launcher` executor that method is always "env://", so every run on a machine derives the same
names: two runs at once would open each other's segments, and a segment left by a killed run makes the next
start fail ("create shm in SHMManager failed. errno: 17").

So each run gets a token, drawn by rank 0 and shared by every rank, that `scope_names` adds to the group
name vLLM derives (all ranks must agree on it: vLLM checks that with an all-gather). A run removes its own
segments when it closes (`remove_run_segments`); before starting, rank 0 removes only segments that no
live process maps (`remove_stale_segments`: a killed run's), never another live run's.
"""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path

SHM_ROOT = "/dev/shm"
SEGMENT_GLOB = "*-cpushm_*"  # `<group name>_<rank>`: the C++ SHMManager's segment name (csrc/cpu/shm.cpp)
_SUFFIX = "-cpushm"  # the end of the group name _CPUSHMDistributed.make_group_name returns


def new_token() -> str:
    """A run's token: 8 hex digits (drawn once, on rank 0, and broadcast)."""
    return secrets.token_hex(4)


def scoped_name(name: str, token: str) -> str:
    """vLLM's group name with the run's token before its `-cpushm` suffix (unchanged if the form differs)."""
    return f"{name[: -len(_SUFFIX)]}-run{token}{_SUFFIX}" if name.endswith(_SUFFIX) else name


def scope_names(token: str) -> bool:
    """Make the segments vLLM creates in this process carry `token`; False where this vLLM has no such hook
    (an older or newer layout: its own names are kept, and concurrent runs may clash as before)."""
    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:
        return False
    shm_class = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    original = getattr(shm_class, "make_group_name", None)
    if original is None:
        return False
    original = getattr(original, "_grpo_original", original)  # a second engine in the process: rewrap once

    def make_group_name(communicator: object) -> str:
        return scoped_name(original(communicator), token)

    make_group_name._grpo_original = original  # type: ignore[attr-defined]
    shm_class.make_group_name = staticmethod(make_group_name)
    return True


def _mapped_paths(root: str) -> set[str]:
    """Every file under `root` that a process we can inspect has mapped (/proc/<pid>/maps)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            for line in maps.read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(root.rstrip("/") + "/"):
                    mapped.add(fields[5].removesuffix(" (deleted)"))
    return mapped


def _unlink(paths: list[Path]) -> list[str]:
    removed = []
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path.name)
    return removed


def remove_stale_segments(root: str = SHM_ROOT) -> list[str]:
    """Unlink vLLM-CPU TP segments that no live process maps (left by killed runs); returns their names."""
    candidates = sorted(Path(root).glob(SEGMENT_GLOB))
    if not candidates:
        return []
    mapped = _mapped_paths(str(Path(root).resolve()))
    return _unlink([p for p in candidates if str(p.resolve()) not in mapped])


def remove_run_segments(token: str, root: str = SHM_ROOT) -> list[str]:
    """Unlink this run's segments (peers still shutting down keep their mappings valid)."""
    return _unlink(sorted(Path(root).glob(f"*-run{token}{_SUFFIX}_*")))
