"""The actor's part of a checkpoint: sharded model and optimizer states, and each worker's RNG.

    save_actor(actor, dir) / load_actor(actor, dir)     <dir>/actor/ (torch.distributed.checkpoint)
    save_rng(dir, worker) / load_rng(dir, worker)       <dir>/rng-worker-<i>.pt

`torch.distributed.checkpoint` (DCP) writes each training rank's own shards and a metadata file into
one directory, collectively (every training rank calls `save_actor` together); on one rank without
a process group it writes the plain tensors the same way. State dicts come from
`torch.distributed.checkpoint.state_dict.get_state_dict` (parameter names as in the HF model,
optimizer state keyed by them), so a checkpoint does not depend on how the actor is wrapped. The
directory is the driver's temporary checkpoint directory (engine/checkpoint.py renames it once
every worker is done), so it must be on a filesystem every node sees for multi-node runs.
Checkpoints of earlier versions (`model.pt` + `optimizer.pt`, one process) still load.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ACTOR_DIR = "actor"
LEGACY_MODEL, LEGACY_OPTIMIZER = "model.pt", "optimizer.pt"


@contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns that it works without a process group on one rank: that is the intended single-process mode."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _actor_states(actor: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(actor.policy, actor.optimizer)


def save_actor(actor: Any, directory: str | Path) -> None:
    import torch.distributed.checkpoint as dcp

    model, optim = _actor_states(actor)
    with _quiet():
        dcp.save({"model": model, "optimizer": optim}, checkpoint_id=str(Path(directory) / ACTOR_DIR))


def load_actor(actor: Any, directory: str | Path) -> None:
    """Load in place; a legacy one-process checkpoint goes through the plain state dicts."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    d = Path(directory)
    if not (d / ACTOR_DIR).is_dir() and (d / LEGACY_MODEL).exists():
        model = torch.load(d / LEGACY_MODEL, map_location="cpu", weights_only=True)
        optim = torch.load(d / LEGACY_OPTIMIZER, map_location="cpu", weights_only=True)
        actor.policy.load_state_dict(model)
        actor.optimizer.load_state_dict(optim)
        return
    model, optim = _actor_states(actor)
    state = {"model": model, "optimizer": optim}
    with _quiet():
        dcp.load(state, checkpoint_id=str(d / ACTOR_DIR))
    set_state_dict(actor.policy, actor.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _rng_file(directory: str | Path, worker: int) -> Path:
    return Path(directory) / f"rng-worker-{worker}.pt"


def save_rng(directory: str | Path, worker: int) -> None:
    import torch

    from grpo_pilot.engine.checkpoint import capture_rng

    with open(_rng_file(directory, worker), "wb") as handle:
        torch.save(capture_rng(), handle)
        handle.flush()
        os.fsync(handle.fileno())


def load_rng(directory: str | Path, worker: int) -> None:
    """Restore the worker's RNG when the checkpoint has it (legacy checkpoints keep one for the driver only)."""
    import torch

    from grpo_pilot.engine.checkpoint import restore_rng

    path = _rng_file(directory, worker)
    if path.exists():
        restore_rng(torch.load(path, map_location="cpu", weights_only=False))  # our own file: python/numpy states
