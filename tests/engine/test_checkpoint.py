"""Checkpoints: atomic layout, pruning, config-hash guard, RNG round trip."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

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
from grpo_pilot.engine.dist_checkpoint import load_actor, save_actor
from grpo_pilot.engine.rng_state import load_rng_file
from grpo_pilot.errors import InputError


def _actor(fill: float = 0.0) -> SimpleNamespace:
    """What `save_actor` / `load_actor` read of an Actor: a module and its AdamW, after one step."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(3, 2)
    with torch.no_grad():
        policy.weight.fill_(fill)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    policy(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return SimpleNamespace(policy=policy, optimizer=optimizer)


def _save(tmp_path, step, **kw):
    tmp = begin_checkpoint(tmp_path, step)
    torch.save({"w": torch.full((3,), float(step))}, tmp / "part.pt")
    save_actor(_actor(float(step)), tmp)  # what the workers write (dist_checkpoint)
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


def test_rng_roundtrip_reproduces_every_generator(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    saved = capture_rng()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    torch.save(saved, tmp_path / "rng.pt")
    restore_rng(load_rng_file(tmp_path / "rng.pt"))  # through the file, read with weights_only=True
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


class _Planted:
    """A pickle that runs code when it is loaded: what a hostile file in a run directory would hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


def test_a_planted_pickle_never_runs(tmp_path):
    """rng.pt, rng-worker-*.pt, DCP's .metadata and DCP's non-tensor items are all read without running code."""
    marker = tmp_path / "owned"
    path = _save(tmp_path / "run", 2)
    good = load_checkpoint(path)
    assert good.step == 2 and good.rng["format"] == 2  # plain tensors and numbers
    for name in ("rng.pt", "rng-worker-0.pt"):
        torch.save({"python": _Planted(marker), "numpy": 1, "torch": 2}, path / name)
        with pytest.raises(InputError, match="cannot be read"):
            (load_checkpoint(path) if name == "rng.pt" else _load_worker_rng(path))
        assert not marker.exists()
        torch.save(capture_rng(), path / name)
    import pickle

    (path / "actor" / ".metadata").write_bytes(pickle.dumps(_Planted(marker)))
    with pytest.raises(InputError, match=r"\.metadata' cannot be read \(UnpicklingError: it refers to pathlib"):
        load_checkpoint(path)
    assert not marker.exists()


def _load_worker_rng(path: Path) -> None:
    from grpo_pilot.engine.dist_checkpoint import load_rng

    load_rng(path, 0)


def test_a_planted_optimizer_item_never_runs(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    marker = tmp_path / "owned"
    actor = _actor(1.0)
    model, optim = get_state_dict(actor.policy, actor.optimizer)
    optim["param_groups"][0]["lr"] = _Planted(marker)  # DCP stores a non-tensor item with torch.save
    dcp.save({"model": model, "optimizer": optim}, checkpoint_id=str(tmp_path / "actor"))
    with pytest.raises(InputError, match="model/optimizer state does not load .*UnpicklingError"):
        load_actor(_actor(0.0), tmp_path)
    assert not marker.exists()


def test_actor_round_trip_through_the_safe_reader(tmp_path):
    save_actor(_actor(3.0), tmp_path)
    target = _actor(0.0)
    load_actor(target, tmp_path)
    assert torch.equal(target.policy.weight, _actor(3.0).policy.weight)
    assert target.optimizer.param_groups[0]["lr"] == 1e-3


def test_a_cut_shard_is_refused_before_any_worker_loads(tmp_path):
    path = _save(tmp_path, 2)
    shard = next((path / "actor").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(InputError, match="is cut short") as info:
        load_checkpoint(path)
    assert "Traceback" not in info.value.paragraph()
    shard.unlink()
    with pytest.raises(InputError, match="is missing"):
        load_checkpoint(path)


def test_rng_files_of_the_earlier_format_still_restore(tmp_path):
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    legacy = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(legacy, tmp_path / "rng.pt")  # format 1: numpy's state pickled as an array
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng(load_rng_file(tmp_path / "rng.pt"))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first
