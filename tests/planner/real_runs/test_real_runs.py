"""The real-run corpus (cases.json): grpo-plan must agree with what public runs did.

Every case goes through `grpo-plan` as a user would type it (`corpus.command`): its launch file as
published (`--from-verl` / `--from-trl`), the GPUs it ran on, and the length statistics its logs report.
- verdict: a run that ran must fit, a reported OOM must not (headroom 0: the estimate against the device);
- published step times: within 2x, and the cases ranked as measured;
- rankings (one source's side-by-side measurements: GPU counts, TP sizes): predicted in the measured
  order, and where the lengths are assumed, in that order over the whole range of assumed lengths.
verl's own example scripts (verl_examples/) must be read unchanged.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import HERE, command, load_cases, load_rankings, run_case  # noqa: E402

from grpo_pilot.cli.plan import app  # noqa: E402
from grpo_pilot.hardware import parse_cluster  # noqa: E402
from grpo_pilot.planner.from_trl import read_trl  # noqa: E402
from grpo_pilot.planner.from_verl import read_verl  # noqa: E402

CASES = load_cases()
RANKINGS = load_rankings()
TIME_RATIO_BOUND = 2.0
# Mean response lengths (tokens) an assumed-length ranking must hold over (cases.json says why).
ASSUMED_RESPONSE_MEANS = (1000, 3000, 4000)


@lru_cache(maxsize=None)
def plan_of(case_id: str) -> dict:
    return run_case(next(c for c in CASES if c["id"] == case_id))


def test_the_corpus_is_large_and_documented() -> None:
    assert len(CASES) >= 15
    assert len({c["id"] for c in CASES}) == len(CASES)
    for case in CASES:
        assert case["source"]["launch"] and case["source"]["outcome"], case["id"]
        assert case["outcome"]["status"] in ("ran", "oom"), case["id"]
        assert case["hardware"]["gpus"], case["id"]
        launch = case["launch"]
        if launch["kind"] != "search":
            assert (HERE / launch["file"]).is_file(), case["id"]
        for extra in ("overrides", "pins"):
            if launch.get(extra):  # every deviation from the file as published says why
                assert launch.get(f"why_{extra}"), (case["id"], extra)
    assert any(c["outcome"]["status"] == "oom" for c in CASES)
    assert sum(1 for c in CASES if c["outcome"].get("step_s")) >= 3
    ids = {c["id"] for c in CASES}
    for ranking in RANKINGS:
        assert ranking["source"] and ranking["claim"] and len(ranking["cases"]) >= 2, ranking["id"]
        for member in ranking["cases"]:
            assert member in ids, (ranking["id"], member)
            assert next(c for c in CASES if c["id"] == member)["outcome"].get("step_s"), member
    for case in CASES:
        lengths = case.get("lengths") or {}
        assert not lengths or lengths.get("source"), case["id"]  # measured or assumed, the case says whence


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_verdict_matches_the_run(case: dict) -> None:
    plan = plan_of(case["id"])
    expected = case["outcome"]["status"] == "ran"
    peak, usable = plan["peak_gpu_bytes"] / 2**30, plan["usable_gpu_bytes"] / 2**30
    assert plan["fits"] is expected, f"{case['id']}: peak {peak:.1f} GiB of {usable:.1f} GiB, {plan['violations']}"
    if case["launch"]["kind"] == "search":  # a claim about every configuration: the search found none
        assert plan["provenance"]["search_trials"] > 0


MEASURED = [c for c in CASES if c["outcome"].get("step_s")]


@pytest.mark.parametrize("case", MEASURED, ids=[c["id"] for c in MEASURED])
def test_published_step_time_within_2x(case: dict) -> None:
    predicted, measured = plan_of(case["id"])["predicted_step_s"], case["outcome"]["step_s"]
    ratio = predicted / measured
    assert 1 / TIME_RATIO_BOUND <= ratio <= TIME_RATIO_BOUND, f"{case['id']}: {predicted:.1f} s vs {measured} s"


def test_step_times_rank_as_measured() -> None:
    measured = sorted(MEASURED, key=lambda c: c["outcome"]["step_s"])
    predicted = sorted(MEASURED, key=lambda c: plan_of(c["id"])["predicted_step_s"])
    assert [c["id"] for c in predicted] == [c["id"] for c in measured]


def test_launch_files_are_read_as_published() -> None:
    """Every stored launch file parses with the readers (the command line only adds what it says)."""
    for case in CASES:
        launch = case["launch"]
        if launch["kind"] == "verl":
            read_verl((HERE / launch["file"]).read_text(), launch.get("overrides"))
        elif launch["kind"] == "trl":
            cluster = parse_cluster(case["hardware"]["gpus"])
            read_trl(
                (HERE / launch["file"]).read_text(), cluster.world_size, launch.get("overrides"), cluster.num_nodes
            )


VERL_EXAMPLES = sorted((HERE / "verl_examples").glob("*.sh"))


@pytest.mark.parametrize("script", VERL_EXAMPLES, ids=[p.name for p in VERL_EXAMPLES])
def test_verl_examples_are_read_unchanged(script: Path) -> None:
    """verl's examples/grpo_trainer scripts evaluate as published: exit 0 (fits) or 3 (does not fit) with a
    plan, never a usage error."""
    result = CliRunner().invoke(app, ["--from-verl", str(script), "--gpus", "H100", "--json"])
    assert result.exit_code in (0, 3), result.output[-2000:]
    plan = json.loads(result.stdout)
    assert plan["target"] == "verl" and plan["workload"]["n"] >= 1


def test_case_command_is_what_a_user_types() -> None:
    case = next(c for c in CASES if c["id"] == "verl-mi300-deepseek-llm-7b-8xMI300X")
    args = command(case)
    assert args[:2] == ["--from-verl", str(HERE / case["launch"]["file"])]
    assert "--override" in args and "VLLM_VERSION=0.6.3" in args and "--response-len-mean" in args


def _members_by_measured_time(ranking: dict) -> list[dict]:
    members = [next(c for c in CASES if c["id"] == member) for member in ranking["cases"]]
    return sorted(members, key=lambda c: c["outcome"]["step_s"])


@pytest.mark.parametrize("ranking", RANKINGS, ids=[r["id"] for r in RANKINGS])
def test_rankings_are_predicted_in_the_measured_order(ranking: dict) -> None:
    members = _members_by_measured_time(ranking)
    predicted = [plan_of(c["id"])["predicted_step_s"] for c in members]
    assert predicted == sorted(predicted), [(c["id"], round(p, 1)) for c, p in zip(members, predicted)]


ASSUMED = [r for r in RANKINGS if any((c.get("lengths") or {}).get("assumed") for c in _members_by_measured_time(r))]


@pytest.mark.parametrize("ranking", ASSUMED, ids=[r["id"] for r in ASSUMED])
@pytest.mark.parametrize("response_mean", ASSUMED_RESPONSE_MEANS)
def test_assumed_length_rankings_hold_over_the_assumed_range(ranking: dict, response_mean: int) -> None:
    """The order must not hang on the one assumed mean length: it holds from 1,000 to 4,000 tokens."""
    predicted = []
    for case in _members_by_measured_time(ranking):
        lengths = dict(case["lengths"], flags=dict(case["lengths"]["flags"], **{"--response-len-mean": response_mean}))
        predicted.append(run_case(dict(case, lengths=lengths))["predicted_step_s"])
    assert predicted == sorted(predicted), predicted
