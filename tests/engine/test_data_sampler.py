"""PromptSampler: every prompt once per epoch, reshuffled per epoch, exact resume from a state dict."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_pilot.engine.data import PromptSampler, epoch_permutation
from grpo_pilot.errors import InputError


def draw(sampler: PromptSampler, steps: int) -> list[list[int]]:
    return [sampler.next_batch() for _ in range(steps)]


def test_each_epoch_is_a_permutation_and_epochs_differ() -> None:
    sampler = PromptSampler(num_records=12, prompts_per_step=4, seed=7)
    batches = draw(sampler, 6)  # two epochs of three batches
    first, second = sum(batches[:3], []), sum(batches[3:], [])
    assert sorted(first) == sorted(second) == list(range(12))
    assert first != second and first == epoch_permutation(12, 7, 0) and second == epoch_permutation(12, 7, 1)
    assert sampler.epoch == 1 and sampler.position == 12


def test_same_seed_same_order_other_seed_other_order() -> None:
    a = draw(PromptSampler(20, 5, seed=3), 8)
    b = draw(PromptSampler(20, 5, seed=3), 8)
    c = draw(PromptSampler(20, 5, seed=4), 8)
    assert a == b and a != c


def test_batches_cross_epoch_boundaries_without_loss() -> None:
    sampler = PromptSampler(num_records=5, prompts_per_step=3, seed=0)
    stream = sum(draw(sampler, 5), [])  # 15 indices = 3 full epochs
    assert stream == epoch_permutation(5, 0, 0) + epoch_permutation(5, 0, 1) + epoch_permutation(5, 0, 2)


@settings(max_examples=40, deadline=None)
@given(
    num_records=st.integers(1, 30),
    per_step=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    stop=st.integers(0, 20),
)
def test_resume_continues_exactly(num_records: int, per_step: int, seed: int, stop: int) -> None:
    straight = PromptSampler(num_records, per_step, seed)
    expected = draw(straight, stop + 6)
    killed = PromptSampler(num_records, per_step, seed)
    draw(killed, stop)
    state = json.loads(json.dumps(killed.state_dict()))  # checkpoints store it as JSON
    resumed = PromptSampler(num_records, per_step, seed)
    resumed.load_state_dict(state)
    assert draw(resumed, 6) == expected[stop:]


def test_resume_with_a_different_dataset_or_seed_is_refused() -> None:
    state = PromptSampler(10, 2, seed=1).state_dict()
    with pytest.raises(InputError, match="num_records=10, this run has 11"):
        PromptSampler(11, 2, seed=1).load_state_dict(state)
    with pytest.raises(InputError, match="seed=1, this run has 2"):
        PromptSampler(10, 2, seed=2).load_state_dict(state)
    with pytest.raises(InputError, match="out of range"):
        PromptSampler(10, 2, seed=1).load_state_dict({**state, "position": 11})
    with pytest.raises(InputError, match="lacks epoch"):
        PromptSampler(10, 2, seed=1).load_state_dict({"seed": 1, "position": 0, "num_records": 10})


def test_bad_arguments() -> None:
    with pytest.raises(InputError, match="empty"):
        PromptSampler(0, 2, seed=0)
    with pytest.raises(InputError, match="at least 1"):
        PromptSampler(3, 0, seed=0)
