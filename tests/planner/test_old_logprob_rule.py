"""The old-policy log-prob pass: verl always runs it; our engine and TRL skip it on one on-policy update."""

from __future__ import annotations

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload, old_logprob_pass_needed
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.timing import estimate_time
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles import resolve_model

SPEC = resolve_model("qwen2.5-7b").spec
CLUSTER = parse_cluster("8xA100-80G")
ON_POLICY = Workload(prompts_per_step=256, mini_batch_prompts=256, n=4, use_kl_loss=False)
TWO_MINI = Workload(prompts_per_step=256, mini_batch_prompts=128, n=4, use_kl_loss=False)


@pytest.mark.parametrize("target,expected", [("verl", True), ("grpo-pilot", False), ("trl", False)])
def test_rule_on_one_on_policy_update(target, expected):
    target = traits_for(target)
    assert old_logprob_pass_needed(ON_POLICY, target) is expected
    assert old_logprob_pass_needed(TWO_MINI, target) is True
    assert old_logprob_pass_needed(ON_POLICY.model_copy(update={"ppo_epochs": 2}), target) is True


def test_on_policy_without_kl_has_no_log_prob_work_for_our_engine():
    knobs = Knobs()
    on = estimate_memory(SPEC, CLUSTER, ON_POLICY, knobs, target="grpo-pilot").phases["log_prob"]
    off = estimate_memory(SPEC, CLUSTER, TWO_MINI, knobs, target="grpo-pilot").phases["log_prob"]
    assert on.items.get("logits", 0) == 0 and off.items["logits"] > 0
    assert on.total_bytes < off.total_bytes
    assert estimate_time(SPEC, CLUSTER, ON_POLICY, knobs, target="grpo-pilot").phases_s["log_prob"] == 0.0
    assert estimate_time(SPEC, CLUSTER, TWO_MINI, knobs, target="grpo-pilot").phases_s["log_prob"] > 0.0
    # verl recomputes old log-probs even then
    assert estimate_time(SPEC, CLUSTER, ON_POLICY, knobs, target="verl").phases_s["log_prob"] > 0.0
