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
existed keeps that file's lines up to the checkpoint's step instead. Before cutting, the file is
checked against the checkpoint: the bytes up to the recorded length must be complete records of steps
up to the checkpoint's. When they are not (a truncated or hand-edited file), the file is cut to its
last complete record of a step up to the checkpoint's instead, and a note says so — never padded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_pilot.atomic import atomic_write_text
from grpo_pilot.engine.checkpoint import CKPT_DIR, list_checkpoints
from grpo_pilot.engine.failures import FAILURE_FILE, Failure, clear_failure, write_failure
from grpo_pilot.engine.metrics import MetricsLog
from grpo_pilot.errors import InputError
from grpo_pilot.inputs import JsonProblem, parse_json
from grpo_pilot.outputs import check_output_file

OUTPUT_FILES = ("metrics.jsonl", "lengths.jsonl", "profile.json", "workers.json", "run_config.json", FAILURE_FILE)


class RunDirectory:
    """The files of one run (module docstring)."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir)
        self.metrics = MetricsLog(self.path / "metrics.jsonl")
        self.lengths = MetricsLog(self.path / "lengths.jsonl")

    def check_start(self, *, resume: bool) -> None:
        """A fresh run needs an empty directory (no metrics, no checkpoints); every file a run writes must be
        absent or a regular file (a symbolic link, a named pipe or a directory in its place is refused before
        anything runs: appending to a pipe would block, to a link would write wherever it points)."""
        for name in OUTPUT_FILES:
            check_output_file(self.path / name, what=f"run's {name}")
        if (self.path / CKPT_DIR).is_symlink():
            raise InputError(
                f"'{self.path / CKPT_DIR}' is a symbolic link; grpo-run writes its checkpoints only into a directory "
                "of its own.",
                "Remove the link, or choose another --out.",
            )
        if not resume and (self.metrics.size() > 0 or list_checkpoints(self.path)):
            raise InputError(
                f"'{self.path}' already holds a run (metrics.jsonl or checkpoints).",
                "Add --resume to continue it, or choose another --out.",
            )

    def rewind(self, state: dict[str, Any] | None, step: int) -> list[str]:
        """Cut the logs back to checkpoint `state` at `step` (None: nothing was checkpointed, start over).
        Returns notes on what had to be repaired (module docstring)."""
        if state is None:
            self.metrics.truncate(0)
            self.lengths.truncate(0)
            return []
        notes = [self._cut(self.metrics, int(state["metrics_bytes"]), step, one_per_step=True)]
        if "lengths_bytes" in state:
            notes.append(self._cut(self.lengths, int(state["lengths_bytes"]), step, one_per_step=False))
        elif self.lengths.path.exists():
            kept = [r for r in _records(self.lengths.path.read_bytes(), step)[1]]
            atomic_write_text(self.lengths.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        return [n for n in notes if n]

    def _cut(self, log: MetricsLog, recorded: int, step: int, *, one_per_step: bool) -> str:
        """Cut `log` to `recorded` bytes when those are whole records up to `step`; else to the last such
        record. Returns a note when the file did not match the checkpoint."""
        if not log.path.exists():
            return f"{log.path.name} was missing; it restarts after the checkpoint's step {step}." if recorded else ""
        data = log.path.read_bytes()
        good, records = _records(data, step)
        steps = [int(r["step"]) for r in records]
        in_order = all(b >= a for a, b in zip(steps, steps[1:])) and (not one_per_step or len(set(steps)) == len(steps))
        if recorded <= good and in_order:
            complete, _ = _records(data[:recorded], step)
            if complete == recorded:
                log.truncate(recorded)
                return ""
        log.truncate(good)
        last = f"step {steps[-1]}" if steps else "nothing"
        return (
            f"{log.path.name} did not match the checkpoint of step {step} (it recorded {recorded} bytes; the file "
            f"had {len(data)}, of which {good} are complete records): kept its complete records up to {last}."
        )

    def write_json(self, name: str, payload: str) -> Path:
        return atomic_write_text(self.path / name, payload)

    def write_workers(self, infos: list[Any]) -> Path:
        return self.write_json("workers.json", json.dumps([i.model_dump() for i in infos], indent=2) + "\n")

    def clear_failure(self) -> None:
        clear_failure(self.path)

    def write_failure(self, failure: Failure) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return write_failure(self.path, failure)


def _records(data: bytes, step: int) -> tuple[int, list[dict[str, Any]]]:
    """(byte length, records) of the longest prefix of `data` made of complete JSON-object lines whose
    integer `step` is at most `step`."""
    good, records = 0, []
    while good < len(data):
        end = data.find(b"\n", good)
        if end < 0:
            break  # a partial last line (a write cut by a kill)
        try:
            record = parse_json(data[good:end].decode("utf-8"))
        except (UnicodeDecodeError, JsonProblem):
            break
        value = record.get("step") if isinstance(record, dict) else None
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= step:
            break
        records.append(record)
        good = end + 1
    return good, records
