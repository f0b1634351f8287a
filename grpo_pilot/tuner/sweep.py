"""The sweep: an ask/tell loop over real trials until the study holds N counted trials.

One trial, top to bottom (`_one_trial`):
  1. ask the study for a point (a queued seed or retry first, else the sampler);
  2. a point already tried, queued or running is a duplicate: told failed and not counted; after
     `DUPLICATE_LIMIT` in a row, an unseen point is queued (best predicted, or random without prior);
  3. the planner evaluates the point into a trial plan (prediction for every phase);
  4. predicted far over memory → recorded as pruned, not run (never the input plan: it is the
     baseline, and its measurement calibrates the pruning of everything after it);
  5. otherwise the trial plan runs through the engine (`TrialRunner`), and the record — prediction
     beside measurement, or the failure with its reason — is stored with the trial; the study is
     told the measured tokens/s (complete) or failed.
A sweep stopped by Ctrl-C marks its running trial interrupted and queues its point again; a sweep
killed outright leaves a stale RUNNING trial that the next start recovers (`study.recover_stale`).
Several sweeps may share one storage: a sweep stops asking when the trials counted plus those running
elsewhere make N, and a trial asked when that was already so (two asked at once: the later number
yields) is closed as `surplus` without running, so N is never overshot.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState
from pydantic import Field

from grpo_pilot.errors import RunError
from grpo_pilot.models import Frozen
from grpo_pilot.planner.evaluate import PlanInputs
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.plan import Plan, save_plan
from grpo_pilot.planner.recheck import plan_inputs
from grpo_pilot.tuner import study as st
from grpo_pilot.tuner.prior import (
    Candidate,
    MemoryLimit,
    memory_limit,
    memory_ratio,
    prune_reason,
    rank,
    seed_points,
)
from grpo_pilot.tuner.records import RECORD_ATTR, Source, TrialRecord, build_record
from grpo_pilot.tuner.runner import TrialOutcome, TrialRequest, TrialRunner
from grpo_pilot.tuner.space import TuneSpace, grid, inputs_at, knobs_at, params_of, point_key
from grpo_pilot.tuner.versions import gpu_kind, software_versions

DUPLICATE_LIMIT = 5  # duplicates in a row before an unseen point is queued
SAME_CRASH_LIMIT = 3  # identical crashes in a row stop the sweep: the setup is broken, not the knobs
SURPLUS = object()  # `_one_trial`: N is reached by trials counted and running in other sweeps of the storage


class SweepSettings(Frozen):
    """How the sweep runs (the CLI flags)."""

    trials: int = Field(ge=1, description="Counted trials the study should hold when the sweep ends.")
    steps_per_trial: int = Field(default=3, ge=3, description="Steps per trial; the first is warm-up.")
    trial_timeout_s: float = Field(default=900.0, gt=0, description="Wall-clock limit of one trial.")
    out_dir: str = Field(description="Output directory; trials run in OUT/trials/STUDY-NNNN.")
    config_path: str = Field(description="Run config passed to every trial.")
    memory_cap_bytes: int | None = Field(default=None, gt=0, description="Run config memory_cap_bytes, if set.")
    use_prior: bool = Field(default=True, description="Seed, prune and rank with the planner (False: plain Optuna).")
    seed_plans: int = Field(default=3, ge=0, description="Points queued from the planner before the sampler.")
    fallback_seed: int = Field(default=0, description="Seeds the random choice of unseen points without prior.")


class SweepEvents(Protocol):
    """What the progress display hears."""

    def begin(self, done: int, total: int) -> None: ...

    def trial_started(self, number: int, params: dict[str, Any], source: str) -> None: ...

    def trial_finished(self, record: TrialRecord) -> None: ...

    def note(self, text: str) -> None: ...


class SweepSetup(Frozen):
    """The space and the planner's ranking of its points (empty without the prior)."""

    space: TuneSpace
    ranked: tuple[Candidate, ...] = ()


def prepare(plan: Plan, space: TuneSpace, limit: MemoryLimit, use_prior: bool) -> SweepSetup:
    """Rank the space's points by the planner's prediction (with the prior only)."""
    if not use_prior:
        return SweepSetup(space=space)
    return SweepSetup(space=space, ranked=tuple(rank(space, plan_inputs(plan), limit)))


