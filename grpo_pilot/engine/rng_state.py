"""The run's random generators as a checkpoint file that cannot run code.

`capture_rng()` returns python `random`'s, numpy's, torch's CPU and every CUDA generator state as
tensors and plain numbers; `torch.save` writes it and `load_rng_file` reads it back with
`torch.load(weights_only=True)` (torch's restricted unpickler: tensors, numbers, strings, lists, dicts),
then checks every field before `restore_rng` sets the generators, so a resumed run draws exactly what
the uninterrupted one would have, and a file planted in a run directory is data, never code.
"""

from __future__ import annotations

import math
import pickle
import random
from pathlib import Path
from typing import Any

from grpo_pilot.errors import InputError

DAMAGED_HINT = "Delete that checkpoint directory to resume from the previous one, or start a new run (another --out)."

RNG_FORMAT = 2  # 1: the python / numpy states pickled as objects (grpo-pilot before issue 16)
MT_WORDS = 624  # Mersenne Twister state words (CPython Modules/_randommodule.c N; numpy MT19937 `key`)


def capture_rng() -> dict[str, Any]:
    """Every generator the run draws from, as tensors and plain numbers (what `weights_only=True` reads)."""
    import numpy as np
    import torch

    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    rng: dict[str, Any] = {
        "format": RNG_FORMAT,
        "python": {"version": int(version), "words": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def _rng_problem(rng: Any) -> str | None:
    """What keeps `rng` (as loaded) from being restored, or None."""
    import torch

    if not isinstance(rng, dict) or not {"python", "numpy", "torch"} <= set(rng):
        return "it lacks the generator states"
    if rng.get("format") != RNG_FORMAT:
        return None if _legacy_rng_ok(rng) else "its generator states have the wrong shape"
    py, npy = rng["python"], rng["numpy"]
    if not (isinstance(py, dict) and isinstance(npy, dict) and isinstance(rng["torch"], torch.Tensor)):
        return "its generator states have the wrong types"
    words = py.get("words")
    if not isinstance(words, torch.Tensor) or words.dtype != torch.int64 or words.shape != (MT_WORDS + 1,):
        return "its python generator state has the wrong shape"
    if not isinstance(py.get("version"), int) or not (py.get("gauss") is None or isinstance(py.get("gauss"), float)):
        return "its python generator state has the wrong types"
    keys = npy.get("keys")
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or keys.shape != (MT_WORDS,):
        return "its numpy generator state has the wrong shape"
    if npy.get("kind") != "MT19937" or not all(isinstance(npy.get(k), int) for k in ("pos", "has_gauss")):
        return "its numpy generator state has the wrong types"
    if not isinstance(npy.get("cached_gaussian"), float) or not math.isfinite(npy["cached_gaussian"]):
        return "its numpy generator state has the wrong types"
    return None


def _legacy_rng_ok(rng: dict[str, Any]) -> bool:
    """An rng.pt of format 1 (python state as a tuple, numpy's as a tuple holding an array)."""
    py, npy = rng.get("python"), rng.get("numpy")
    return isinstance(py, tuple) and len(py) == 3 and isinstance(npy, tuple) and len(npy) == 5


def restore_rng(rng: dict[str, Any]) -> None:
    """Set every generator from `capture_rng`'s dict (checked by `load_rng_file`; format 1 still restores)."""
    import numpy as np
    import torch

    if rng.get("format") == RNG_FORMAT:
        py, npy = rng["python"], rng["numpy"]
        random.setstate((py["version"], tuple(int(w) for w in py["words"].tolist()), py["gauss"]))
        keys = npy["keys"].numpy().astype(np.uint32)
        np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    else:
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def load_rng_file(path: Path) -> dict[str, Any]:
    """An rng.pt read with `weights_only=True` and checked; `InputError` (exit 2) when damaged or foreign.

    Format 1 files held numpy's state as an array: the numpy globals that rebuild an array are
    allowed for them (torch.serialization.safe_globals), and the uint32 dtype class, nothing else."""
    import numpy as np
    import torch

    legacy = [np.dtype, np.ndarray, np._core.multiarray._reconstruct, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(legacy):
            rng = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(
            f"Checkpoint file '{path}' cannot be read ({type(exc).__name__}: {first}).", DAMAGED_HINT
        ) from None
    problem = _rng_problem(rng)
    if problem:
        raise InputError(f"Checkpoint file '{path}' cannot be read: {problem}.", DAMAGED_HINT)
    return rng
