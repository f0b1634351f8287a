"""Critic (PPO/GAE) and reward-model leaves."""

from __future__ import annotations

import pytest

from grpo_pilot.planner.memory.critic import (
    critic_host_bytes,
    critic_params,
    critic_state_items,
    critic_token_budget,
    critic_update_items,
    critic_values_items,
    gae_host_bytes,
    reward_model_items,
    value_head_bytes,
)
from grpo_pilot.planner.memory.logits import logprob_logits_bytes
from grpo_pilot.planner.memory.moments import LOG_PROB_ITEMS, UPDATE_ITEMS
from grpo_pilot.planner.memory.shape import TransformerShape, shape_of
from tests.planner.conftest import spec

TINY = TransformerShape(hidden=8, q_dim=8, kv_dim=4, ffn=16, num_heads=2, num_layers=4, vocab=32)


def test_critic_params_replace_the_lm_head_by_a_value_head() -> None:
    assert critic_params(TINY) == TINY.num_params - 32 * 8 + 9
    tied = TINY._replace(tied_embeddings=True)
    assert critic_params(tied) == tied.num_params + 9
    m = spec("qwen2.5-7b")
    assert critic_params(shape_of(m)) == m.num_params - m.vocab_size * m.hidden_size + m.hidden_size + 1
    assert critic_token_budget(16384) == 32768


def test_states_follow_verl_load_use_offload() -> None:
    on = critic_state_items(1000, 8, "actor_update", param_offload=False, optimizer_offload=False)
    assert on == {"critic_params": 500, "critic_grads": 0, "critic_optimizer_states": 1000}
    upd = critic_state_items(1000, 8, "critic_update", param_offload=True, optimizer_offload=True)
    assert upd == {"critic_params": 500, "critic_grads": 500, "critic_optimizer_states": 1000}
    vals = critic_state_items(1000, 8, "values", param_offload=True, optimizer_offload=True)
    assert vals == {"critic_params": 500, "critic_grads": 0, "critic_optimizer_states": 0}
    off = critic_state_items(1000, 8, "rollout", param_offload=True, optimizer_offload=True)
    assert sum(off.values()) == 0
    assert critic_host_bytes(1000, 8, 8, param_offload=True, optimizer_offload=True) == 8 * 1500
    with pytest.raises(ValueError):
        critic_state_items(1000, 8, "generate", param_offload=False, optimizer_offload=False)


def test_value_head_and_gae_by_hand() -> None:
    assert value_head_bytes(100, 2, training=False) == 600
    assert value_head_bytes(100, 2, training=True) == 600 + 100 * (24 + 2)
    # 7 fp32 per-token fields and 2 GAE transients: 36 bytes per response token
    assert gae_host_bytes(1024, 4096) == 36 * 1024 * 4096
    assert reward_model_items(1000, 4, "rollout", param_offload=False) == {"reward_model_params": 500}
    assert reward_model_items(1000, 4, "rollout", param_offload=True) == {"reward_model_params": 0}
    assert reward_model_items(1000, 4, "reward", param_offload=True) == {"reward_model_params": 500}


def test_critic_passes_have_no_vocab_logits() -> None:
    shape = shape_of(spec("qwen2.5-7b"))
    T = 32768
    vals = critic_values_items(shape, T, 2)
    assert set(vals) == set(LOG_PROB_ITEMS)
    assert vals["logits"] in (0, value_head_bytes(T, 2, training=False))
    upd = critic_update_items(shape, T, 2, 8, checkpointing=True, optimizer_offload=False)
    assert set(upd) == set(UPDATE_ITEMS)
    assert upd["logits"] <= value_head_bytes(T, 2, training=True)
    # the value head replaces verl's vocab logits (2c·T·V in training): thousands of times smaller
    verl_logits = logprob_logits_bytes(T, shape.vocab, shape.hidden, 2, kernel="verl", training=True, fused=False)
    assert 1000 * value_head_bytes(T, 2, training=True) < verl_logits
    more = critic_update_items(shape, 2 * T, 2, 8, checkpointing=True, optimizer_offload=False)
    assert sum(more.values()) > sum(upd.values())
    no_ckpt = critic_update_items(shape, T, 2, 8, checkpointing=False, optimizer_offload=False)
    assert no_ckpt["activations"] > upd["activations"]
