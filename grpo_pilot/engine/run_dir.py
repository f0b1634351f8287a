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

Nothing grpo-run did not write is replaced, appended to, cut or deleted: every file above that exists must
pass its ownership test (`OWNERSHIP`: the shape our own file has, e.g. workers.json is a list of worker
records, lengths.jsonl starts with a {"step", "prompt_tokens", "response_tokens"} line) before a run starts.
A `--resume` that finds no checkpoint starts over only when the logs are empty, or when run_config.json
shows the same run (the same plan and step-changing settings) was started there before; otherwise it is
refused, and the logs stay as they are.
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
MAX_OWNED_JSON_BYTES = 64 << 20  # profile.json of a many-worker run is a few MB; larger is not ours
LENGTH_KEYS = frozenset({"step", "prompt_tokens", "response_tokens"})
RUN_CONFIG_KEYS = frozenset({"dataset", "reward", "steps", "lr", "output_dir", "seed"})


def _json_of(path: Path) -> Any:
    """The JSON in `path` (None when it is not JSON or too large to be one of ours)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_OWNED_JSON_BYTES + 1)
        if len(data) > MAX_OWNED_JSON_BYTES:
            return None
        return parse_json(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, JsonProblem):
        return None


def _jsonl_lines(path: Path, is_record: Any) -> bool:
    """`path` is empty or starts with a record of ours; later damage (a cut or edited line) is the resume's
    to repair (`RunDirectory.rewind`). A first line cut by a kill (no newline yet) must open a JSON object."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(MAX_OWNED_JSON_BYTES)
    except OSError:
        return False
    if not head:
        return True
    end = head.find(b"\n")
    if end < 0:
        return head.startswith(b'{"')
    try:
        return bool(is_record(parse_json(head[:end].decode("utf-8"))))
    except (UnicodeDecodeError, JsonProblem):
        return False


def _step_of_record(record: Any) -> bool:
    return isinstance(record, dict) and isinstance(record.get("step"), int) and not isinstance(record["step"], bool)


def _is_length_record(record: Any) -> bool:
    return _step_of_record(record) and set(record) == LENGTH_KEYS


def _is_metrics_record(record: Any) -> bool:
    return _step_of_record(record) and {"reward_mean", "step_s"} <= set(record)


def _is_profile(path: Path) -> bool:
    raw = _json_of(path)
    return isinstance(raw, dict) and {"schema_version", "phases", "device"} <= set(raw)


def _is_workers(path: Path) -> bool:
    raw = _json_of(path)
    return isinstance(raw, list) and all(isinstance(w, dict) and {"index", "role", "pid"} <= set(w) for w in raw)


def _is_run_config(path: Path) -> bool:
    raw = _json_of(path)
    return isinstance(raw, dict) and RUN_CONFIG_KEYS <= set(raw)


def _is_failure(path: Path) -> bool:
    raw = _json_of(path)
    return isinstance(raw, dict) and {"kind", "message"} <= set(raw)


OWNERSHIP = {
    "metrics.jsonl": lambda p: _jsonl_lines(p, _is_metrics_record),
    "lengths.jsonl": lambda p: _jsonl_lines(p, _is_length_record),
    "profile.json": _is_profile,
    "workers.json": _is_workers,
    "run_config.json": _is_run_config,
    FAILURE_FILE: _is_failure,
}


def check_run_target(output_dir: str) -> None:
    """Refuse an empty output directory, or the current directory when it holds no run: the run's files and
    checkpoints/ would land among the user's own."""
    hint = "Name a directory of its own for the run, e.g. --out runs/my-run."
    if not output_dir.strip():
        raise InputError("The output directory is empty ('').", hint)
    path = Path(output_dir)
    if path.is_dir() and path.resolve() == Path.cwd().resolve() and not is_run_directory(path):
        raise InputError(
            f"--out '{output_dir}' is the current directory, which holds no grpo-run run: the run would write its "
            "files and checkpoints among yours.",
            hint,
        )


def is_run_directory(path: str | Path) -> bool:
    """Whether `path` holds a grpo-run run (a run_config.json of ours)."""
    config = Path(path) / "run_config.json"
    return config.is_file() and _is_run_config(config)


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
            check_output_file(self.path / name, what=f"run's {name}", ours=OWNERSHIP[name])
        if (self.path / CKPT_DIR).is_symlink():
            raise InputError(
                f"'{self.path / CKPT_DIR}' is a symbolic link; grpo-run writes its checkpoints only into a directory "
                "of its own.",
                "Remove the link, or choose another --out.",
            )
        if not resume and (self.metrics.size() > 0 or self.lengths.size() > 0 or list_checkpoints(self.path)):
            raise InputError(
                f"'{self.path}' already holds a run (metrics.jsonl, lengths.jsonl or checkpoints).",
                "Add --resume to continue it, or choose another --out.",
            )

    def check_start_over(self, same_run: bool) -> None:
        """`--resume` without a checkpoint: the logs are cut to nothing only when they are empty or this very
        run (`same_run`: run_config.json there has this run's hash) wrote them; else refused, nothing touched."""
        if (self.metrics.size() == 0 and self.lengths.size() == 0) or same_run:
            return
        raise InputError(
            f"--resume found no checkpoint in '{self.path}', and its metrics.jsonl / lengths.jsonl were not written "
            "by this run (its run_config.json is missing or belongs to another plan or settings): starting over "
            "would erase them.",
            "Move those files away to start over there, or choose another --out.",
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
