"""vLLM-CPU's TP shared-memory segments private to one run (engine/rollout/vllm_cpu_shm.py)."""

from __future__ import annotations

import mmap
import types

import pytest

from grpo_pilot.engine.rollout import vllm_cpu_shm


def _segment(root, name: str, size: int = 4096):
    path = root / name
    path.write_bytes(b"\0" * size)
    return path


def test_scoped_name_adds_the_token_before_the_suffix() -> None:
    name = "-tp:0-[0-1]-cpushm"  # what vLLM derives under external_launcher (init method env://)
    assert vllm_cpu_shm.scoped_name(name, "ab12cd34") == "-tp:0-[0-1]-runab12cd34-cpushm"
    assert vllm_cpu_shm.scoped_name("other-form", "ab12cd34") == "other-form"


def test_stale_segments_go_but_a_live_runs_mapping_stays(tmp_path) -> None:
    live = _segment(tmp_path, "-tp:0-[0-1]-runaaaa0000-cpushm_0")
    stale = _segment(tmp_path, "-tp:0-[0-1]-cpushm_1")
    unrelated = _segment(tmp_path, "psm_other")
    with open(live, "r+b") as handle, mmap.mmap(handle.fileno(), 0):  # a live run holds its segment mapped
        removed = vllm_cpu_shm.remove_stale_segments(str(tmp_path))
    assert removed == [stale.name]
    assert live.exists() and unrelated.exists() and not stale.exists()


def test_a_run_removes_only_its_own_segments(tmp_path) -> None:
    mine = [_segment(tmp_path, f"-tp:0-[0-1]-runaaaa0000-cpushm_{rank}") for rank in (0, 1)]
    other = _segment(tmp_path, "-tp:0-[0-1]-runbbbb1111-cpushm_0")
    assert vllm_cpu_shm.remove_run_segments("aaaa0000", str(tmp_path)) == sorted(p.name for p in mine)
    assert other.exists()


def test_scope_names_wraps_vllms_group_name_once(monkeypatch) -> None:
    pytest.importorskip("vllm")
    from vllm.distributed.device_communicators import cpu_communicator

    shm_class = cpu_communicator._CPUSHMDistributed
    monkeypatch.setattr(shm_class, "make_group_name", shm_class.make_group_name)  # restored after the test
    monkeypatch.setenv("VLLM_DIST_IDENT", "")
    comm = types.SimpleNamespace(unique_name="tp:0", ranks=[0, 1])
    before = shm_class.make_group_name(comm)
    assert vllm_cpu_shm.scope_names("aaaa0000")
    assert vllm_cpu_shm.scope_names("bbbb1111")  # a second engine in the process replaces the token
    assert shm_class.make_group_name(comm) == vllm_cpu_shm.scoped_name(before, "bbbb1111") != before
