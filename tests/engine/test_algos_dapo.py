"""DAPO pieces: zero-variance groups, informative rows, overlong soft penalty, truncation masks."""

from __future__ import annotations

import pytest
import torch

from grpo_pilot.engine.algos import (
    aggregate,
    informative_sample_indices,
    mask_truncated,
    overlong_penalty,
    truncated_samples,
    zero_variance_groups,
)
from grpo_pilot.errors import InputError

REWARDS = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.5, 0.5, 0.5])


def test_zero_variance_groups():
    assert zero_variance_groups(REWARDS, 4).tolist() == [False, True, True, False]
    assert zero_variance_groups(REWARDS, 1).all()  # a singleton has no spread
    assert zero_variance_groups(REWARDS, 16).tolist() == [False]


def test_informative_sample_indices_keep_whole_groups_in_order():
    assert informative_sample_indices(REWARDS, 4).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert informative_sample_indices(torch.ones(4), 2).numel() == 0


def test_zero_variance_groups_rejects_a_broken_layout():
    with pytest.raises(InputError):
        zero_variance_groups(REWARDS, 5)


def test_overlong_penalty_piecewise_values():
    # L_max = 20, L_cache = 4: free up to 16, then (16 - |y|) / 4 down to -1 at 20, -1 beyond.
    lengths = torch.tensor([0, 10, 16, 17, 18, 19, 20, 21, 100])
    penalty = overlong_penalty(lengths, max_len=20, cache_len=4)
    assert penalty.dtype == torch.float32
    assert penalty.tolist() == [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]


def test_overlong_penalty_factor_and_hard_step():
    lengths = torch.tensor([18, 20, 21])
    assert overlong_penalty(lengths, max_len=20, cache_len=4, penalty_factor=0.5).tolist() == [-0.25, -0.5, -0.5]
    assert overlong_penalty(lengths, max_len=20, cache_len=0).tolist() == [0.0, 0.0, -1.0]


@pytest.mark.parametrize(("max_len", "cache_len"), [(0, 0), (10, -1), (10, 11)])
def test_overlong_penalty_bad_settings(max_len, cache_len):
    with pytest.raises(InputError):
        overlong_penalty(torch.tensor([1]), max_len=max_len, cache_len=cache_len)


def test_truncated_samples_look_for_eos_among_valid_tokens():
    ids = torch.tensor([[5, 1, 0], [5, 6, 7], [1, 0, 0], [5, 6, 1]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    assert truncated_samples(ids, mask, 1).tolist() == [False, True, False, True]
    assert truncated_samples(ids, mask, [7, 1]).tolist() == [False, False, False, True]


def test_mask_truncated_zeroes_rows_but_keeps_them_in_the_sequence_count():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    masked = mask_truncated(mask, torch.tensor([False, True]))
    assert masked.tolist() == [[1, 1, 0], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]]  # input untouched
    loss = torch.tensor([[2.0, 4.0, 9.0], [7.0, 7.0, 7.0]])
    assert aggregate(loss, masked, "seq-mean-token-mean").item() == pytest.approx(3.0 / 2)
    assert aggregate(loss, masked, "token-mean").item() == pytest.approx(3.0)
