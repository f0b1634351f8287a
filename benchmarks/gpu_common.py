"""Pieces the GPU benchmarks share (engine_gpu.py, gpu_session.py): the GPU's catalog figures, the rollout
roofline, a device-memory poller, char-tokenizer prompts and an atomic JSON writer.

    spec = local_gpu()                         catalog GPUSpec of cuda:0 (or None without CUDA / a match)
    rollout_roofline_s(model_spec, rows=, prompt_tokens=, new_tokens=, hbm_bytes_per_s=)
    update_flops(model_spec, trained_tokens=, seq_tokens=)
    with DevicePoller(interval_s=0.02) as poller: ...;  poller.result()
    write_prompts(path, count=, length=)        JSONL prompts of exactly `length` characters (= tokens)
    write_json(path, obj)                       temp file + rename

Every figure comes from grpo_pilot's own formulas (planner/roofline.py, planner/memory/kv_cache.py) and the
GPU catalog (grpo_pilot/hardware), so the benchmarks and the planner count bytes and FLOPs the same way.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

NO_GPU = "no GPU: torch.cuda.is_available() is False here; nothing was measured"
BF16_BYTES = 2


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def local_gpu() -> Any:
    """The catalog `GPUSpec` of this node's GPUs (grpo_pilot.hardware.detect), or None."""
    from grpo_pilot.hardware.detect import detect_local_cluster

    cluster = detect_local_cluster()
    return None if cluster is None else cluster.gpu


def decode_step_bytes(model_spec: Any, *, rows: int, context_tokens: float) -> float:
    """Bytes one decode step must read at least: the bf16 weights once and every row's K/V over its context."""
    from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token_per_gpu

    return BF16_BYTES * model_spec.num_params + rows * context_tokens * kv_bytes_per_token_per_gpu(model_spec, 1)


def rollout_roofline_s(
    model_spec: Any, *, rows: int, prompt_tokens: int, new_tokens: int, hbm_bytes_per_s: float
) -> float:
    """The HBM-bound time of `new_tokens` decode steps over `rows` rows: Σ_t decode_step_bytes(context W + t) / BW
    (the prefill, compute-bound and once per prompt, is left out)."""
    mean_context = prompt_tokens + (new_tokens - 1) / 2.0  # Σ_{t<N} (W + t) = N·(W + (N − 1)/2)
    return new_tokens * decode_step_bytes(model_spec, rows=rows, context_tokens=mean_context) / hbm_bytes_per_s


def update_flops(model_spec: Any, *, trained_tokens: float, seq_tokens: float) -> float:
    """Useful FLOPs of one update over `trained_tokens`: forward + backward = 3 × the planner's forward FLOPs per
    token (2·P_active plus causal attention at seq/2), no recompute."""
    from grpo_pilot.planner.roofline import forward_flops_per_token

    return 3.0 * trained_tokens * forward_flops_per_token(model_spec, seq_tokens)


class DevicePoller:
    """A thread sampling the device every `interval_s`: used = total − free (cudaMemGetInfo: what nvidia-smi shows)
    and this process's allocator reserve (torch.cuda.memory_reserved). `before` = the first sample."""

    def __init__(self, interval_s: float = 0.02, device: int = 0, *, enabled: bool = True) -> None:
        self.interval_s, self.device, self.enabled = interval_s, device, enabled  # disabled: a no-op (CPU smoke runs)
        self.before_bytes: int | None = None
        self.used_peak_bytes = 0
        self.reserved_peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        if not self.enabled:
            return
        import torch

        free, total = torch.cuda.mem_get_info(self.device)
        used = int(total - free)
        if self.before_bytes is None:
            self.before_bytes = used
        self.used_peak_bytes = max(self.used_peak_bytes, used)
        self.reserved_peak_bytes = max(self.reserved_peak_bytes, int(torch.cuda.memory_reserved(self.device)))
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def reset_peaks(self) -> None:
        self.used_peak_bytes = self.reserved_peak_bytes = 0

    def __enter__(self) -> "DevicePoller":
        self._sample()
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def result(self) -> dict[str, Any]:
        return {
            "device_used_peak_bytes": self.used_peak_bytes,
            "reserved_peak_bytes": self.reserved_peak_bytes,
            "device_used_before_bytes": self.before_bytes,
            "poll_interval_s": self.interval_s,
            "samples": self.samples,
        }


PROMPT_ALPHABET = "abcdefghijklmnopqrstuvwxyz "


def write_prompts(path: Path, *, count: int, length: int) -> Path:
    """`count` JSONL prompts of exactly `length` characters (the character tokenizer: one token each)."""
    rows = []
    for i in range(count):
        text = "".join(PROMPT_ALPHABET[(i * 7 + j * 3) % len(PROMPT_ALPHABET)] for j in range(length))
        rows.append(json.dumps({"prompt": text}))
    path.write_text("\n".join(rows) + "\n")
    return path


def write_json(path: str | Path, obj: Any) -> Path:
    """`obj` as indented JSON at `path`, written to a temporary file first and renamed (never half-written)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as handle:
        json.dump(obj, handle, indent=1, default=str)
        handle.write("\n")
    os.replace(tmp, target)
    return target


def elapsed(t0: float) -> float:
    return time.perf_counter() - t0
