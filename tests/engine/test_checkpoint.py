"""Checkpoints: atomic layout, pruning, config-hash guard, RNG round trip."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from grpo_pilot.engine.checkpoint import (
    begin_checkpoint,
    capture_rng,
    finish_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng,
)
from grpo_pilot.errors import InputError


def _save(tmp_path, step, **kw):
    tmp = begin_checkpoint(tmp_path, step)
    torch.save({"w": torch.full((3,), float(step))}, tmp / "part.pt")  # what the workers write (dist_checkpoint)
    return finish_checkpoint(
        tmp_path,
        tmp,
        step=step,
        state={"config_hash": "abc", "sampler": {"epoch": 0, "position": step}, "metrics_bytes": 10 * step},
        **kw,
    )


def test_save_load_roundtrip_and_pruning(tmp_path):
    for step in (2, 4, 6):
        _save(tmp_path, step, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 6]
    ckpt = latest_checkpoint(tmp_path, config_hash="abc")
    assert ckpt is not None and ckpt.step == 6 and ckpt.path.name == "step-000006"
    assert torch.equal(torch.load(ckpt.path / "part.pt")["w"], torch.full((3,), 6.0))
    assert ckpt.state["sampler"]["position"] == 6 and ckpt.state["metrics_bytes"] == 60
    assert set(ckpt.rng) >= {"python", "numpy", "torch"}
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_leftover_temp_dir_is_ignored_and_cleaned(tmp_path):
    _save(tmp_path, 2)
    partial = tmp_path / "checkpoints" / ".tmp-step-000004-999"
    partial.mkdir()
    (partial / "model.pt").write_bytes(b"half")  # what a kill -9 during a save leaves behind
    assert latest_checkpoint(tmp_path, config_hash="abc").step == 2
    _save(tmp_path, 4)
    assert not partial.exists()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 4]


def test_other_config_hash_is_refused(tmp_path):
    _save(tmp_path, 2)
    with pytest.raises(InputError, match="different plan or run config"):
        latest_checkpoint(tmp_path, config_hash="zzz")


def test_no_checkpoint_gives_none(tmp_path):
    assert latest_checkpoint(tmp_path, config_hash="abc") is None


def test_damaged_checkpoint_is_bad_input(tmp_path):
    path = _save(tmp_path, 2)
    (path / "rng.pt").write_bytes(b"not a torch file")
    with pytest.raises(InputError, match="cannot be read"):
        load_checkpoint(path)
    (path / "state.json").write_text("{")
    with pytest.raises(InputError, match="cannot be read"):
        latest_checkpoint(tmp_path, config_hash="abc")


def test_rng_roundtrip_reproduces_every_generator():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    saved = capture_rng()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    restore_rng(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


def test_config_hash_follows_the_computation_not_execution_details():
    from grpo_pilot.engine.run_config import RunConfig

    base = RunConfig(dataset="d.jsonl", reward="char_fraction:char=a")
    plan_json = '{"plan": 1}'
    # how a step is executed (threads, CPU memory tracker, shared-prompt forward) does not change it
    for same in (
        base.model_copy(update={"share_prompts": False}),
        base.model_copy(update={"threads": 2, "cpu_memory": "rss"}),
    ):
        assert same.hash(plan_json) == base.hash(plan_json)
    # what a step computes does
    assert base.model_copy(update={"lr": 2e-6}).hash(plan_json) != base.hash(plan_json)
    assert base.hash('{"plan": 2}') != base.hash(plan_json)
