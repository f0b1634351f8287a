"""AdamW step temporaries: fused (our engine on cpu) needs none; the single-tensor loop one denom."""

from __future__ import annotations

import torch

from grpo_pilot.planner.memory.optimizer import FOREACH_ADAMW_BYTES_PER_PARAM, adam_step_temporary_bytes


def test_fused_and_offloaded_steps_need_no_temporaries() -> None:
    assert adam_step_temporary_bytes(10_000, 4_000, on_host=False, single_tensor=True, fused=True) == 0
    assert adam_step_temporary_bytes(10_000, 4_000, on_host=True, single_tensor=False) == 0


def test_unfused_cpu_and_gpu_temporaries() -> None:
    assert adam_step_temporary_bytes(10_000, 4_000, on_host=False, single_tensor=True) == 4 * 4_000
    assert adam_step_temporary_bytes(10_000, 4_000, on_host=False, single_tensor=False) == (
        FOREACH_ADAMW_BYTES_PER_PARAM * 10_000
    )


def test_engine_actor_uses_fused_adamw_on_cpu() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_pilot.engine.actor import Actor
    from grpo_pilot.engine.settings import ActorSettings

    torch.manual_seed(0)
    net = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=16,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    actor = Actor(net, device=torch.device("cpu"), settings=ActorSettings(lr=1e-3))
    assert actor.optimizer.defaults["fused"] is True
    before = [p.detach().clone() for p in actor.policy.parameters()]
    for p in actor.policy.parameters():
        p.grad = torch.ones_like(p)
    actor.optimizer.step()
    # the fused step is AdamW: the first step moves every element by lr (sign of the gradient) plus decay
    for b, p in zip(before, actor.policy.parameters()):
        torch.testing.assert_close(p.detach(), b * (1 - 1e-3 * 0.01) - 1e-3, rtol=1e-5, atol=1e-6)
