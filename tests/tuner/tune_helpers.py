"""Helpers for the tuner tests: plans to tune, outcomes, and a test double of the trial runner."""

from __future__ import annotations

from typing import Callable

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import PlanInputs, model_ref
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.plan import Plan, load_plan
from grpo_pilot.profiles import resolve_model
from grpo_pilot.tuner.runner import Failure, PhaseMeasurement, TrialOutcome, TrialRequest

TINY_PLAN = "examples/tiny/plan.json"
TINY_CONFIG = "examples/tiny/run.toml"


def tiny_plan() -> Plan:
    return load_plan(TINY_PLAN)


def gpu_plan(model: str = "qwen2.5-7b", gpus: str = "8xH100-80G", workload: Workload | None = None, **knobs) -> Plan:
    inputs = PlanInputs(
        model=model_ref(resolve_model(model)), cluster=parse_cluster(gpus), workload=workload or Workload()
    )
    return evaluate(inputs, Knobs(**knobs))


def measured(tokens_per_s: float, peak_bytes: int = 5_000_000, step_s: float = 0.1) -> TrialOutcome:
    """A successful outcome with one number per phase (what profile.json would give)."""
    phases = {
        name: PhaseMeasurement(wall_s=step_s / 4, peak_bytes=peak_bytes if name == "update" else peak_bytes // 2)
        for name in ("weight_sync", "rollout", "reward", "log_prob", "update")
    }
    return TrialOutcome(
        status="ok",
        tokens_per_s=tokens_per_s,
        step_s=step_s,
        phases=phases,
        steps_measured=(2, 3),
        step_tokens_per_s=(tokens_per_s, tokens_per_s),
        device="cpu",
        memory_source="live tensor bytes (TorchDispatchMode tracker)",
        returncode=0,
        wall_s=1.0,
    )


def failed(kind: str, message: str = "boom", phase: str | None = None, step: int | None = None) -> TrialOutcome:
    return TrialOutcome(
        status=kind,
        failure=Failure(kind=kind, message=message, phase=phase, step=step),
        returncode=None if kind == "timeout" else 1,
        wall_s=1.0,
    )


class FakeRunner:
    """Test double of `SubprocessRunner`: the outcome is a function of the trial plan's knobs."""

    def __init__(self, outcome: Callable[[Knobs], TrialOutcome]) -> None:
        self.outcome = outcome
        self.requests: list[TrialRequest] = []
        self.knobs: list[Knobs] = []

    def run(self, request: TrialRequest) -> TrialOutcome:
        self.requests.append(request)
        knobs = load_plan(request.plan_path).knobs
        self.knobs.append(knobs)
        return self.outcome(knobs)


class Events:
    """Records what the sweep reports (a `SweepEvents`)."""

    def __init__(self) -> None:
        self.started: list[tuple[int, str]] = []
        self.finished: list = []
        self.notes: list[str] = []
        self.begun: list[tuple[int, int]] = []

    def begin(self, done: int, total: int) -> None:
        self.begun.append((done, total))

    def trial_started(self, number, params, source) -> None:
        self.started.append((number, source))

    def trial_finished(self, record) -> None:
        self.finished.append(record)

    def note(self, text: str) -> None:
        self.notes.append(text)
