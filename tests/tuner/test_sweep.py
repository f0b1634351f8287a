"""The ask/tell loop with a test double of the runner: seeds, failures, pruning, duplicates, resume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from tune_helpers import FakeRunner, failed, measured, tiny_plan

from grpo_pilot.errors import InputError, RunError
from grpo_pilot.planner.adapters import ADAPTER_ITEM_MARKERS as MARKERS
from grpo_pilot.planner.adapters import adapters_modelled
from grpo_pilot.planner.config import Knobs
from grpo_pilot.tuner import study as st
from grpo_pilot.tuner.prior import PRUNE_FACTOR, memory_limit, peak_tensor_bytes, seqs_per_micro_batch
from grpo_pilot.tuner.space import TuneSpace, build_space, grid, params_of
from grpo_pilot.tuner.sweep import Sweep, SweepSettings, prepare

SEQ = 48  # tiny: prompt 32 + response 16


def rate_of(knobs: Knobs) -> float:
    """A made-up machine: bigger micro-batches are faster, checkpointing costs 20%."""
    return 1000.0 * seqs_per_micro_batch(knobs, SEQ) ** 0.5 * (0.8 if knobs.gradient_checkpointing else 1.0)


def sweep(tmp_path, runner, events, *, trials, storage=None, name="s", cap=None, use_prior=True, plan=None, space=None):
    plan = plan or tiny_plan()
    study = st.open_study(storage, name)
    setup = prepare(plan, space or build_space(plan), memory_limit(plan, cap), use_prior)
    settings = SweepSettings(
        trials=trials,
        out_dir=str(tmp_path / "out"),
        config_path="examples/tiny/run.toml",
        memory_cap_bytes=cap,
        use_prior=use_prior,
    )
    return study, Sweep(study, plan, setup, settings, runner=runner, events=events)


def test_seeds_first_then_the_sampler_until_n_counted(tmp_path, events):
    runner = FakeRunner(lambda k: measured(rate_of(k)))
    study, sw = sweep(tmp_path, runner, events, trials=6)
    records = sw.run()
    assert len(records) == 6 == st.counted(study) == len(runner.requests)
    assert [r.source for r in records[:3]] == ["input_plan", "planner", "planner"]
    assert runner.knobs[0] == tiny_plan().knobs
    # the planner's best predicted points: checkpointing off, the most sequences per micro-batch, then the
    # next point with a different prediction (tokens:1536 is predicted exactly like micro:32)
    assert [r.params["update_batch"] for r in records[1:3]] == ["micro:32", "micro:8"]
    assert all(r.source == "sampler" or r.source.endswith("fallback") for r in records[3:])
    assert len({tuple(sorted(r.params.items())) for r in records}) == 6  # no point measured twice
    for r, t in zip(records, [t for t in study.trials if st.status_of(t) == "ok"]):
        assert t.value == pytest.approx(r.measured_tokens_per_s) == pytest.approx(rate_of(r.knobs))
        assert r.predicted_tokens_per_s > 0 and r.phases["update"].predicted_items
        assert r.status == "ok" and r.steps == 3 and r.gpu_kind == "cpu" and r.versions["torch"]
    assert events.begun == [(0, 6)] and len(events.finished) == 6
    # every trial ran in its own directory with its own trial plan
    assert len({r.out_dir for r in runner.requests}) == 6
    assert all(r.config_path == "examples/tiny/run.toml" and r.settings == {} for r in runner.requests)


def test_failures_are_recorded_and_the_sweep_goes_on(tmp_path, events):
    def outcome(k: Knobs):
        if k.micro_batch_size_per_gpu == 32 and k.max_token_len_per_gpu is None:
            return failed("oom", "live tensors over the cap", phase="update", step=2)
        if k.micro_batch_size_per_gpu == 8 and k.max_token_len_per_gpu is None:
            return failed("timeout", "no result after 5 s")
        if k.max_token_len_per_gpu is not None and not k.fused_logprob:
            return failed("crash", f"bad budget {k.max_token_len_per_gpu}")
        return measured(rate_of(k))

    study, sw = sweep(tmp_path, FakeRunner(outcome), events, trials=8)
    records = sw.run()
    assert [r.status for r in records[:3]] == ["ok", "oom", "timeout"]  # input plan, micro:32, micro:8
    assert len(records) == 8 and any(r.status == "ok" for r in records[3:])
    oom = next(r for r in records if r.status == "oom")
    assert (oom.failure_kind, oom.failure_phase, oom.failure_step) == ("oom", "update", 2)
    assert oom.measured_tokens_per_s is None and oom.predicted_peak_tensor_bytes > 0
    states = {t.number: t.state for t in study.trials}
    assert all(states[r.number] == (TrialState.COMPLETE if r.status == "ok" else TrialState.FAIL) for r in records)
    failed_trial = study.trials[oom.number]
    assert failed_trial.user_attrs["failure"] == "oom: live tensors over the cap"


def test_far_over_memory_is_pruned_without_running(tmp_path, events):
    plan = tiny_plan()
    # the input plan is predicted at 1.7x the cap, micro:32 at ~3x; micro:4 (~4.0 MB, its update) under it
    cap = peak_tensor_bytes(plan) * 6 // 10
    runner = FakeRunner(
        lambda k: failed("oom", "over the cap", phase="update") if k == plan.knobs else measured(rate_of(k), cap // 2)
    )
    space = TuneSpace(choices={"update_batch": ("micro:4", "micro:16", "micro:32")}, base=plan.knobs)
    study, sw = sweep(tmp_path, runner, events, trials=3, cap=cap, space=space)
    first, small, big = sw.run()
    assert first.source == "input_plan" and first.status == "oom"  # the baseline always runs
    # the planner ranks what fits the cap first: micro:4 (predicted under the cap) runs
    assert small.source == "planner" and small.params == {"update_batch": "micro:4"} and small.status == "ok"
    # micro:32 is predicted at ~3x the cap; scaled by what micro:4 measured (about 0.7 of its prediction),
    # still over PRUNE_FACTOR: recorded, not run
    ratio = small.measured_peak_bytes / small.predicted_peak_tensor_bytes
    factor = big.predicted_peak_tensor_bytes * ratio / cap
    assert 0.5 < ratio < 0.8 and factor > PRUNE_FACTOR
    assert big.params == {"update_batch": "micro:32"} and big.status == "pruned" and big.steps == 0
    assert f"{factor:.1f}x over memory" in big.prune_reason and "against the cap" in big.prune_reason
    assert f"prediction x{ratio:.2f}" in big.prune_reason
    assert study.trials[big.number].state == TrialState.PRUNED
    assert big.knobs not in runner.knobs and len(runner.requests) == 2
    records = [first, small, big]
    assert all(r.memory_cap_bytes == cap for r in records)
    assert all(req.settings == {"memory_cap_bytes": cap} for req in runner.requests)


def test_pruning_follows_what_the_runs_measured(tmp_path, events):
    plan = tiny_plan()
    cap = peak_tensor_bytes(plan) * 6 // 10
    # the input plan measures at a quarter of its predicted peak: candidates predicted up to 6x the cap now run
    runner = FakeRunner(lambda k: measured(rate_of(k), peak_bytes=peak_tensor_bytes(plan) // 4))
    space = TuneSpace(choices={"update_batch": ("micro:4", "micro:16", "micro:32")}, base=plan.knobs)
    _, sw = sweep(tmp_path, runner, events, trials=3, cap=cap, space=space)
    records = sw.run()
    assert [r.status for r in records] == ["ok", "ok", "ok"]
    assert records[2].params == {"update_batch": "micro:32"}
    assert records[2].predicted_peak_tensor_bytes > 2.5 * cap  # by the raw prediction: far over (> PRUNE_FACTOR)


def test_plain_optuna_has_no_seeds_and_no_pruning(tmp_path, events):
    plan = tiny_plan()
    runner = FakeRunner(lambda k: measured(rate_of(k)))
    _, sw = sweep(tmp_path, runner, events, trials=3, cap=peak_tensor_bytes(plan) // 10, use_prior=False)
    records = sw.run()
    assert [r.source for r in records] == ["sampler"] * 3
    assert all(r.status == "ok" for r in records) and len(runner.requests) == 3


def test_rerun_with_the_same_storage_continues_to_n(tmp_path, events):
    url = st.default_storage(tmp_path / "out")
    runner = FakeRunner(lambda k: measured(rate_of(k)))
    _, first = sweep(tmp_path, runner, events, trials=3, storage=url)
    assert len(first.run()) == 3
    study, second = sweep(tmp_path, runner, events, trials=5, storage=url)
    records = second.run()
    assert len(records) == 5 and len(runner.requests) == 5  # two more runs, not five
    assert events.begun[-1] == (3, 5)
    assert len({tuple(sorted(k.model_dump().items())) for k in runner.knobs}) == 5
    _, third = sweep(tmp_path, runner, events, trials=5, storage=url)
    assert len(third.run()) == 5 and len(runner.requests) == 5  # nothing left to do


def test_ctrl_c_marks_the_trial_interrupted_and_queues_it_again(tmp_path, events):
    url = st.default_storage(tmp_path / "out")
    calls = []

    def outcome(k: Knobs):
        calls.append(k)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measured(rate_of(k))

    study, sw = sweep(tmp_path, FakeRunner(outcome), events, trials=4, storage=url)
    with pytest.raises(KeyboardInterrupt):
        sw.run()
    interrupted = [t for t in study.trials if st.status_of(t) == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].state == TrialState.FAIL
    assert st.counted(study) == 1
    runner = FakeRunner(lambda k: measured(rate_of(k)))
    study, again = sweep(tmp_path, runner, events, trials=4, storage=url)
    records = again.run()
    # the queue is first in, first out: the third seed (still queued when Ctrl-C came), then the retry
    assert runner.knobs[1] == calls[1] and runner.knobs[0] not in calls
    retry = next(r for r in records if r.source == "retry")
    assert retry.params == interrupted[0].params and len(records) == 4


def test_a_killed_sweeps_running_trial_is_recovered(tmp_path, events):
    url = st.default_storage(tmp_path / "out")
    study = st.open_study(url, "s")
    space = build_space(tiny_plan())
    st.check_identity(study, tiny_plan(), space)
    trial = study.ask(st.distributions(space))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    st.lease(trial, 600)
    trial.set_user_attr("lease_pid", dead.pid)  # the sweep that asked for it is gone
    runner = FakeRunner(lambda k: measured(rate_of(k)))
    study, sw = sweep(tmp_path, runner, events, trials=2, storage=url)
    records = sw.run()
    assert any("interrupted" in n for n in events.notes)
    assert records[0].source == "retry" and records[0].params == trial.params
    assert study.trials[trial.number].state == TrialState.FAIL


def test_live_trial_of_another_process_is_left_alone(tmp_path):
    study = st.open_study(None, "s")
    space = build_space(tiny_plan())
    trial = study.ask(st.distributions(space))
    st.lease(trial, 600)  # this very process: alive, deadline in the future
    assert st.recover_stale(study) == []
    trial.set_user_attr("lease_deadline_unix", 0.0)  # past its deadline: stale wherever it runs
    assert st.recover_stale(study) == [trial.number]


def test_duplicates_are_not_counted_and_the_space_can_run_out(tmp_path, events):
    plan = tiny_plan()
    runner = FakeRunner(lambda k: measured(rate_of(k)))
    study = st.open_study(None, "s")
    space = build_space(plan).restrict(["gradient_checkpointing"])
    settings = SweepSettings(trials=3, out_dir=str(tmp_path / "out"), config_path="c.toml", use_prior=False)
    records = Sweep(
        study, plan, prepare(plan, space, memory_limit(plan), False), settings, runner=runner, events=events
    ).run()
    assert len(records) == 2 == len(runner.requests)  # the space has two points
    assert {r.params["gradient_checkpointing"] for r in records} == {False, True}
    assert "every point of the space has been tried" in events.notes
    dups = [t for t in study.trials if st.status_of(t) == "duplicate"]
    assert dups and all(t.state == TrialState.FAIL and "duplicate_of" in t.user_attrs for t in dups)


def test_the_same_crash_three_times_stops_the_sweep(tmp_path, events):
    runner = FakeRunner(lambda k: failed("crash", "grpo-run exited with status 2: error: No dataset at 'x'"))
    study, sw = sweep(tmp_path, runner, events, trials=8)
    with pytest.raises(RunError, match="The last 3 trials crashed the same way: .*No dataset"):
        sw.run()
    assert st.counted(study) == 3


def test_a_study_is_not_continued_with_another_plan(tmp_path, events):
    url = st.default_storage(tmp_path / "out")
    runner = FakeRunner(lambda k: measured(rate_of(k)))
    _, sw = sweep(tmp_path, runner, events, trials=1, storage=url)
    sw.run()
    other = tiny_plan().model_copy(update={"workload": tiny_plan().workload.model_copy(update={"n": 8})})
    _, sw2 = sweep(tmp_path, runner, events, trials=2, storage=url, plan=other)
    with pytest.raises(InputError, match="made for another model, cluster, workload or target"):
        sw2.run()
    moved = tiny_plan().model_copy(update={"knobs": tiny_plan().knobs.model_copy(update={"fused_logprob": False})})
    _, sw3 = sweep(tmp_path, runner, events, trials=2, storage=url, plan=moved)
    with pytest.raises(InputError, match="knob space"):
        sw3.run()
    assert params_of(build_space(moved), moved.knobs) is not None


def test_bad_storage_url_is_an_input_error():
    with pytest.raises(InputError, match="Cannot open the study storage"):
        st.open_study("notadb://nowhere", "s")
    assert isinstance(st.open_study(None, "s"), optuna.Study)


def test_adapter_sweep_runs_trial_plans_with_their_rank_and_targets(tmp_path, events):
    from grpo_pilot.planner.plan import load_plan
    from grpo_pilot.tuner.report import best_plan, write_outputs

    plan = load_plan("examples/tiny/plan-lora.json")
    seen: list = []

    class AdapterRunner(FakeRunner):
        def run(self, request):
            seen.append(load_plan(request.plan_path).workload.adapter)
            return super().run(request)

    # a made-up machine where smaller adapters are faster
    runner = AdapterRunner(
        lambda k: measured(1000.0 / seen[-1].rank * (2 if seen[-1].target_modules == ("q_proj", "v_proj") else 1))
    )
    space = build_space(plan, sweep_adapter=True).restrict(["lora_rank", "lora_targets"])
    study, sw = sweep(tmp_path, runner, events, trials=12, plan=plan, space=space)
    records = sw.run()
    assert len(records) == 12  # the whole 4 x 3 grid
    assert {(a.rank, a.target_modules) for a in seen} == {
        (r, tuple(t.split(","))) for r in (8, 16, 32, 64) for t in space.choices["lora_targets"]
    }
    assert records[0].params == {"lora_rank": 8, "lora_targets": "all-linear"}  # the input plan first
    best = max(records, key=lambda r: r.measured_tokens_per_s)
    assert best_plan(plan, best).workload.adapter.rank == 8
    assert best_plan(plan, best).workload.adapter.target_modules == ("q_proj", "v_proj")
    # the plan models the adapters (frozen base, adapter-only grads and AdamW): its trials calibrate the estimator
    assert adapters_modelled(plan)
    outputs = write_outputs(tmp_path / "report", plan, records)
    assert outputs.calibration_json is not None and Path(outputs.calibration_json).is_file()
    # a plan made before grpo-plan modelled adapters predicts full fine-tuning: no base for calibrating LoRA runs
    full_ft = {
        ph: p.model_copy(update={"items": {k: v for k, v in p.items.items() if not any(m in k for m in MARKERS)}})
        for ph, p in plan.phases.items()
    }
    old = plan.model_copy(update={"phases": full_ft})
    assert not adapters_modelled(old)
    outputs = write_outputs(tmp_path / "report-old", old, records)
    assert outputs.calibration_json is None
    assert any("adapters" in n for n in outputs.notes)


def test_two_sweeps_on_one_storage_never_overshoot_n(tmp_path, events):
    """Another sweep's running trial counts toward N: this sweep stops asking when counted + running elsewhere
    make N, and a trial asked just after another sweep's (a later number) is closed as surplus, unrun."""
    url = st.default_storage(tmp_path / "out")
    foreign: list = []

    def outcome(k: Knobs):
        if not foreign:  # while this sweep's first trial runs, another sweep asks (and leases) one
            other = st.open_study(url, "s")
            trial = other.ask(st.distributions(build_space(tiny_plan())))
            st.lease(trial, 600)
            foreign.append(trial.number)
        return measured(rate_of(k))

    runner = FakeRunner(outcome)
    study, sw = sweep(tmp_path, runner, events, trials=2, storage=url)
    records = sw.run()
    assert len(records) == 1 == len(runner.requests)  # 1 measured here + 1 running elsewhere = N
    assert st.counted(study) + st.in_flight(study) == 2

    # the race: the other sweep's ask lands between this sweep's check and its own ask
    study2, sw2 = sweep(tmp_path, runner, events, trials=3, storage=url)
    asked = study2.ask

    def ask_after_another(*args, **kwargs):
        other = st.open_study(url, "s")
        st.lease(other.ask(st.distributions(build_space(tiny_plan()))), 600)
        return asked(*args, **kwargs)

    study2.ask = ask_after_another  # type: ignore[method-assign]
    space = build_space(tiny_plan())
    for point in list(grid(space))[-2:]:  # two queued points: the other sweep takes one, this sweep the next
        study2.enqueue_trial(point, user_attrs={"source": "planner"})
    assert len(sw2.run()) == 1 and len(runner.requests) == 1  # nothing more ran here
    trials = study2.get_trials(deepcopy=False)
    surplus = [t for t in trials if st.status_of(t) == "surplus"]
    assert len(surplus) == 1 and surplus[0].state == TrialState.FAIL
    assert st.counted(study2) + st.in_flight(study2) == 3
    # the queued point the surplus trial took goes back to the queue (beside the one nobody took yet)
    waiting = study2.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    queue = [(t.system_attrs["fixed_params"], t.user_attrs["source"]) for t in waiting]
    assert len(queue) == 2 and queue[-1] == (surplus[0].params, "planner")


def test_a_locked_sqlite_storage_is_announced_then_refused(tmp_path, monkeypatch):
    import sqlite3

    url = st.default_storage(tmp_path)
    st.open_study(url, "s")
    holder = sqlite3.connect(str(tmp_path / st.STORAGE_FILE), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # optuna-dashboard, sqlite3 or a stuck process holding the write lock
    monkeypatch.setattr(st, "SQLITE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(st, "LOCK_PROBE_S", 0.1)
    heard: list[str] = []
    try:
        with pytest.raises(InputError, match="stayed locked for 1 s: another process holds a write lock"):
            st.open_study(url, "s", notify=heard.append)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert heard and "is locked by another process" in heard[0] and "waiting up to 1 s" in heard[0]
    assert isinstance(st.open_study(url, "s", notify=heard.append), optuna.Study) and len(heard) == 1
