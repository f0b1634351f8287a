"""Policy loss: hand-derived values and gradients for clip-low/high, dual clip, GSPO, KL and entropy
terms; on-policy invariants; micro-batch additivity; bad settings."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_pilot.engine import compute_advantages, policy_loss
from grpo_pilot.engine.algos import AGG_MODES, aggregate
from grpo_pilot.errors import InputError

F64 = torch.float64


def _leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=True)


def _logprobs_with_ratios(ratios, old):
    """Leaf log-probs whose ratio to `old` is `ratios` (same nested shape)."""
    old_t = torch.tensor(old, dtype=F64)
    return _leaf((old_t + torch.log(torch.tensor(ratios, dtype=F64))).tolist()), old_t


OLD = [[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_clip_low_high_token_mean_closed_form():
    # Â = +1 row: ρ 1.1 (inside), 1.5 (above 1.28: clipped), 0.7 (below 0.8: not clipped for Â > 0).
    # Â = −1 row: ρ 0.5 (below 0.8: clipped), 1.3 (above: not clipped for Â < 0), masked token.
    logp, old = _logprobs_with_ratios([[1.1, 1.5, 0.7], [0.5, 1.3, 2.0]], OLD)
    loss, metrics = policy_loss(logp, old, torch.tensor([1.0, -1.0], dtype=F64), MASK, clip_low=0.2, clip_high=0.28)
    per_token = [-1.1, -1.28, -0.7, 0.8, 1.3]
    assert loss.item() == pytest.approx(sum(per_token) / 5, abs=1e-12)
    loss.backward()
    # d/dlogp of −Â·ρ is −Â·ρ where unclipped, 0 where the clipped branch is active
    expected = torch.tensor([[-1.1, 0.0, -0.7], [0.0, 1.3, 0.0]], dtype=F64) / 5
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)
    assert metrics["clipfrac"] == pytest.approx(2 / 5)
    assert metrics["clipfrac_high"] == pytest.approx(1 / 5)
    assert metrics["clipfrac_low"] == pytest.approx(1 / 5)
    assert metrics["ratio_mean"] == pytest.approx(5.1 / 5)
    assert metrics["ratio_min"] == pytest.approx(0.5)
    assert metrics["ratio_max"] == pytest.approx(1.5)  # the masked 2.0 is not counted
    assert metrics["num_tokens"] == 5 and metrics["num_seqs"] == 2
    assert metrics["pg_loss"] == pytest.approx(loss.item())
    expected_kl = -sum(math.log(r) for r in [1.1, 1.5, 0.7, 0.5, 1.3]) / 5
    assert metrics["approx_kl"] == pytest.approx(expected_kl)


def test_symmetric_clip_changes_which_tokens_clip():
    logp, old = _logprobs_with_ratios([[1.1, 1.25, 0.7], [0.5, 1.3, 2.0]], OLD)
    loss, _ = policy_loss(logp, old, torch.tensor([1.0, -1.0], dtype=F64), MASK, loss_agg_mode="seq-mean-token-mean")
    # clip 0.2/0.2: row 0 [-1.1, -1.2, -0.7] mean; row 1 [0.8, 1.3] mean
    assert loss.item() == pytest.approx(((-1.1 - 1.2 - 0.7) / 3 + (0.8 + 1.3) / 2) / 2, abs=1e-12)
    loss.backward()
    expected = torch.tensor([[-1.1 / 3, 0.0, -0.7 / 3], [0.0, 1.3 / 2, 0.0]], dtype=F64) / 2
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)


def test_dual_clip_caps_negative_advantage_loss():
    old = [[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]
    logp, old_t = _logprobs_with_ratios([[4.0, 2.0, 0.5], [4.0, 2.0, 0.5]], old)
    adv = torch.tensor([-2.0, 2.0], dtype=F64)
    mask = torch.ones(2, 3)
    loss, metrics = policy_loss(logp, old_t, adv, mask, loss_agg_mode="seq-mean-token-sum", clip_c=3.0)
    # Â = −2: ℓ = max(2ρ, 2·clip(ρ)) = [8, 4, 1.6], capped at −c·Â = 6 -> [6, 4, 1.6]
    # Â = +2: ℓ = −min(2ρ, 2·clip(ρ)) = [−2.4, −2.4, −1.0]; the cap never applies to Â > 0
    assert loss.item() == pytest.approx(((6 + 4 + 1.6) + (-2.4 - 2.4 - 1.0)) / 2, abs=1e-12)
    loss.backward()
    expected = torch.tensor([[0.0, 4.0, 0.0], [0.0, 0.0, -1.0]], dtype=F64) / 2
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)
    assert metrics["clipfrac_dual"] == pytest.approx(1 / 6)

    logp2, _ = _logprobs_with_ratios([[4.0, 2.0, 0.5], [4.0, 2.0, 0.5]], old)
    no_dual, _ = policy_loss(logp2, old_t, adv, mask, loss_agg_mode="seq-mean-token-sum")
    assert no_dual.item() == pytest.approx(loss.item() + 2 / 2)  # 8 instead of 6 in row 0
    no_dual.backward()
    assert logp2.grad[0, 0].item() == pytest.approx(8.0 / 2)


def test_log_ratio_clamp_bounds_the_ratio():
    logp = _leaf([[30.0]])
    loss, metrics = policy_loss(
        logp, torch.tensor([[0.0]], dtype=F64), torch.tensor([-1.0], dtype=F64), torch.ones(1, 1)
    )
    assert metrics["ratio_max"] == pytest.approx(math.exp(20.0))
    loss.backward()
    assert logp.grad.item() == 0.0  # clamped: no gradient
    unclamped, metrics = policy_loss(
        _leaf([[30.0]]),
        torch.tensor([[0.0]], dtype=F64),
        torch.tensor([-1.0], dtype=F64),
        torch.ones(1, 1),
        log_ratio_clamp=None,
    )
    assert metrics["ratio_max"] == pytest.approx(math.exp(30.0))


# GSPO: row 0 log-ratios [0.1, 0.3, -0.1] (mean 0.1), row 1 [0.5, 0.4, masked 9.0] (mean 0.45)
GSPO_LOG_RATIOS = [[0.1, 0.3, -0.1], [0.5, 0.4, 9.0]]


def _gspo_inputs():
    old = torch.tensor(OLD, dtype=F64)
    return _leaf((old + torch.tensor(GSPO_LOG_RATIOS, dtype=F64)).tolist()), old


def test_gspo_sequence_ratio_seq_mean_token_mean():
    logp, old = _gspo_inputs()
    s0, s1 = math.exp(0.1), math.exp(0.45)
    loss, metrics = policy_loss(
        logp,
        old,
        torch.tensor([1.0, -1.0], dtype=F64),
        MASK,
        loss_agg_mode="seq-mean-token-mean",
        ratio_level="sequence",
    )
    assert loss.item() == pytest.approx((-s0 + s1) / 2, abs=1e-12)
    loss.backward()
    # ∂s_i/∂logp_t = s_i / |y_i| on valid tokens
    expected = torch.tensor([[-s0 / 3] * 3, [s1 / 2, s1 / 2, 0.0]], dtype=F64) / 2
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)
    assert metrics["ratio_mean"] == pytest.approx((3 * s0 + 2 * s1) / 5)  # token-weighted


def test_gspo_sequence_ratio_token_mean():
    logp, old = _gspo_inputs()
    s0, s1 = math.exp(0.1), math.exp(0.45)
    loss, _ = policy_loss(logp, old, torch.tensor([1.0, -1.0], dtype=F64), MASK, ratio_level="sequence")
    assert loss.item() == pytest.approx((3 * -s0 + 2 * s1) / 5, abs=1e-12)
    loss.backward()
    expected = torch.tensor([[-s0 / 5] * 3, [s1 / 5, s1 / 5, 0.0]], dtype=F64)
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)


def test_gspo_clips_the_whole_sequence():
    logp, old = _gspo_inputs()
    # Â = +1 on row 1: s = e^0.45 > 1 + 4e-4 -> clipped, no gradient; row 0 too (e^0.1 > 1.0004)
    loss, metrics = policy_loss(
        logp,
        old,
        torch.tensor([1.0, 1.0], dtype=F64),
        MASK,
        loss_agg_mode="seq-mean-token-mean",
        ratio_level="sequence",
        clip_low=3e-4,
        clip_high=4e-4,
    )
    assert loss.item() == pytest.approx(-(1 + 4e-4), abs=1e-12)
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(2, 3, dtype=F64))
    assert metrics["clipfrac"] == 1.0 and metrics["clipfrac_high"] == 1.0


@pytest.mark.parametrize(
    ("kind", "value", "grad"),
    [
        ("k1", lambda d: d, lambda d: 1.0),
        ("k2", lambda d: 0.5 * d * d, lambda d: d),
        ("k3", lambda d: math.exp(-d) + d - 1, lambda d: 1 - math.exp(-d)),
    ],
)
def test_kl_term_added_with_coefficient(kind, value, grad):
    logp = _leaf(OLD)
    ref = torch.tensor(OLD, dtype=F64) - torch.tensor([[0.3, -0.2, 0.1], [0.4, 0.0, 5.0]], dtype=F64)
    diffs = [[0.3, -0.2, 0.1], [0.4, 0.0]]
    coef = 0.1
    loss, metrics = policy_loss(
        logp,
        logp.detach(),
        torch.zeros(2, dtype=F64),
        MASK,
        loss_agg_mode="seq-mean-token-mean",
        ref_logprobs=ref,
        kl_coef=coef,
        kl_type=kind,
    )
    seq_means = [sum(value(d) for d in row) / len(row) for row in diffs]
    assert loss.item() == pytest.approx(coef * sum(seq_means) / 2, abs=1e-12)  # Â = 0: only the KL term
    assert metrics["kl_loss"] == pytest.approx(sum(seq_means) / 2, abs=1e-12)
    assert metrics["kl"] == pytest.approx(sum(value(d) for row in diffs for d in row) / 5, abs=1e-12)
    loss.backward()
    expected = [[coef * grad(d) / 3 / 2 for d in diffs[0]], [coef * grad(d) / 2 / 2 for d in diffs[1]] + [0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected, dtype=F64), rtol=0, atol=1e-12)


def test_kl_metric_without_coefficient_adds_no_loss():
    logp = _leaf(OLD)
    loss, metrics = policy_loss(
        logp, logp.detach(), torch.zeros(2, dtype=F64), MASK, ref_logprobs=torch.tensor(OLD, dtype=F64) - 1.0
    )
    assert loss.item() == 0.0
    assert metrics["kl"] == pytest.approx(math.exp(-1.0) + 1.0 - 1.0)


def test_entropy_bonus_is_subtracted_with_the_same_aggregation():
    logp = _leaf(OLD)
    entropy = _leaf([[1.0, 2.0, 3.0], [4.0, 5.0, 60.0]])
    loss, metrics = policy_loss(
        logp,
        logp.detach(),
        torch.zeros(2, dtype=F64),
        MASK,
        loss_agg_mode="seq-mean-token-mean",
        entropy=entropy,
        entropy_coeff=0.01,
    )
    agg = ((1 + 2 + 3) / 3 + (4 + 5) / 2) / 2
    assert loss.item() == pytest.approx(-0.01 * agg, abs=1e-12)
    assert metrics["entropy"] == pytest.approx(15 / 5)
    assert metrics["entropy_loss"] == pytest.approx(agg)
    loss.backward()
    expected = -0.01 * torch.tensor([[1 / 6, 1 / 6, 1 / 6], [1 / 4, 1 / 4, 0.0]], dtype=F64)
    torch.testing.assert_close(entropy.grad, expected, rtol=0, atol=1e-12)


def _random_batch(seed: int = 0, groups: int = 3, group_size: int = 4, max_len: int = 6):
    gen = torch.Generator().manual_seed(seed)
    num = groups * group_size
    lengths = torch.randint(1, max_len + 1, (num,), generator=gen)
    mask = torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)
    logp = -torch.rand(num, max_len, generator=gen, dtype=F64) * 3
    rewards = torch.randint(0, 3, (num,), generator=gen).to(F64)
    adv = compute_advantages(rewards, group_size)
    ref = logp - 0.3 * torch.randn(num, max_len, generator=gen, dtype=F64)
    entropy = torch.rand(num, max_len, generator=gen, dtype=F64)
    old = logp + 0.2 * torch.randn(num, max_len, generator=gen, dtype=F64)
    return logp, old, adv, mask, ref, entropy, lengths


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_on_policy_loss_is_minus_aggregated_advantage_and_gradient_is_not_zero(mode, level):
    logp_values, _, adv, mask, _, _, _ = _random_batch()
    logp = logp_values.clone().requires_grad_(True)
    loss, metrics = policy_loss(logp, logp.detach(), adv, mask, loss_agg_mode=mode, ratio_level=level)
    adv_mat = adv.unsqueeze(1).expand_as(logp)
    assert loss.item() == pytest.approx(-aggregate(adv_mat, mask, mode).item(), abs=1e-12)
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["clipfrac"] == 0.0
    loss.backward()
    # ∂/∂logp of −Â·ρ at ρ = 1 is −Â times the aggregation weight of the token
    weight_probe = torch.ones_like(logp, requires_grad=True)
    aggregate(weight_probe, mask, mode).backward()
    torch.testing.assert_close(logp.grad, -adv_mat * weight_probe.grad, rtol=0, atol=1e-12)
    assert logp.grad.abs().sum() > 0


def test_on_policy_grpo_loss_of_group_normalised_advantages_is_zero():
    logp_values, _, adv, mask, _, _, _ = _random_batch(seed=3)
    loss, _ = policy_loss(
        logp_values.clone().requires_grad_(True), logp_values, adv, mask, loss_agg_mode="seq-mean-token-mean"
    )
    assert abs(loss.item()) < 1e-12


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batches_with_global_denominators_sum_to_the_whole(mode, level):
    logp_values, old, adv, mask, ref, entropy, lengths = _random_batch(seed=1)
    kwargs = dict(
        loss_agg_mode=mode,
        ratio_level=level,
        clip_c=3.0,
        kl_coef=0.05,
        kl_type="k3",
        entropy_coeff=0.01,
        loss_scale_len=6,
    )
    whole_leaf = logp_values.clone().requires_grad_(True)
    whole, whole_metrics = policy_loss(whole_leaf, old, adv, mask, ref_logprobs=ref, entropy=entropy, **kwargs)
    whole.backward()

    micro_leaf = logp_values.clone().requires_grad_(True)
    totals: dict[str, float] = {}
    for rows in (list(range(0, 5)), [5], list(range(6, 12))):
        width = int(lengths[rows].max())
        part, metrics = policy_loss(
            micro_leaf[rows, :width],
            old[rows, :width],
            adv[rows],
            mask[rows, :width],
            ref_logprobs=ref[rows, :width],
            entropy=entropy[rows, :width],
            global_num_tokens=int(mask.sum()),
            global_num_seqs=mask.shape[0],
            **kwargs,
        )
        part.backward()
        for key in ("loss", "pg_loss", "kl_loss", "entropy_loss"):
            totals[key] = totals.get(key, 0.0) + metrics[key]
    assert totals["loss"] == pytest.approx(whole.item(), abs=1e-12)
    for key in ("pg_loss", "kl_loss", "entropy_loss"):
        assert totals[key] == pytest.approx(whole_metrics[key], abs=1e-12)
    torch.testing.assert_close(micro_leaf.grad, whole_leaf.grad, rtol=0, atol=1e-12)


def test_advantages_per_token_are_accepted():
    logp = _leaf([[-1.0, -1.0]])
    adv = torch.tensor([[1.0, -3.0]], dtype=F64)
    loss, _ = policy_loss(logp, logp.detach(), adv, torch.ones(1, 2), loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    assert logp.grad.tolist() == [[-1.0, 3.0]]


def test_empty_mask_gives_zero_loss_and_no_extremes():
    logp = _leaf(OLD)
    loss, metrics = policy_loss(logp, logp.detach() - 0.5, torch.ones(2, dtype=F64), torch.zeros(2, 3))
    assert loss.item() == 0.0 and math.isfinite(metrics["ratio_mean"])
    assert "ratio_min" not in metrics and metrics["num_tokens"] == 0


def test_old_logprobs_get_no_gradient():
    logp = _leaf(OLD)
    old = _leaf([[v - 0.1 for v in row] for row in OLD])
    loss, _ = policy_loss(logp, old, torch.ones(2, dtype=F64), MASK)
    loss.backward()
    assert old.grad is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"loss_agg_mode": "mean"},
        {"clip_low": 1.0},
        {"clip_high": -0.1},
        {"clip_c": 1.0},
        {"ratio_level": "group"},
        {"kl_type": "k5"},
        {"kl_coef": 0.1},  # without ref_logprobs
        {"kl_coef": -0.1},
        {"entropy_coeff": 0.01},  # without entropy
        {"log_ratio_clamp": 0.0},
    ],
)
def test_bad_settings_raise_input_error(kwargs):
    logp = _leaf(OLD)
    with pytest.raises(InputError) as info:
        policy_loss(logp, logp.detach(), torch.ones(2, dtype=F64), MASK, **kwargs)
    assert info.value.hint


def test_shape_mismatch_is_a_programming_error():
    logp = _leaf(OLD)
    with pytest.raises(ValueError):
        policy_loss(logp, logp.detach(), torch.ones(3, dtype=F64), MASK)
    with pytest.raises(ValueError):
        policy_loss(logp, logp.detach()[:, :2], torch.ones(2, dtype=F64), MASK)
