"""The Optuna study of a sweep: storage, identity, trial bookkeeping, recovery of interrupted trials.

Storage is any SQLAlchemy URL Optuna's `RDBStorage` accepts (SQLite file by default, PostgreSQL or
MySQL for several machines sharing one study); optuna-dashboard opens the same URL. The study is
loaded if it exists, so running the sweep again continues it.

Trial bookkeeping lives in user attributes (visible in the dashboard):
- `status`: `ok`, `oom`, `worker_died`, `crash`, `timeout`, `pruned` (counted trials: N of
  `--trials N`), `duplicate` (the sampler proposed a point already tried: not run, not counted),
  `interrupted` (the sweep was stopped during it: not counted, its point is queued again), `surplus`
  (another sweep on the same storage already runs the trials that make N: closed unrun, not counted);
- `record`: the `TrialRecord` (JSON) of counted trials;
- `source`: who proposed the point (set when it is enqueued);
- `lease_host`, `lease_pid`, `lease_deadline_unix`: who runs a RUNNING trial and until when.

Optuna's heartbeat only runs inside `Study.optimize`; this ask/tell loop keeps its own lease instead.
A RUNNING trial is stale when its process is gone from this host or its deadline (start + trial
timeout + grace) has passed; a stale trial is failed (no `status`: it counts as interrupted) and its
point queued again.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from grpo_pilot.errors import InputError
from grpo_pilot.planner.plan import Plan
from grpo_pilot.tuner.records import RECORD_ATTR, TrialRecord
from grpo_pilot.tuner.space import TuneSpace, point_key

DEFAULT_STUDY = "grpo-tune"
STORAGE_FILE = "study.db"
COUNTED = frozenset({"ok", "oom", "worker_died", "crash", "timeout", "pruned"})
LEASE_GRACE_S = 120.0  # beyond the trial timeout: kill grace, result reading, storage writes
UNLEASED_STALE_S = 60.0  # a RUNNING trial that never got its lease (killed right after ask)
# TPE: multivariate (the knobs interact: batch × checkpointing × utilisation); random start-up
# trials before it models anything. The sampler is not stored; a resumed sweep seeds it with the
# number of trials so far, so the same storage always continues the same way.
STARTUP_TRIALS = 5
SQLITE_TIMEOUT_S = 60.0  # how long a SQLite storage locked by another process is waited for
LOCK_PROBE_S = 2.0  # a lock held longer than this is announced before the wait


def default_storage(out_dir: str | Path) -> str:
    return f"sqlite:///{(Path(out_dir) / STORAGE_FILE).resolve()}"


def make_sampler(seed: int) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=STARTUP_TRIALS)


SCHEMA_ATTEMPTS = 5


def _create_sqlite_atomically(path: Path, engine_kwargs: dict[str, Any]) -> None:
    """A new SQLite storage appears only complete: its tables are made in a private file, which is then
    linked to `path` (link(2) never replaces: when another process made it meanwhile, theirs is kept).
    A reader that sees `path` (another sweep, optuna-dashboard, a test waiting for the study) never
    races the schema creation ("table studies already exists")."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        optuna.storages.RDBStorage(f"sqlite:///{tmp}", engine_kwargs=engine_kwargs).engine.dispose()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def _rdb_storage(url: str, engine_kwargs: dict[str, Any]) -> Any:
    """Optuna's RDBStorage; creating the schema again when another process created it at the same moment
    (any database: both see no tables, one CREATE fails) is retried, then the tables are there."""
    import sqlalchemy.exc

    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        except sqlalchemy.exc.OperationalError as exc:
            if "already exists" not in str(exc) or attempt == SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")


def sqlite_locked(path: Path, wait_s: float = LOCK_PROBE_S) -> bool:
    """Whether another connection holds a write lock on the SQLite file `path` for longer than `wait_s`."""
    if not path.is_file():
        return False
    try:
        con = sqlite3.connect(str(path), timeout=wait_s, isolation_level=None)
    except sqlite3.Error:
        return False  # not a database we can open: the storage's own open says why
    try:
        con.execute("BEGIN IMMEDIATE")  # a RESERVED lock: waits behind another writer, not behind readers
        con.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc)
    finally:
        con.close()


