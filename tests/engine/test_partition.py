"""How a step's work is split: token-balanced training shares, rollout chunks, replica seeds, equal micro-batch
counts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_pilot.engine.micro_batches import equalise_bins, plan_micro_batches
from grpo_pilot.engine.partition import balance_by_tokens, contiguous_chunks, replica_seed


def test_balance_by_tokens_by_hand():
    # longest first, each to the lightest rank: 9 -> r0, 8 -> r1, 7 -> r1 (8 < 9), 3 -> r0, 2 -> r0 (12 < 15)...
    lengths = [3, 9, 2, 7, 8]
    assert balance_by_tokens(lengths, 2) == [[0, 1, 2], [3, 4]]
    assert balance_by_tokens(lengths, 1) == [[0, 1, 2, 3, 4]]  # one rank: everything, in order
    assert balance_by_tokens([5], 3) == [[0], [], []]  # more ranks than sequences: some get nothing
    with pytest.raises(ValueError):
        balance_by_tokens(lengths, 0)


@given(st.lists(st.integers(1, 500), max_size=60), st.integers(1, 8))
def test_balance_covers_every_index_once_within_one_sequence_of_the_mean(lengths, k):
    groups = balance_by_tokens(lengths, k)
    assert len(groups) == k and sorted(i for g in groups for i in g) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in g) for g in groups]
    if lengths:  # LPT: the heaviest rank exceeds the lightest by at most the longest sequence
        assert max(loads) - min(loads) <= max(lengths)


def test_contiguous_chunks_and_replica_seeds():
    assert contiguous_chunks(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert contiguous_chunks(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert contiguous_chunks(0, 1) == [(0, 0)]
    assert replica_seed(123, 0) == 123  # replica 0 samples as a one-worker run
    assert len({replica_seed(123, r) for r in range(16)}) == 16


def test_equalise_bins_halves_the_largest_then_pads_with_empty_bins():
    lengths = [10, 9, 4, 4, 3]
    bins = plan_micro_batches(lengths, max_tokens=20, padded=True)
    assert bins == [[0, 1], [2, 3, 4]]  # 2x10 and 3x4 padded positions
    # the 2x10 bin is the largest: halved first, order kept
    assert equalise_bins(bins, 3, lengths) == [[0], [1], [2, 3, 4]]
    assert equalise_bins(bins, 4, lengths) == [[0], [1], [2, 3], [4]]
    assert equalise_bins([[0]], 3, [5]) == [[0], [], []]  # nothing left to split: dummies
    assert equalise_bins([], 2, []) == [[], []]
    with pytest.raises(ValueError):
        equalise_bins(bins, 1, lengths)
