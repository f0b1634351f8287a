"""Typed failures: what failure.json records, and that the errors survive the trip from a Ray worker."""

from __future__ import annotations

import json
import pickle

import torch

from grpo_pilot.engine.failures import (
    CrashError,
    OutOfMemoryRunError,
    WorkerDiedError,
    clear_failure,
    failure_record,
    is_out_of_memory,
    write_failure,
)
from grpo_pilot.errors import RunError


def test_located_errors_pickle_with_their_place():
    for cls, kind in ((OutOfMemoryRunError, "oom"), (WorkerDiedError, "worker_died"), (CrashError, "crash")):
        err = cls("boom on worker 1", "do this", worker="worker 1 (trainer)", phase="update", step=7)
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is cls and isinstance(back, RunError) and back.exit_code == 1
        assert (back.message, back.hint, back.worker, back.phase, back.step) == (
            "boom on worker 1",
            "do this",
            "worker 1 (trainer)",
            "update",
            7,
        )
        rec = failure_record(back, phase="ignored", step=99)
        assert (rec.kind, rec.worker, rec.phase, rec.step) == (kind, "worker 1 (trainer)", "update", 7)
        assert rec.message == "boom on worker 1 do this"


def test_failure_record_of_other_errors_and_the_file(tmp_path):
    rec = failure_record(ValueError("bad thing"), phase="reward", step=3)
    got = (rec.kind, rec.worker, rec.phase, rec.step, rec.message)
    assert got == ("crash", None, "reward", 3, "ValueError: bad thing")
    assert failure_record(RunError("vLLM failed.", "Retry.")).message == "vLLM failed. Retry."
    path = write_failure(tmp_path, rec)
    assert json.loads(path.read_text()) == {
        "kind": "crash",
        "worker": None,
        "phase": "reward",
        "step": 3,
        "message": "ValueError: bad thing",
    }
    clear_failure(tmp_path)
    assert not path.exists()
    clear_failure(tmp_path)  # nothing to remove: fine


def test_out_of_memory_detection():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_death_cause_keeps_process_host_and_exit_type():
    from grpo_pilot.engine.workers import death_cause

    ray_text = (
        "The actor died unexpectedly before finishing this task.\n\tclass_name: Worker\n\tpid: 4242\n\tip: 10.0.0.7\n"
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: ..."
    )
    assert death_cause(RuntimeError(ray_text)) == "process 4242 on 10.0.0.7; exit type SYSTEM_ERROR"
    assert death_cause(RuntimeError("node lost\nmore")) == "node lost"