def open_study(storage: str | None, name: str, *, notify: Callable[[str], None] | None = None) -> optuna.Study:
    """Create or load the study (`storage` None = in memory, for replays and tests). A SQLite storage that
    another process keeps locked is waited for up to `SQLITE_TIMEOUT_S` (`notify` hears that it waits), then
    refused naming the lock."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend: Any = None
    if storage is not None:
        kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if storage.startswith("sqlite") else {}
        try:
            if storage.startswith("sqlite:///"):
                path = Path(storage[len("sqlite:///") :])
                if notify is not None and sqlite_locked(path):
                    notify(
                        f"the study storage {path} is locked by another process (a sweep, optuna-dashboard, "
                        f"sqlite3); waiting up to {SQLITE_TIMEOUT_S:.0f} s for it"
                    )
                _create_sqlite_atomically(path, kwargs)
            backend = _rdb_storage(storage, kwargs)
        except Exception as exc:  # SQLAlchemy raises many types for a bad URL, a missing driver, a refused login
            if "database is locked" in str(exc):
                raise InputError(
                    f"The study storage '{storage}' stayed locked for {SQLITE_TIMEOUT_S:.0f} s: another process "
                    "holds a write lock on it (a sweep, optuna-dashboard, sqlite3).",
                    "Let it finish or stop it, then run the same command again.",
                ) from None
            raise InputError(
                f"Cannot open the study storage '{storage}' ({type(exc).__name__}: {str(exc).splitlines()[0]}).",
                "Give --storage a SQLAlchemy URL such as sqlite:///tune.db or postgresql://user@host/db "
                "(with its driver installed).",
            ) from None
    try:
        study = optuna.create_study(storage=backend, study_name=name, load_if_exists=True, direction="maximize")
    except ValueError as exc:
        raise InputError(f"Study '{name}' cannot be used: {exc}.", "Choose another --study name.") from None
    study.sampler = make_sampler(len(study.get_trials(deepcopy=False)))
    return study


def distributions(space: TuneSpace) -> dict[str, CategoricalDistribution]:
    return {name: CategoricalDistribution(list(options)) for name, options in space.choices.items()}


def identity(plan: Plan, space: TuneSpace) -> dict[str, str]:
    """What a study was made for: the model, cluster, workload and target, and the space."""
    fixed = {k: plan.model_dump(mode="json")[k] for k in ("model", "cluster", "workload", "target")}
    return {
        "inputs_sha": hashlib.sha256(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:16],
        "space": json.dumps({"choices": space.choices, "base": space.base.model_dump(mode="json")}, sort_keys=True),
    }


def check_identity(study: optuna.Study, plan: Plan, space: TuneSpace) -> None:
    """Stamp a new study with its identity; refuse to continue a study made for other inputs."""
    mine = identity(plan, space)
    stored = {k: study.user_attrs.get(k) for k in mine}
    if all(v is None for v in stored.values()):
        for key, value in mine.items():
            study.set_user_attr(key, value)
        return
    if stored["inputs_sha"] != mine["inputs_sha"]:
        what = "model, cluster, workload or target"
    elif stored["space"] != mine["space"]:
        what = "knob space (the plan's knobs or what it can vary)"
    else:
        return
    raise InputError(
        f"Study '{study.study_name}' in this storage was made for another {what} than this plan.",
        "Continue it with the plan it was started with, or start a new one with --study NAME.",
    )


def status_of(trial: FrozenTrial) -> str | None:
    return trial.user_attrs.get("status")


def records(study: optuna.Study) -> list[TrialRecord]:
    """The records of counted trials, in trial order."""
    out = []
    for trial in study.get_trials(deepcopy=False):
        if status_of(trial) in COUNTED and RECORD_ATTR in trial.user_attrs:
            out.append(TrialRecord.model_validate(trial.user_attrs[RECORD_ATTR]))
    return out


def counted(study: optuna.Study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if status_of(t) in COUNTED)


def in_flight(study: optuna.Study, before: int | None = None) -> int:
    """RUNNING trials that will be counted when they end (no status yet, not stale), optionally only those
    numbered below `before`: the trials other sweeps on this storage are running."""
    now, host = time.time(), socket.gethostname()
    return sum(
        1
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if status_of(t) is None and (before is None or t.number < before) and not is_stale(t, now, host)
    )


def taken_points(study: optuna.Study, exclude: int | None = None) -> dict[tuple[tuple[str, Any], ...], int]:
    """Points tried, queued or running (point -> trial number); interrupted and duplicate trials excluded."""
    out: dict[tuple[tuple[str, Any], ...], int] = {}
    for trial in study.get_trials(deepcopy=False):
        if trial.number == exclude:
            continue
        status = status_of(trial)
        live = trial.state in (TrialState.RUNNING, TrialState.WAITING)
        if status in COUNTED or (live and status is None):
            waiting = trial.state == TrialState.WAITING
            params = trial.system_attrs.get("fixed_params", {}) if waiting else trial.params
            out.setdefault(point_key(params), trial.number)
    return out


def lease(trial: optuna.Trial, timeout_s: float) -> None:
    trial.set_user_attr("lease_host", socket.gethostname())
    trial.set_user_attr("lease_pid", os.getpid())
    trial.set_user_attr("lease_deadline_unix", time.time() + timeout_s + LEASE_GRACE_S)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(trial: FrozenTrial, now: float, host: str) -> bool:
    attrs = trial.user_attrs
    if "lease_deadline_unix" not in attrs:
        start = trial.datetime_start.timestamp() if trial.datetime_start else now
        return now - start > UNLEASED_STALE_S
    if now > float(attrs["lease_deadline_unix"]):
        return True
    return attrs.get("lease_host") == host and not _pid_alive(int(attrs.get("lease_pid", -1)))


def recover_stale(study: optuna.Study) -> list[int]:
    """Fail RUNNING trials whose sweep is gone and queue their points again; returns their numbers."""
    now, host = time.time(), socket.gethostname()
    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not is_stale(trial, now, host):
            continue
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        if trial.params:
            study.enqueue_trial(dict(trial.params), user_attrs={"source": "retry", "retry_of": trial.number})
        recovered.append(trial.number)
    return recovered
