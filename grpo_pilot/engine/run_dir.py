"""A run's output directory: what is in it, what a fresh run or `--resume` may find there.

    <out>/metrics.jsonl     one line per step (engine/metrics.py)
    <out>/lengths.jsonl     one line per generated sample, dropped ones too:
                            {"step": int, "prompt_tokens": int, "response_tokens": int}
                            (read by `grpo-plan --lengths FILE`)
    <out>/profile.json      measured vs predicted per phase, per worker and aggregated
    <out>/workers.json      the workers of the last start: index, role, pid, host, device
    <out>/run_config.json   the settings of the last start
    <out>/failure.json      only after a failed run (engine/failures.py); removed when a run starts
    <out>/checkpoints/      engine/checkpoint.py

On `--resume` both JSONL files are cut back to their byte lengths at the checkpoint (recorded in its
state.json), so steps that will be redone leave no trace; a checkpoint from before lengths.jsonl
existed keeps that file's lines up to the checkpoint's step instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_pilot.atomic import atomic_write_text
from grpo_pilot.engine.checkpoint import list_checkpoints
from grpo_pilot.engine.failures import Failure, clear_failure, write_failure
from grpo_pilot.engine.metrics import MetricsLog
from grpo_pilot.errors import InputError


class RunDirectory:
    """The files of one run (module docstring)."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir)
        self.metrics = MetricsLog(self.path / "metrics.jsonl")
        self.lengths = MetricsLog(self.path / "lengths.jsonl")

    def check_start(self, *, resume: bool) -> None:
        """A fresh run needs an empty directory (no metrics, no checkpoints)."""
        if not resume and (self.metrics.size() > 0 or list_checkpoints(self.path)):
            raise InputError(
                f"'{self.path}' already holds a run (metrics.jsonl or checkpoints).",
                "Add --resume to continue it, or choose another --out.",
            )

    def rewind(self, state: dict[str, Any] | None, step: int) -> None:
        """Cut the logs back to checkpoint `state` at `step` (None: nothing was checkpointed, start over)."""
        if state is None:
            self.metrics.truncate(0)
            self.lengths.truncate(0)
            return
        self.metrics.truncate(int(state["metrics_bytes"]))
        if "lengths_bytes" in state:
            self.lengths.truncate(int(state["lengths_bytes"]))
        elif self.lengths.path.exists():
            kept = [r for r in self.lengths.read() if int(r.get("step", 0)) <= step]
            atomic_write_text(self.lengths.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    def write_json(self, name: str, payload: str) -> Path:
        return atomic_write_text(self.path / name, payload)

    def write_workers(self, infos: list[Any]) -> Path:
        return self.write_json("workers.json", json.dumps([i.model_dump() for i in infos], indent=2) + "\n")

    def clear_failure(self) -> None:
        clear_failure(self.path)

    def write_failure(self, failure: Failure) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return write_failure(self.path, failure)
