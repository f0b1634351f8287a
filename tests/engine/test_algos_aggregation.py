"""Loss aggregation: closed-form values and gradients per mode, ragged masks, micro-batch additivity."""

from __future__ import annotations

import pytest
import torch

from grpo_pilot.engine.algos import AGG_MODES, TRL_LOSS_TYPE_TO_AGG_MODE, aggregate
from grpo_pilot.errors import InputError

F64 = torch.float64
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)  # ragged: lengths 2 and 1


def _loss() -> torch.Tensor:
    return torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=F64, requires_grad=True)


@pytest.mark.parametrize(
    ("mode", "kwargs", "value", "grad"),
    [
        ("token-mean", {}, 7 / 3, [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0]]),
        ("seq-mean-token-mean", {}, (1.5 + 4) / 2, [[1 / 4, 1 / 4, 0], [1 / 2, 0, 0]]),
        ("seq-mean-token-sum", {}, (3 + 4) / 2, [[1 / 2, 1 / 2, 0], [1 / 2, 0, 0]]),
        ("seq-mean-token-sum-norm", {}, 7 / (2 * 3), [[1 / 6, 1 / 6, 0], [1 / 6, 0, 0]]),
        ("seq-mean-token-sum-norm", {"loss_scale_len": 10}, 7 / 20, [[1 / 20, 1 / 20, 0], [1 / 20, 0, 0]]),
        ("token-mean", {"global_num_tokens": 14}, 7 / 14, [[1 / 14, 1 / 14, 0], [1 / 14, 0, 0]]),
        ("seq-mean-token-mean", {"global_num_seqs": 4}, 5.5 / 4, [[1 / 8, 1 / 8, 0], [1 / 4, 0, 0]]),
    ],
)
def test_closed_form_value_and_gradient(mode, kwargs, value, grad):
    loss = _loss()
    out = aggregate(loss, MASK, mode, **kwargs)
    assert out.item() == pytest.approx(value, abs=1e-12)
    out.backward()
    torch.testing.assert_close(loss.grad, torch.tensor(grad, dtype=F64), rtol=0, atol=1e-12)


def test_float_mask_acts_as_token_weights():
    weights = torch.tensor([[0.5, 1.0, 0.0], [2.0, 0.0, 0.0]], dtype=F64)
    out = aggregate(_loss(), weights, "token-mean")
    assert out.item() == pytest.approx((0.5 + 2.0 + 8.0) / 3.5)


def test_fully_masked_row_counts_as_a_sequence_by_default():
    loss = torch.tensor([[1.0, 1.0], [5.0, 5.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [0, 0]])
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(0.5)
    assert aggregate(loss, mask, "seq-mean-token-mean", global_num_seqs=1).item() == pytest.approx(1.0)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_empty_mask_gives_zero_without_nan(mode):
    loss = _loss()
    out = aggregate(loss, torch.zeros(2, 3), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 3, dtype=F64))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_sequence_values_broadcast_over_tokens(mode):
    per_seq = torch.tensor([[2.0], [-1.0]], dtype=F64)
    broadcast = per_seq.expand(2, 3).clone()
    assert aggregate(per_seq, MASK, mode).item() == pytest.approx(aggregate(broadcast, MASK, mode).item())


def _ragged_batch(seed: int = 0, num_seqs: int = 6, max_len: int = 5):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])[:num_seqs]
    mask = torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)
    loss = torch.randn(num_seqs, max_len, generator=gen, dtype=F64)
    return loss, mask, lengths


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batches_with_global_denominators_sum_to_the_whole(mode):
    loss, mask, lengths = _ragged_batch()
    whole_leaf = loss.clone().requires_grad_(True)
    whole = aggregate(whole_leaf, mask, mode, loss_scale_len=8)
    whole.backward()

    micro_leaf = loss.clone().requires_grad_(True)
    total = torch.zeros((), dtype=F64)
    for rows in ([0, 1], [2], [3, 4, 5]):
        width = int(lengths[rows].max())  # each micro-batch padded only to its own longest row
        part = aggregate(
            micro_leaf[rows, :width],
            mask[rows, :width],
            mode,
            loss_scale_len=8,
            global_num_tokens=int(mask.sum()),
            global_num_seqs=mask.shape[0],
        )
        part.backward()
        total = total + part.detach()
    assert total.item() == pytest.approx(whole.item(), abs=1e-12)
    torch.testing.assert_close(micro_leaf.grad, whole_leaf.grad, rtol=0, atol=1e-12)


def test_micro_batches_without_global_denominators_are_biased():
    loss, mask, _ = _ragged_batch()
    whole = aggregate(loss, mask, "token-mean")
    parts = aggregate(loss[:2], mask[:2], "token-mean") + aggregate(loss[2:], mask[2:], "token-mean")
    assert abs(parts.item() / 2 - whole.item()) > 1e-3


def test_trl_loss_type_mapping_names_known_modes():
    assert TRL_LOSS_TYPE_TO_AGG_MODE == {
        "grpo": "seq-mean-token-mean",
        "bnpo": "token-mean",
        "dapo": "token-mean",
        "dr_grpo": "seq-mean-token-sum-norm",
    }


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "sum"},
        {"mode": "token-mean", "global_num_tokens": 0},
        {"mode": "seq-mean-token-sum", "global_num_seqs": -2},
        {"mode": "seq-mean-token-sum-norm", "loss_scale_len": 0},
    ],
)
def test_bad_settings_raise_input_error(kwargs):
    mode = kwargs.pop("mode")
    with pytest.raises(InputError):
        aggregate(_loss(), MASK, mode, **kwargs)


def test_shape_mismatch_is_a_programming_error():
    with pytest.raises(ValueError):
        aggregate(torch.zeros(2, 4), MASK, "token-mean")