class Sweep:
    """One sweep process over one study."""

    def __init__(
        self,
        study: optuna.Study,
        plan: Plan,
        setup: SweepSetup,
        settings: SweepSettings,
        *,
        runner: TrialRunner,
        events: SweepEvents,
    ) -> None:
        self.study, self.plan, self.setup, self.settings = study, plan, setup, settings
        self.runner, self.events = runner, events
        self.space = setup.space
        self.inputs: PlanInputs = plan_inputs(plan)
        self.limit = memory_limit(plan, settings.memory_cap_bytes)
        self.base_params = params_of(self.space, self.space.base)
        self.distributions = st.distributions(self.space)
        self.versions = software_versions()
        self.rng = random.Random(settings.fallback_seed)
        self._gpu_kinds: dict[str | None, str] = {}

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> list[TrialRecord]:
        st.check_identity(self.study, self.plan, self.space)
        recovered = st.recover_stale(self.study)
        if recovered:
            self.events.note(f"trial(s) {', '.join(map(str, recovered))} were interrupted; their points run again")
        if self.settings.use_prior:
            self._enqueue_seeds()
        self.events.begin(st.counted(self.study), self.settings.trials)
        duplicates = 0
        while st.counted(self.study) + st.in_flight(self.study) < self.settings.trials:
            record = self._one_trial()
            if record is SURPLUS:
                break
            if record is not None:
                duplicates = 0
                self._stop_on_repeated_crash()
                continue
            duplicates += 1
            if duplicates >= DUPLICATE_LIMIT:
                duplicates = 0
                if not self._enqueue_unseen():
                    self.events.note("every point of the space has been tried")
                    break
        return st.records(self.study)

    def _enqueue_seeds(self) -> None:
        for params in seed_points(self.space, list(self.setup.ranked), self.settings.seed_plans):
            source: Source = "input_plan" if params == self.base_params else "planner"
            self.study.enqueue_trial(params, user_attrs={"source": source}, skip_if_exists=True)

    def _enqueue_unseen(self) -> bool:
        taken = st.taken_points(self.study)
        if self.setup.ranked:
            for cand in self.setup.ranked:
                if point_key(cand.params) not in taken:
                    self.study.enqueue_trial(cand.params, user_attrs={"source": "planner_fallback"})
                    return True
            return False
        unseen = [p for p in grid(self.space) if point_key(p) not in taken]
        if not unseen:
            return False
        self.study.enqueue_trial(self.rng.choice(unseen), user_attrs={"source": "random_fallback"})
        return True

    def _one_trial(self) -> TrialRecord | object | None:
        """One trial (module docstring): its record; None for a duplicate; `SURPLUS` when the trials counted and
        running elsewhere already make N (another sweep on this storage asked first)."""
        trial = self.study.ask(self.distributions)
        st.lease(trial, self.settings.trial_timeout_s)
        params = dict(trial.params)
        source: Source = trial.user_attrs.get("source", "sampler")
        if st.counted(self.study) + st.in_flight(self.study, before=trial.number) >= self.settings.trials:
            self._give_back(trial, params)
            return SURPLUS
        earlier = st.taken_points(self.study, exclude=trial.number).get(point_key(params))
        if earlier is not None:
            trial.set_user_attr("status", "duplicate")
            trial.set_user_attr("duplicate_of", earlier)
            self.study.tell(trial, state=TrialState.FAIL)
            return None
        plan = evaluate(inputs_at(self.space, self.inputs, params), knobs_at(self.space, params))
        ratio = memory_ratio(
            [
                (r.measured_peak_bytes, r.predicted_peak_tensor_bytes)
                for r in st.records(self.study)
                if r.status == "ok" and r.measured_peak_bytes is not None
            ]
        )
        # the input plan always runs (also when retried): it is the baseline, and its measurement tells the
        # pruning how far off the planner is on this machine before anything is skipped
        prunable = self.settings.use_prior and params != self.base_params
        reason = prune_reason(plan, self.limit, ratio) if prunable else None
        self.events.trial_started(trial.number, params, source)
        if reason is not None:
            record = self._record(trial.number, source=source, params=params, plan=plan, outcome=None, prune=reason)
            return self._finish(trial, record, TrialState.PRUNED)
        try:
            record = self._measure(trial.number, source, params, plan)
        except BaseException:
            trial.set_user_attr("status", "interrupted")
            self.study.tell(trial, state=TrialState.FAIL)
            self.study.enqueue_trial(params, user_attrs={"source": "retry", "retry_of": trial.number})
            raise
        return self._finish(trial, record, TrialState.COMPLETE if record.status == "ok" else TrialState.FAIL)

    def _give_back(self, trial: optuna.Trial, params: dict[str, Any]) -> None:
        """Close a trial this sweep does not need (status `surplus`: not counted); a queued point goes back."""
        trial.set_user_attr("status", "surplus")
        self.study.tell(trial, state=TrialState.FAIL)
        attrs = {k: v for k, v in trial.user_attrs.items() if not k.startswith("lease_") and k != "status"}
        if "source" in attrs:  # it came from the queue (a seed or a retry)
            self.study.enqueue_trial(params, user_attrs=attrs)

    def _measure(self, number: int, source: Source, params: dict[str, Any], plan: Plan) -> TrialRecord:
        trial_dir = Path(self.settings.out_dir) / "trials" / f"{self.study.study_name}-{number:04d}"
        if trial_dir.exists():
            shutil.rmtree(trial_dir)  # left by an earlier study of the same name: the engine refuses to overwrite
        plan_path = save_plan(plan, trial_dir / "trialplan.json")
        settings = (
            {} if self.settings.memory_cap_bytes is None else {"memory_cap_bytes": self.settings.memory_cap_bytes}
        )
        request = TrialRequest(
            plan_path=str(plan_path),
            config_path=self.settings.config_path,
            out_dir=str(trial_dir / "run"),
            steps=self.settings.steps_per_trial,
            timeout_s=self.settings.trial_timeout_s,
            settings=settings,
        )
        outcome = self.runner.run(request)
        return self._record(number, source=source, params=params, plan=plan, outcome=outcome, trial_dir=str(trial_dir))

    def _record(
        self,
        number: int,
        *,
        source: Source,
        params: dict[str, Any],
        plan: Plan,
        outcome: TrialOutcome | None,
        prune: str | None = None,
        trial_dir: str | None = None,
    ) -> TrialRecord:
        device = outcome.device if outcome is not None else None
        if device not in self._gpu_kinds:
            self._gpu_kinds[device] = gpu_kind(device) if outcome is not None else "not run"
        return build_record(
            number=number,
            source=source,
            params=params,
            plan=plan,
            outcome=outcome,
            steps=self.settings.steps_per_trial,
            gpu_kind=self._gpu_kinds[device],
            versions=self.versions,
            prune_reason=prune,
            memory_cap_bytes=self.settings.memory_cap_bytes,
            trial_dir=trial_dir,
        )

    def _finish(self, trial: optuna.Trial, record: TrialRecord, state: TrialState) -> TrialRecord:
        trial.set_user_attr(RECORD_ATTR, record.model_dump(mode="json"))
        trial.set_user_attr("status", record.status)
        if record.failure_kind is not None:
            trial.set_user_attr("failure", f"{record.failure_kind}: {record.failure_message}")
        if record.prune_reason is not None:
            trial.set_user_attr("prune_reason", record.prune_reason)
        if state == TrialState.COMPLETE:
            self.study.tell(trial, record.measured_tokens_per_s)
        else:
            self.study.tell(trial, state=state)
        self.events.trial_finished(record)
        return record

    def _stop_on_repeated_crash(self) -> None:
        recent = [r for r in st.records(self.study) if r.status != "pruned"][-SAME_CRASH_LIMIT:]
        messages = {r.failure_message for r in recent}
        if len(recent) == SAME_CRASH_LIMIT and all(r.status == "crash" for r in recent) and len(messages) == 1:
            raise RunError(
                f"The last {SAME_CRASH_LIMIT} trials crashed the same way: {recent[-1].failure_message}",
                f"Fix the setup (see {recent[-1].trial_dir}/run/grpo-run.log), then run the same command again: "
                "the sweep continues where it stopped.",
            )
