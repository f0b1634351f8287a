"""Atomic checkpoints of a run, and RNG capture/restore, so a killed run resumes exactly.

Layout: `<output_dir>/checkpoints/step-000010/` holding
- `model.pt` (policy state dict), `optimizer.pt` (AdamW state dict),
- `rng.pt` (python `random`, numpy, torch CPU and every CUDA device generator),
- `state.json` (step, sampler position, config hash, byte length of metrics.jsonl at that step).
A checkpoint is written into `checkpoints/.tmp-step-000010-<pid>/`, every file fsynced, and then
renamed to its final name (an atomic directory rename on POSIX), so a directory named `step-*` is
always complete; a kill -9 leaves at most a `.tmp-*` directory, which the next save removes.
The reference model is not saved: it is the initial policy, rebuilt from the same seed or weights
(the config hash covers both).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_pilot.errors import InputError, RunError

CKPT_DIR = "checkpoints"
PREFIX = "step-"


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint (tensors are on CPU)."""

    path: Path
    step: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    state: dict[str, Any]


def capture_rng() -> dict[str, Any]:
    """Every generator the run draws from."""
    import numpy as np
    import torch

    rng: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


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


def save_checkpoint(
    output_dir: str | Path,
    *,
    step: int,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any],
    state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint `step` atomically, then delete all but the newest `keep` ones."""
    import torch

    root = Path(output_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    payloads = {"model.pt": model_state, "optimizer.pt": optimizer_state, "rng.pt": capture_rng()}
    for name, obj in payloads.items():
        with open(tmp / name, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
    with open(tmp / "state.json", "w") as handle:
        json.dump({"step": step, **state}, handle, indent=2, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for _, old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _read_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunError(
            f"Checkpoint '{path}' cannot be read ({exc}).",
            "Delete that directory to resume from the previous checkpoint, or start a new run.",
        ) from None


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read one checkpoint directory (CPU tensors)."""
    import torch

    p = Path(path)
    state = _read_state(p)
    try:
        model = torch.load(p / "model.pt", map_location="cpu", weights_only=True)
        optimizer = torch.load(p / "optimizer.pt", map_location="cpu", weights_only=True)
        rng = torch.load(p / "rng.pt", map_location="cpu", weights_only=False)  # python/numpy RNG states: our own file
    except (OSError, pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        raise RunError(
            f"Checkpoint '{p}' cannot be read ({exc}).",
            "Delete that directory to resume from the previous checkpoint, or start a new run.",
        ) from None
    return Checkpoint(path=p, step=int(state["step"]), model=model, optimizer=optimizer, rng=rng, state=state)


def latest_checkpoint(output_dir: str | Path, *, config_hash: str) -> Checkpoint | None:
    """The newest checkpoint, after checking (before loading any tensor) that it belongs to this plan + config."""
    found = list_checkpoints(output_dir)
    if not found:
        return None
    path = found[-1][1]
    saved = _read_state(path).get("config_hash")
    if saved != config_hash:
        raise InputError(
            f"The checkpoint in '{path}' was written with a different plan or run config (hash {saved}, now {config_hash}).",
            "Resume with the same plan.json and settings (steps, output_dir and checkpoint_every may change), or use another --out.",
        )
    return load_checkpoint(path)
