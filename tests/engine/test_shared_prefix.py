"""Shared-prompt forward: layout bookkeeping, and log-probs/gradients equal to the plain padded forward."""

from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, tiny, update_capturing_grads

from grpo_pilot.engine.actor import Actor, LossSettings, Sample
from grpo_pilot.engine.settings import ActorSettings
from grpo_pilot.engine.shared_prefix import prefix_batch, shared_prefix_unsupported

torch.set_num_threads(1)


def grouped_samples(seed: int = 0, prompts: int = 4, n: int = 3) -> list[Sample]:
    """`prompts` groups of `n` completions of one prompt (1–8 tokens); responses of 1–10 tokens, ragged."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(prompts):
        prompt = tuple(torch.randint(3, VOCAB, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist())
        for _ in range(n):
            r = int(torch.randint(1, 11, (1,), generator=g))
            out.append(Sample(prompt, tuple(torch.randint(3, VOCAB, (r,), generator=g).tolist())))
    out.append(Sample(out[0].prompt_ids, (7,)))  # a one-token response: predicted by the prompt's last position only
    return out


def test_prefix_batch_layout_by_hand():
    b = prefix_batch([(5, 6, 7), (8,), (5, 6, 7)], [(10, 11), (12, 13, 14), (15,)], torch.device("cpu"))
    # prompts (5,6,7) and (8,) -> U = 2 rows of P = 3; fed responses (10), (12, 13), () -> R = 2
    assert b.prompt_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert b.response_ids.tolist() == [[10, 0], [12, 13], [0, 0]]
    assert b.inverse.tolist() == [0, 1, 0]
    assert b.positions.tolist() == [
        [0, 1, 2, 0, 1, 2, 3, 4, 1, 2, 3, 4]
    ]  # response j of a prompt of p tokens sits at p + j
    assert b.computed_positions == 2 * 3 + 3 * 2 and b.real_positions == 4 + (1 + 2 + 0)
    # flat positions: prompt rows 0..5, responses 6 + 2b + j; first token of each sample from its prompt's last position
    assert b.scored.tolist() == [2, 6, 3, 8, 9, 2] and b.targets.tolist() == [10, 11, 12, 13, 14, 15]
    # sample 1 (prompt of 1 token): sees prompt slot 0 only, then its own responses causally
    assert b.mask[1, 0].tolist() == [[True, False, False, True, False], [True, False, False, True, True]]
    assert b.mask[0, 0, 0].tolist() == [True, True, True, True, False]


def _actor(model: torch.nn.Module, *, share: bool, ckpt: bool = False, with_ref: bool = False) -> Actor:
    settings = ActorSettings(
        max_token_len=4096,
        log_prob_max_token_len=4096,
        gradient_checkpointing=ckpt,
        lr=1e-3,
        max_grad_norm=1e9,
        share_prompts=share,
        with_ref=with_ref,
    )
    return Actor(model, device=torch.device("cpu"), settings=settings)


def _update_grads(
    actor: Actor, samples: list[Sample], loss: LossSettings, **kw: object
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    return update_capturing_grads(actor, samples, torch.linspace(-1.0, 1.5, len(samples)), loss, **kw)


@pytest.mark.parametrize(
    ("model_type", "extra"), [("qwen2", {}), ("qwen3", {}), ("llama", {"attention_bias": True, "mlp_bias": True})]
)
def test_shared_forward_matches_the_plain_padded_forward(model_type, extra):
    samples = grouped_samples()
    loss = LossSettings(loss_agg_mode="seq-mean-token-mean", entropy_coeff=0.01)
    shared, plain = _actor(tiny(model_type, **extra), share=True), _actor(tiny(model_type, **extra), share=False)
    assert shared.prompt_sharing == ("policy",) and not plain.prompt_sharing
    for a, b in zip(shared.log_probs(samples), plain.log_probs(samples)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    after_log_probs = shared.shared_forwards
    assert after_log_probs >= 1 and plain.shared_forwards == 0
    g_shared, m_shared = _update_grads(shared, samples, loss)
    g_plain, m_plain = _update_grads(plain, samples, loss)
    assert shared.shared_forwards == after_log_probs + m_shared["num_micro_batches"]
    assert m_shared["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)
    assert m_shared["entropy"] == pytest.approx(m_plain["entropy"], rel=1e-5)
    assert set(g_shared) == set(g_plain) and g_plain
    for name, g in g_plain.items():
        torch.testing.assert_close(g_shared[name], g, atol=1e-6, rtol=1e-4)
    b = prefix_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples], torch.device("cpu"))
    assert b.real_positions < sum(s.num_tokens - 1 for s in samples)  # fewer real positions than the sequences alone


def test_padding_share_counts_shared_positions():
    samples = grouped_samples(seed=2)
    actor = Actor(
        tiny("qwen2"),
        device=torch.device("cpu"),
        settings=ActorSettings(micro_batch_size=len(samples), gradient_checkpointing=False, lr=1e-3),
    )
    m = actor.update(samples, torch.linspace(-1.0, 1.0, len(samples)), LossSettings())
    b = prefix_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples], torch.device("cpu"))
    if m["num_micro_batches"] == 1:  # one bin: its padding share is that of the whole layout
        assert m["padding_frac"] == pytest.approx(1 - b.real_positions / b.computed_positions)
    assert 0.0 < m["padding_frac"] < 1.0


def test_checkpointed_and_reference_passes_share_too():
    samples = grouped_samples(seed=1)
    loss = LossSettings(kl_coef=0.1)
    ckpt = _actor(tiny("qwen2"), share=True, ckpt=True, with_ref=True)
    plain = _actor(tiny("qwen2"), share=False, ckpt=True, with_ref=True)
    assert ckpt.prompt_sharing == ("policy", "ref")
    ref_shared, ref_plain = ckpt.log_probs(samples, ref=True), plain.log_probs(samples, ref=True)
    for a, b in zip(ref_shared, ref_plain):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    ckpt.update(samples, torch.linspace(-1.0, 1.0, len(samples)), loss, ref_logprobs=ref_shared)
    g_c, m_c = _update_grads(ckpt, samples, loss, ref_logprobs=ref_shared)
    plain.update(samples, torch.linspace(-1.0, 1.0, len(samples)), loss, ref_logprobs=ref_plain)
    g_p, m_p = _update_grads(plain, samples, loss, ref_logprobs=ref_plain)
    assert m_c["kl"] > 0 and m_c["kl"] == pytest.approx(m_p["kl"], rel=1e-4)
    for name, g in g_p.items():
        torch.testing.assert_close(g_c[name], g, atol=1e-6, rtol=1e-4)


def test_distinct_prompts_and_unsupported_models_take_the_plain_path():
    distinct = [Sample((3 + i, 4), (5, 6)) for i in range(4)]
    actor = _actor(tiny("qwen2"), share=True)
    actor.log_probs(distinct)
    assert actor.shared_forwards == 0  # nothing to share: one row per sequence as before
    assert "eager" in str(shared_prefix_unsupported(tiny("qwen2", attn="eager")))
    assert "dropout" in str(shared_prefix_unsupported(tiny("qwen2", attention_dropout=0.1)))
    eager = _actor(tiny("qwen2", attn="eager"), share=True)
    eager.log_probs(grouped_samples())
    assert not eager.prompt_sharing and eager.shared_forwards == 0


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_bf16_autocast_gives_transformers_logits(model_type):
    """Under autocast (the GPU actor's mode; CPU bf16 here) the shared forward runs the same module calls."""
    from grpo_pilot.engine.shared_prefix import shared_prefix_hidden

    model, samples = tiny(model_type), grouped_samples(seed=3)
    batch = prefix_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples], torch.device("cpu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = model.lm_head(shared_prefix_hidden(model, batch))
        theirs = torch.cat(
            [
                model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits[0, len(s.prompt_ids) - 1 : -1]
                for s in samples
            ]
        )
    assert ours.dtype == theirs.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), theirs.float(), atol=2e-2, rtol=2e-2)
    ours.float().sum().backward()
    assert float(model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum()) > 0
