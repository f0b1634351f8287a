"""Group advantages: closed forms for every scale, singleton and zero-variance groups, layout errors."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpo_pilot.engine import compute_advantages
from grpo_pilot.engine.algos import group_reward_stats
from grpo_pilot.errors import InputError

# Three groups of 4, group-contiguous: spread, all equal, skewed.
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.5, 1.0, 2.0]
SKEWED_DEV = [-0.875, -0.375, 0.125, 1.125]  # group 3 minus its mean 0.875
SKEWED_STD = math.sqrt((0.875**2 + 0.375**2 + 0.125**2 + 1.125**2) / 3)  # Bessel: 2.1875 / 3


def _rewards(dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(REWARDS, dtype=dtype)


def test_group_scale_closed_form_unbiased_std():
    adv = compute_advantages(_rewards(), 4, scale="group", eps=0.0)
    half_sqrt3 = math.sqrt(3) / 2  # 0.5 / sqrt(1/3): group 1 has unbiased std sqrt(1/3)
    expected = [half_sqrt3, -half_sqrt3, -half_sqrt3, half_sqrt3, 0, 0, 0, 0] + [d / SKEWED_STD for d in SKEWED_DEV]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_group_scale_eps_enters_the_denominator():
    eps = 1e-2
    adv = compute_advantages(_rewards(), 4, scale="group", eps=eps)
    assert adv[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + eps), abs=1e-12)
    assert adv[11].item() == pytest.approx(1.125 / (SKEWED_STD + eps), abs=1e-12)


def test_none_scale_is_dr_grpo_mean_centering():
    adv = compute_advantages(_rewards(), 4, scale="none")
    expected = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0] + SKEWED_DEV
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_batch_scale_uses_the_std_of_all_rewards_and_group_means():
    eps = 1e-4
    adv = compute_advantages(_rewards(), 4, scale="batch", eps=eps)
    batch_std = statistics.stdev(REWARDS)  # sample std over all 12 rewards
    dev = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0] + SKEWED_DEV
    torch.testing.assert_close(
        adv, torch.tensor([d / (batch_std + eps) for d in dev], dtype=torch.float64), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_singleton_groups_give_zero_advantage_without_nan(scale):
    adv = compute_advantages(torch.tensor([3.0, -1.0, 0.25]), 1, scale=scale, eps=0.0)
    assert torch.equal(adv, torch.zeros(3))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_zero_variance_groups_are_exactly_zero(scale, eps):
    # 0.1 is not representable: the float mean of three copies differs from 0.1 by an ulp.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.0, 1.0, 0.0], dtype=torch.float64)
    adv = compute_advantages(rewards, 3, scale=scale, eps=eps)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[:3], torch.zeros(3, dtype=torch.float64))
    assert (adv[3:] != 0).all()


def test_group_mean_of_advantages_is_zero_and_normalised_std_is_one():
    rewards = torch.rand(8 * 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    adv = compute_advantages(rewards, 5, eps=0.0).reshape(8, 5)
    torch.testing.assert_close(adv.mean(dim=1), torch.zeros(8, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(adv.std(dim=1), torch.ones(8, dtype=torch.float64), rtol=0, atol=1e-12)


def test_dtype_follows_rewards_and_integer_rewards_become_float32():
    assert compute_advantages(_rewards(torch.float32), 4).dtype == torch.float32
    adv = compute_advantages(torch.tensor([1, 0, 0, 0]), 2, scale="none")
    assert adv.dtype == torch.float32
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]


def test_rewards_with_grad_give_detached_advantages():
    rewards = _rewards().requires_grad_(True)
    assert not compute_advantages(rewards, 4).requires_grad


@pytest.mark.parametrize(
    ("rewards", "group_size", "kwargs"),
    [
        (torch.zeros(6), 4, {}),
        (torch.zeros(6), 0, {}),
        (torch.zeros(6), 3, {"scale": "std"}),
        (torch.zeros(6), 3, {"eps": -1.0}),
    ],
)
def test_bad_settings_raise_input_error(rewards, group_size, kwargs):
    with pytest.raises(InputError) as info:
        compute_advantages(rewards, group_size, **kwargs)
    assert info.value.hint


def test_non_vector_rewards_are_a_programming_error():
    with pytest.raises(ValueError):
        compute_advantages(torch.zeros(2, 3), 3)


def test_group_reward_stats():
    stats = group_reward_stats(_rewards(), 4)
    assert stats["reward_mean"] == pytest.approx(statistics.mean(REWARDS))
    assert stats["reward_std"] == pytest.approx(statistics.stdev(REWARDS))
    assert stats["reward_group_std_mean"] == pytest.approx((math.sqrt(1 / 3) + 0.0 + SKEWED_STD) / 3)
    assert stats["frac_zero_std_groups"] == pytest.approx(1 / 3)
