"""The study storage: a new SQLite file appears only with its tables (no 'table studies already exists')."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading

import sqlalchemy

from grpo_pilot.tuner import study as st


def _tables(path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_new_sqlite_storage_appears_only_with_its_tables(tmp_path, monkeypatch):
    """While the schema is being created, the storage path does not exist: a second opener (another sweep,
    a dashboard, a test waiting for the study) can never see a file without tables."""
    path = tmp_path / "out" / "study.db"
    creating, release = threading.Event(), threading.Event()
    original = sqlalchemy.MetaData.create_all

    def slow_create_all(self, *args, **kwargs):
        creating.set()
        assert release.wait(30)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(sqlalchemy.MetaData, "create_all", slow_create_all)
    opener = threading.Thread(target=st.open_study, args=(st.default_storage(tmp_path / "out"), "s"))
    opener.start()
    assert creating.wait(30)
    seen_while_creating = path.exists()
    release.set()
    opener.join(30)
    assert not seen_while_creating
    assert "studies" in _tables(path) and not list(path.parent.glob(".study.db.tmp-*"))


def _open(out: str, barrier) -> None:
    barrier.wait()
    st.open_study(st.default_storage(out), "s")


def test_sweeps_opening_a_new_storage_at_once_all_succeed(tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_open, args=(str(tmp_path / "out"), barrier)) for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    assert len(st.open_study(st.default_storage(tmp_path / "out"), "s").get_trials()) == 0
