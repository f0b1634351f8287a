"""Typed run failures and `failure.json`, the record a tuner (or a person) reads after a failed run.

    OutOfMemoryRunError(RunError)   a worker ran out of memory (real, or over `memory_cap_bytes`)
    WorkerDiedError(RunError)       a worker process is gone (killed, crashed interpreter, lost node)
    failure_record(exc, ...)        -> Failure; `write_failure(out, failure)` writes <out>/failure.json

failure.json (written atomically on every run failure, removed when a run starts):
    {"kind": "oom" | "worker_died" | "crash" | "interrupted", "worker": str | null, "phase": str | null,
     "step": int | null, "message": str}
`worker` names the worker as the run's output does ("worker 1 (trainer+rollout)"), `phase` is one of
planner/rules.RUN_PHASES (or "checkpoint"/"start") and `step` the GRPO step under way.

The errors survive pickling (Ray hands a worker's exception to the driver as its cause).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Literal

from grpo_pilot.atomic import atomic_write_text
from grpo_pilot.errors import GrpoPilotError, RunError
from grpo_pilot.models import Frozen

FAILURE_FILE = "failure.json"
FailureKind = Literal["oom", "worker_died", "crash", "interrupted"]


class _Located(RunError):
    """A run failure that knows where it happened."""

    kind: FailureKind = "crash"

    def __init__(
        self,
        message: str,
        hint: str = "",
        *,
        worker: str | None = None,
        phase: str | None = None,
        step: int | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.worker, self.phase, self.step = worker, phase, step

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.hint, self.worker, self.phase, self.step))


def _rebuild(cls: type, message: str, hint: str, worker: str | None, phase: str | None, step: int | None) -> Any:
    return cls(message, hint, worker=worker, phase=phase, step=step)


class OutOfMemoryRunError(_Located):
    """Out of device (or capped) memory in a phase of a step, on a worker."""

    kind: FailureKind = "oom"


class WorkerDiedError(_Located):
    """A worker process disappeared mid-run."""

    kind: FailureKind = "worker_died"


class CrashError(_Located):
    """Any other failure inside a worker (an exception that is not one of ours)."""

    kind: FailureKind = "crash"


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM reached grpo-run: the run stops like a failure (failure.json kind
    "interrupted", workers closed, lock released) and the command exits 130."""

    def __init__(self, signum: int, message: str = "") -> None:
        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(message or f"terminated by signal {self.signame}")


class Failure(Frozen):
    """The content of failure.json."""

    kind: FailureKind
    worker: str | None = None
    phase: str | None = None
    step: int | None = None
    message: str


def failure_record(exc: BaseException, *, phase: str | None = None, step: int | None = None) -> Failure:
    """What failed, from the exception; `phase`/`step` fill in what the exception does not carry."""
    if isinstance(exc, _Located):
        return Failure(
            kind=exc.kind,
            worker=exc.worker,
            phase=exc.phase or phase,
            step=exc.step if exc.step is not None else step,
            message=exc.paragraph(),
        )
    if isinstance(exc, KeyboardInterrupt):
        signame = exc.signame if isinstance(exc, Interrupted) else "SIGINT"
        where = f" in the {phase} phase" if phase else ""
        at = f" of step {step}" if step is not None else ""
        return Failure(kind="interrupted", phase=phase, step=step, message=f"terminated by signal {signame}{where}{at}")
    message = exc.paragraph() if isinstance(exc, GrpoPilotError) else f"{type(exc).__name__}: {exc}"
    return Failure(kind="crash", phase=phase, step=step, message=message)


def write_failure(output_dir: str | Path, failure: Failure) -> Path:
    return atomic_write_text(Path(output_dir) / FAILURE_FILE, failure.model_dump_json(indent=2) + "\n")


def clear_failure(output_dir: str | Path) -> None:
    (Path(output_dir) / FAILURE_FILE).unlink(missing_ok=True)


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OOM (CUDA, or our CPU cap) or the CPU allocator failing."""
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)
