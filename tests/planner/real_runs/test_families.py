"""The launch-family cases (cases_families.json, HELDOUT.md "Launch families"): public PPO, Megatron, LoRA,
SGLang and TRL LoRA/QLoRA launches with outcomes, each through `grpo-plan` as a user types it
(`corpus.command`: --from-verl / --from-trl as published, `--headroom-gib 0`).

What must hold (the held-out convention, test_heldout.py: none of these launches publishes length
statistics except the MI300 log, so a plan judges every sequence at its maximum):
- a launch is refused (exit 2) only where docs/families.md says why it cannot be planned (`REFUSED`);
- a launch that ran reads as "fits" or "fits while the mean response stays under N"; one that ran out of
  memory never reads as a plain "fits";
- an OOM and the run it is contrasted with (or fixed by) on the same launch: the OOM reads worse (a smaller
  margin, or a smaller mean-response boundary);
- a published step time: within 2× with the run's lengths (the corpus's time tolerance, test_real_runs.py),
  and below 2× the plan's time at the maxima without them; a PPO plan has the critic's phases.
`KNOWN_MISSES` are the cases the model does not get right, each with the mechanism (HELDOUT.md); they are
strict xfails: a change that fixes one must move it out of the list.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import HERE, evaluate, load_cases  # noqa: E402

CASES = load_cases(HERE / "cases_families.json")
BY_ID = {c["id"]: c for c in CASES}
TIME_RATIO_BOUND = 2.0
REFUSED = {
    # planner/support.py: MoE token dispatch, expert imbalance and Megatron's CPU optimizer are not modelled
    "verl-qwen3moe-30b-a3b-megatron-96gb-8x8xH20": "Mixture-of-Experts model under Megatron is not modelled",
}
KNOWN_MISSES: dict[str, str] = {}


@lru_cache(maxsize=None)
def answer(case_id: str) -> dict:
    return evaluate(BY_ID[case_id])


def _kind(plan: dict) -> str:
    return (plan.get("verdict") or {}).get("kind") or ("fits" if plan["fits"] else "does_not_fit")


def _judged(case: dict):
    return pytest.param(
        case,
        id=case["id"],
        marks=[pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[case["id"]])] if case["id"] in KNOWN_MISSES else [],
    )


@pytest.mark.parametrize("case", [_judged(c) for c in CASES])
def test_family_verdict(case: dict) -> None:
    result = answer(case["id"])
    if case["id"] in REFUSED:
        assert result["exit_code"] == 2 and REFUSED[case["id"]] in result["error"], result["error"]
        return
    assert result["exit_code"] != 2, f"{case['id']} refused: {result['error']}"
    kind = _kind(result["plan"])
    if case["outcome"]["status"] == "ran":
        assert kind in ("fits", "fits_below_mean_response", "fits_below_mean_lengths"), (case["id"], kind)
    else:
        assert kind != "fits", (case["id"], kind, result["plan"]["peak_gpu_bytes"] / 2**30)


PAIRS = [
    (c["id"], c["outcome"].get("contrast") or c["outcome"].get("fixed_by"))
    for c in CASES
    if c["outcome"]["status"] == "oom" and (c["outcome"].get("contrast") or c["outcome"].get("fixed_by"))
]


def _badness(plan: dict) -> tuple[int, float]:
    """Larger is worse: the verdict's rank, then how far below the maxima it fits (or the peak's share)."""
    kind = _kind(plan)
    rank = {"fits": 0, "tight": 1, "fits_below_mean_response": 2, "fits_below_mean_lengths": 3, "does_not_fit": 4}[kind]
    if kind == "fits_below_mean_response":
        return rank, -plan["verdict"]["boundary_mean_response_tokens"]
    if kind == "fits_below_mean_lengths":  # both means scaled together: the longer boundary is the better one
        return rank, -(
            plan["verdict"]["boundary_mean_prompt_tokens"] + plan["verdict"]["boundary_mean_response_tokens"]
        )
    return rank, plan["peak_gpu_bytes"] / plan["usable_gpu_bytes"]


@pytest.mark.parametrize("oom, ran", PAIRS, ids=[p[0] for p in PAIRS])
def test_an_oom_reads_worse_than_the_run_it_is_contrasted_with(oom: str, ran: str) -> None:
    assert _badness(answer(oom)["plan"]) > _badness(answer(ran)["plan"]), (oom, ran)


TIMED = [c for c in CASES if c["outcome"].get("step_s")]


@pytest.mark.parametrize("case", TIMED, ids=[c["id"] for c in TIMED])
def test_published_step_times(case: dict) -> None:
    plan = answer(case["id"])["plan"]
    measured, predicted = case["outcome"]["step_s"], plan["predicted_step_s"]
    if case.get("lengths"):
        assert 1 / TIME_RATIO_BOUND <= predicted / measured <= TIME_RATIO_BOUND, (case["id"], predicted)
    else:  # judged at the maxima: the plan's time bounds the run's, within the time tolerance
        assert plan["memory_quantile"] is None
        assert measured < TIME_RATIO_BOUND * predicted, (case["id"], predicted)


def test_ppo_plans_carry_the_critics_phases() -> None:
    mi300 = answer("verl-mi300-ppo-deepseek-llm-7b-8xMI300X")["plan"]
    measured = BY_ID["verl-mi300-ppo-deepseek-llm-7b-8xMI300X"]["outcome"]["phase_s"]
    times = mi300["phase_times_s"]
    assert mi300["workload"]["algorithm"] == "ppo" and {"values", "critic_update"} <= set(times)
    # the log's ratios: the critic's update costs about the actor's (0.88), its values pass about one log-prob
    # pass (the plan's log_prob phase holds the old-policy and reference passes: two)
    assert 0.6 < (times["critic_update"] / times["update"]) / (measured["update_critic"] / measured["update"]) < 1.4
    assert times["values"] < times["log_prob"]
    for case in CASES:
        family = case["family"] if isinstance(case["family"], list) else [case["family"]]
        plan = answer(case["id"])["plan"]
        if "ppo-critic" in family and plan is not None:
            assert {"values", "critic_update"} <= set(plan["phases"]), case["id"]
