"""Atomic checkpoints of a run, and RNG capture/restore, so a killed run resumes exactly.

Layout: `<output_dir>/checkpoints/step-000010/` holding
- `actor/` — the training ranks' model and optimizer shards (torch.distributed.checkpoint, written by
  the workers: engine/dist_checkpoint.py), and `rng-worker-<i>.pt` for every worker;
- `rng.pt` (the driver's python `random`, numpy, torch CPU and every CUDA device generator, as plain
  tensors and numbers: `torch.load(weights_only=True)` reads it, so a file planted there cannot run code),
- `state.json` (step, sampler position, config hash, byte lengths of metrics.jsonl and lengths.jsonl).
A checkpoint is written into `checkpoints/.tmp-step-000010-<pid>/` (`begin_checkpoint`: the workers
write their parts there), every file fsynced, and then renamed to its final name (`finish_checkpoint`,
an atomic directory rename on POSIX), so a directory named `step-*` is always complete; a kill -9 (of
the driver or of any worker) leaves at most a `.tmp-*` directory, which the next save removes.
The reference model is not saved: it is the initial policy, rebuilt from the same seed or weights
(the config hash covers both). Single-process checkpoints of earlier versions (`model.pt`,
`optimizer.pt`) are still read (engine/dist_checkpoint.py).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, ValidationError

from grpo_pilot.engine.dist_checkpoint import verify_actor_files
from grpo_pilot.engine.rng_state import DAMAGED_HINT, capture_rng, load_rng_file, restore_rng
from grpo_pilot.errors import InputError
from grpo_pilot.inputs import read_json_file, validation_problem
from grpo_pilot.models import Frozen

__all__ = ["DAMAGED_HINT", "Checkpoint", "capture_rng", "latest_checkpoint", "load_checkpoint", "restore_rng"]

CKPT_DIR = "checkpoints"
PREFIX = "step-"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory and its state.json; the actor's tensors stay on disk until workers load them."""

    path: Path
    step: int
    rng: dict[str, Any]
    state: dict[str, Any]


class CheckpointState(Frozen):
    """state.json of a checkpoint, checked before anything is restored from it (a hand-edited or damaged
    file is refused by field, never half-applied)."""

    model_config = ConfigDict(allow_inf_nan=False)

    step: int = Field(ge=1, description="The last completed step the checkpoint holds.")
    config_hash: str = Field(min_length=1, description="RunConfig.hash of the run that wrote it.")
    sampler: dict[str, int] = Field(description="DataSampler.state_dict() after that step.")
    metrics_bytes: int = Field(ge=0, description="Length of metrics.jsonl when the checkpoint was taken.")
    lengths_bytes: int | None = Field(
        default=None, ge=0, description="Length of lengths.jsonl then (None: written before that file existed)."
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _step_of(path: Path) -> int | None:
    name = path.name
    if not name.startswith(PREFIX) or not path.is_dir():
        return None
    try:
        return int(name[len(PREFIX) :])
    except ValueError:
        return None


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if (s := _step_of(p)) is not None]
    return sorted(found)


def begin_checkpoint(output_dir: str | Path, step: int) -> Path:
    """A fresh temporary directory for checkpoint `step` (stale ones from killed saves removed first)."""
    root = Path(output_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".tmp-{PREFIX}{step:06d}-{os.getpid()}"
    tmp.mkdir()
    return tmp


def _fsync_tree(path: Path) -> None:
    for sub in sorted(path.rglob("*"), reverse=True):
        if sub.is_file():
            with open(sub, "rb") as handle:
                os.fsync(handle.fileno())
        else:
            _fsync_dir(sub)
    _fsync_dir(path)


def finish_checkpoint(output_dir: str | Path, tmp: Path, *, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Add the driver's RNG and state.json to `tmp`, fsync, rename it to `step-NNNNNN`, keep the newest `keep`."""
    import torch

    root = Path(output_dir) / CKPT_DIR
    with open(tmp / "rng.pt", "wb") as handle:
        torch.save(capture_rng(), handle)
    with open(tmp / "state.json", "w") as handle:
        json.dump({"step": step, **state}, handle, indent=2, sort_keys=True)
    _fsync_tree(tmp)
    final = root / f"{PREFIX}{step:06d}"
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for _, old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _read_state(path: Path) -> dict[str, Any]:
    """state.json validated (`CheckpointState`); its step must be the one the directory is named after."""
    try:
        raw = read_json_file(path / "state.json", "checkpoint state", hint=DAMAGED_HINT)
    except InputError as exc:
        raise InputError(f"Checkpoint '{path}' cannot be read: {exc.message}", DAMAGED_HINT) from None
    try:
        state = CheckpointState.model_validate(raw)
    except ValidationError as exc:
        raise InputError(
            f"Checkpoint '{path}' cannot be read: its state.json is damaged ({validation_problem(exc)}).",
            DAMAGED_HINT,
        ) from None
    named = _step_of(path)
    if named is not None and named != state.step:
        raise InputError(
            f"Checkpoint '{path}' cannot be read: its state.json says step {state.step}, its name step {named}.",
            DAMAGED_HINT,
        )
    return state.model_dump(exclude_none=True)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read one checkpoint directory's state and driver RNG, and check the actor's files (tensors only, every
    shard present and complete) before any worker loads them."""
    p = Path(path)
    state = _read_state(p)
    rng = load_rng_file(p / "rng.pt")
    for worker_rng in sorted(p.glob("rng-worker-*.pt")):  # the workers read theirs: check them here first
        load_rng_file(worker_rng)
    verify_actor_files(p)
    return Checkpoint(path=p, step=int(state["step"]), rng=rng, state=state)


def latest_checkpoint(output_dir: str | Path, *, config_hash: str) -> Checkpoint | None:
    """The newest checkpoint, after checking (before loading any tensor) that it belongs to this plan + config."""
    found = list_checkpoints(output_dir)
    if not found:
        return None
    path = found[-1][1]
    saved = _read_state(path).get("config_hash")
    if saved != config_hash:
        raise InputError(
            f"The checkpoint in '{path}' was written with a different plan or run config (hash {saved}, now "
            f"{config_hash}).",
            "Resume with the same plan.json and settings (steps, output_dir and checkpoint_every may change), or "
            "use another --out.",
        )
    return load_checkpoint(path)
