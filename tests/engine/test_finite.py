"""Numbers beyond float32 stop the run before an update is applied (engine/finite.py and its callers)."""

from __future__ import annotations

import pytest
import torch
from test_actor import make_actor, make_samples

from grpo_pilot.engine.actor import LossSettings
from grpo_pilot.engine.finite import FLOAT32_MAX, NonFiniteError, fits_float32
from grpo_pilot.engine.rewards import build_reward
from grpo_pilot.engine.rewards.result import checked_scores
from grpo_pilot.engine.settings import ActorSettings
from grpo_pilot.errors import InputError


def test_fits_float32_is_the_float32_range():
    assert FLOAT32_MAX == float(torch.finfo(torch.float32).max)
    assert fits_float32(FLOAT32_MAX) and fits_float32(-FLOAT32_MAX) and fits_float32(0.0)
    assert not fits_float32(1e39) and not fits_float32(float("inf")) and not fits_float32(float("nan"))
    assert torch.isinf(torch.tensor(1e39, dtype=torch.float32))  # what the check prevents


@pytest.mark.parametrize("value", [1e39, -1e300, 10**400, float("nan"), float("-inf")])
def test_reward_values_beyond_float32_are_a_named_error(value):
    with pytest.raises(NonFiniteError) as info:
        checked_scores([0.5, value], 2, "mine")
    assert info.value.phase == "reward" and "completion 1" in info.value.message


def test_weights_whose_products_overflow_are_refused_when_the_reward_is_built():
    with pytest.raises(InputError, match="beyond float32"):
        build_reward("char_fraction:char=a;weight=1e308")
    with pytest.raises(InputError, match="can sum to"):
        build_reward("char_fraction:char=a;weight=2e38,length=2e38:max_len=4")
    assert build_reward("char_fraction:char=a;weight=1e38,length=1e38:max_len=4").describe()


def test_a_weighted_total_beyond_float32_is_a_named_error(tmp_path):
    (tmp_path / "ten.py").write_text("def score(completion, record):\n    return 10.0\n")
    model = build_reward(f"{tmp_path / 'ten.py'}:score=1e38")  # each part fits float32, their product does not
    with pytest.raises(NonFiniteError, match="weighted reward .* is 1e\\+39 for completion 0, beyond float32"):
        model.score(["a", "b"], [_record(), _record()])


def _record():
    from grpo_pilot.engine.data import PromptRecord

    return PromptRecord(line=1, prompt="p")


def test_an_overflowing_gradient_stops_before_the_optimizer_step():
    actor = make_actor(ActorSettings(micro_batch_size=4, gradient_checkpointing=False))
    samples = make_samples(num=4)
    before = [p.detach().clone() for p in actor.policy.parameters()]
    advantages = torch.full((4,), 3e38)  # finite in float32; the gradient's norm is not
    with pytest.raises(NonFiniteError, match="gradient norm is"):
        actor.update(samples, advantages, LossSettings())
    assert all(torch.equal(a, b) for a, b in zip(before, actor.policy.parameters()))
    assert all(p.grad is None for p in actor.policy.parameters())
    actor.update(samples, torch.ones(4), LossSettings())  # the actor still works: nothing was half-applied
