"""The actor's part of a checkpoint: sharded model and optimizer states, and each worker's RNG.

    save_actor(actor, dir) / load_actor(actor, dir)     <dir>/actor/ (torch.distributed.checkpoint)
    save_rng(dir, worker) / load_rng(dir, worker)       <dir>/rng-worker-<i>.pt

`torch.distributed.checkpoint` (DCP) writes each training rank's own shards and a metadata file into
one directory, collectively (every training rank calls `save_actor` together); on one rank without
a process group it writes the plain tensors the same way. State dicts come from
`torch.distributed.checkpoint.state_dict.get_state_dict` (parameter names as in the HF model,
optimizer state keyed by them), so a checkpoint does not depend on how the actor is wrapped. With adapters
(engine/lora.py) only the trainable parameters and their optimizer states are saved (engine/lora.py
`checkpoint_states`); the frozen base is rebuilt from the same seed or weights. The
directory is the driver's temporary checkpoint directory (engine/checkpoint.py renames it once
every worker is done), so it must be on a filesystem every node sees for multi-node runs.
Checkpoints of earlier versions (`model.pt` + `optimizer.pt`, one process) still load.

Nothing in a checkpoint can run code: DCP's own reader unpickles `.metadata` with `pickle.load` and its
default planner reads non-tensor items with `torch.load(weights_only=False)` (torch 2.13,
torch/distributed/checkpoint/filesystem.py `FileSystemReader.read_metadata`, default_planner.py
`DefaultLoadPlanner.load_bytes`); `load_actor` uses `SafeReader` (a pickle that may only build DCP's
metadata classes, torch.Size, dtypes, layouts and paths) and `SafePlanner` (`weights_only=True`), and
`verify_actor_files` checks every shard the metadata names is there and long enough before a worker
loads anything. Every failure to read is an `InputError` (exit 2) that names the file, never a traceback.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpo_pilot.engine.lora import checkpoint_states, load_states
from grpo_pilot.engine.rng_state import DAMAGED_HINT, capture_rng, load_rng_file, restore_rng
from grpo_pilot.errors import InputError

ACTOR_DIR = "actor"
LEGACY_MODEL, LEGACY_OPTIMIZER = "model.pt", "optimizer.pt"
METADATA_FILE = ".metadata"  # torch/distributed/checkpoint/filesystem.py `_metadata_fn`
_DCP = "torch.distributed.checkpoint"
_METADATA_CLASSES = {
    f"{_DCP}.metadata": {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    },
    f"{_DCP}.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "PurePosixPath", "Path"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's `.metadata` but builds nothing outside `_METADATA_CLASSES` (and torch.Size / dtypes)."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        allowed = name in _METADATA_CLASSES.get(module, ()) or (
            module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a checkpoint's metadata never holds")
        return super().find_class(module, name)


def read_metadata(path: Path) -> Any:
    """DCP metadata of `path` (a `.metadata` file), unpickled with `_MetadataUnpickler`; InputError when damaged."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise InputError(f"Checkpoint file '{path}' cannot be read ({_first_line(exc)}).", DAMAGED_HINT) from None
    if not isinstance(metadata, Metadata):
        raise InputError(f"Checkpoint file '{path}' is not checkpoint metadata.", DAMAGED_HINT)
    return metadata


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def verify_actor_files(directory: str | Path) -> None:
    """Before any worker loads: the actor's metadata reads safely and every byte range it names is on disk."""
    actor = Path(directory) / ACTOR_DIR
    if not actor.is_dir():
        if (Path(directory) / LEGACY_MODEL).is_file() and (Path(directory) / LEGACY_OPTIMIZER).is_file():
            return
        raise InputError(
            f"Checkpoint '{directory}' has no model/optimizer state ({ACTOR_DIR}/ is missing).", DAMAGED_HINT
        )
    metadata = read_metadata(actor / METADATA_FILE)
    sizes: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        relative = str(getattr(info, "relative_path", ""))
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(offset, int) or not isinstance(length, int) or "/" in relative or relative in ("", ".", ".."):
            raise InputError(f"Checkpoint file '{actor / METADATA_FILE}' names an invalid shard entry.", DAMAGED_HINT)
        if relative not in sizes:
            path = actor / relative
            sizes[relative] = path.stat().st_size if path.is_file() else -1
        if sizes[relative] < 0:
            raise InputError(f"Checkpoint shard '{actor / relative}' is missing.", DAMAGED_HINT)
        if offset + length > sizes[relative]:
            raise InputError(
                f"Checkpoint shard '{actor / relative}' is cut short: {sizes[relative]:,} bytes, the metadata needs "
                f"{offset + length:,}.",
                DAMAGED_HINT,
            )


@contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns that it works without a process group on one rank: that is the intended single-process mode."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _actor_states(actor: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return checkpoint_states(actor.policy, actor.optimizer)


def save_actor(actor: Any, directory: str | Path) -> None:
    import torch.distributed.checkpoint as dcp

    model, optim = _actor_states(actor)
    with _quiet():
        dcp.save({"model": model, "optimizer": optim}, checkpoint_id=str(Path(directory) / ACTOR_DIR))


def _safe_reader_and_planner(path: Path) -> tuple[Any, Any]:
    """DCP's file reader and load planner with the two unpickling steps made safe (module docstring)."""
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")
            metadata = read_metadata(Path(self.path) / (METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner uses

                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafeReader(path), SafePlanner()


def load_actor(actor: Any, directory: str | Path) -> None:
    """Load in place; a legacy one-process checkpoint goes through the plain state dicts. Tensors only:
    nothing in the files can run code (module docstring); a damaged file is an `InputError`."""
    import torch
    import torch.distributed.checkpoint as dcp

    d = Path(directory)
    try:
        if not (d / ACTOR_DIR).is_dir() and (d / LEGACY_MODEL).exists():
            model = torch.load(d / LEGACY_MODEL, map_location="cpu", weights_only=True)
            optim = torch.load(d / LEGACY_OPTIMIZER, map_location="cpu", weights_only=True)
            actor.policy.load_state_dict(model)
            actor.optimizer.load_state_dict(optim)
            return
        model, optim = _actor_states(actor)
        state = {"model": model, "optimizer": optim}
        reader, planner = _safe_reader_and_planner(d / ACTOR_DIR)
        with _quiet():
            dcp.load(state, storage_reader=reader, planner=planner)
        load_states(actor.policy, actor.optimizer, state["model"], state["optimizer"])
    except (InputError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        # a damaged or foreign file: the checkpoint's problem, reported without a traceback
        raise InputError(
            f"Checkpoint '{d}' cannot be read: its model/optimizer state does not load ({_dcp_cause(exc)}).",
            DAMAGED_HINT,
        ) from None


def _dcp_cause(exc: BaseException) -> str:
    """The innermost error DCP wrapped, one line (its CheckpointException holds, per rank, the exception
    and a stack summary: torch/distributed/checkpoint/api.py `WRAPPED_EXCEPTION`)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        inner = inner[0] if isinstance(inner, tuple) and inner else inner
        if isinstance(inner, BaseException):
            return _first_line(inner)
    return _first_line(exc)


def _rng_file(directory: str | Path, worker: int) -> Path:
    return Path(directory) / f"rng-worker-{worker}.pt"


def save_rng(directory: str | Path, worker: int) -> None:
    import torch

    with open(_rng_file(directory, worker), "wb") as handle:
        torch.save(capture_rng(), handle)
        handle.flush()
        os.fsync(handle.fileno())


def load_rng(directory: str | Path, worker: int) -> None:
    """Restore the worker's RNG when the checkpoint has it (legacy checkpoints keep one for the driver only)."""
    path = _rng_file(directory, worker)
    if path.exists():
        restore_rng(load_rng_file(path))
