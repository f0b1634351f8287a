"""Actor: micro-batch planning (packed and padded), log-probs in both layouts, exact gradient
accumulation, fused path, reference model."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import update_capturing_grads

import grpo_pilot.engine.actor as actor_module
from grpo_pilot.engine.actor import Actor, LossSettings, Sample, micro_batch_layout
from grpo_pilot.engine.micro_batches import plan_micro_batches, split_by_padding
from grpo_pilot.engine.model_factory import build_model
from grpo_pilot.engine.settings import ActorSettings

torch.set_num_threads(1)
TINY = "examples/tiny"


def make_samples(seed: int = 0, num: int = 12) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        p = int(torch.randint(1, 9, (1,), generator=g))
        r = int(torch.randint(1, 11, (1,), generator=g))
        ids = torch.randint(3, 100, (p + r,), generator=g).tolist()
        out.append(Sample(tuple(ids[:p]), tuple(ids[p:])))
    return out


def make_actor(settings: ActorSettings, *, with_ref: bool = False, seed: int = 0) -> Actor:
    return Actor(
        build_model(TINY, seed=seed),
        device=torch.device("cpu"),
        settings=settings.model_copy(update={"lr": 1e-3, "max_grad_norm": 1e9, "with_ref": with_ref}),
    )


def reference_logprobs(model: torch.nn.Module, s: Sample) -> torch.Tensor:
    """Unpacked, one sequence at a time: log_softmax(logits[t-1])[token t] over the response."""
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
    p = len(s.prompt_ids)
    lsm = torch.log_softmax(logits[p - 1 : -1], dim=-1)
    return lsm.gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]


def test_plan_micro_batches_token_budget_covers_every_index_once_within_budget():
    lengths = [7, 3, 9, 1, 4, 4, 8, 2, 6]
    bins = plan_micro_batches(lengths, max_tokens=10)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    # first-fit decreasing packs 44 tokens into 5 bins of 10 (lower bound ceil(44/10) = 5)
    assert len(bins) == 5
    with pytest.raises(ValueError, match="exceeds"):
        plan_micro_batches([11], max_tokens=10)


def test_plan_micro_batches_fixed_size_keeps_order():
    assert plan_micro_batches([5] * 7, max_seqs=3) == [[0, 1, 2], [3, 4, 5], [6]]


def test_padded_plan_sorts_by_length_and_bounds_the_padded_rectangle():
    lengths = [7, 3, 9, 1, 4, 4, 8, 2, 6]
    bins = plan_micro_batches(lengths, max_tokens=16, padded=True)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    # longest first (9, 8, 7, 6, 4, 4, 3, 2, 1); a bin takes the next while (rows + 1) x its longest <= 16:
    # [9] | [8, 7] (2x8) | [6, 4] (2x6; a third 4 would be 18) | [4, 3, 2, 1] (4x4)
    assert bins == [[2], [6, 0], [8, 4], [5, 1, 7, 3]]
    assert all(len(b) * lengths[b[0]] <= 16 for b in bins)
    assert plan_micro_batches([5, 9, 5, 2, 9], max_seqs=2, padded=True) == [[1, 4], [0, 2], [3]]
    with pytest.raises(ValueError, match="exceeds"):
        plan_micro_batches([17], max_tokens=16, padded=True)


def test_split_by_padding_cuts_only_where_it_saves_more_than_two_rows():
    # one part: 6 rows x 10 = 60 + charge 2 x mean 6 = 72; [10,10,10] + [2,2,2]: 30 + 12 + 6 + 12 = 60
    assert split_by_padding([0, 1, 2, 3, 4, 5], [10, 10, 10, 2, 2, 2]) == [[0, 1, 2], [3, 4, 5]]
    # one part: 40 + 18.5 = 58.5 beats [10] + [9, 9, 9] = 10 + 27 + 2 x 18.5 = 74
    assert split_by_padding([3, 0, 1, 2], [9, 9, 9, 10]) == [[3, 0, 1, 2]]
    assert split_by_padding([4], [1, 1, 1, 1, 7]) == [[4]]
    lengths = [40 - (i % 17) for i in range(40)]
    order = sorted(range(40), key=lambda i: (-lengths[i], i))
    parts = split_by_padding(order, lengths)
    assert [i for part in parts for i in part] == order  # consecutive, nothing lost
    assert sum(len(part) * lengths[part[0]] for part in parts) < 40 * 40
    assert plan_micro_batches(lengths, padded=True, split_padding=True) == parts


def test_layout_follows_the_attention_implementation():
    model = build_model(TINY)
    assert model.config._attn_implementation == "sdpa" and micro_batch_layout(model) == "padded"
    model.config._attn_implementation = "flash_attention_2"  # varlen kernel: one packed row, no padding
    assert micro_batch_layout(model) == "packed"


@pytest.fixture(params=["padded", "packed"])
def layout(request, monkeypatch):
    """Run the actor in either layout; 'packed' on CPU SDPA is slow (block-causal mask) but exact."""
    if request.param == "packed":
        monkeypatch.setattr(actor_module, "micro_batch_layout", lambda model: "packed")
    return request.param


@pytest.mark.parametrize("fused", [False, True])
def test_logprobs_equal_one_sequence_at_a_time(layout, fused):
    actor = make_actor(
        ActorSettings(
            max_token_len=40,
            log_prob_max_token_len=40,
            fused_logprob=fused,
            gradient_checkpointing=False,
        )
    )
    samples = make_samples()
    got = actor.log_probs(samples)
    for s, lp in zip(samples, got):
        assert lp.shape == (len(s.response_ids),)
        torch.testing.assert_close(lp, reference_logprobs(actor.policy, s), atol=2e-5, rtol=0)


def test_padded_rows_reach_attention_without_a_mask(monkeypatch):
    """Right padding + plain causal attention: SDPA gets no mask tensor (is_causal), rows of the micro-batch's width."""
    import transformers.integrations.sdpa_attention as sdpa

    seen: list[tuple[tuple[int, ...], object, bool]] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        seen.append((tuple(q.shape), attn_mask, is_causal))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(sdpa.torch.nn.functional, "scaled_dot_product_attention", spy)
    actor = make_actor(ActorSettings(micro_batch_size=4, gradient_checkpointing=False))
    samples = make_samples(8, num=4)
    m = actor.update(samples, torch.linspace(-1, 1, 4), LossSettings())
    width = max(s.num_tokens for s in samples) - 1  # the last token is not fed
    assert seen and all(mask is None and causal for _, mask, causal in seen)
    assert {shape[0] for shape, _, _ in seen} == {4} and {shape[2] for shape, _, _ in seen} == {width}
    fed = sum(s.num_tokens - 1 for s in samples)
    assert m["num_micro_batches"] == 1.0 and m["padding_frac"] == pytest.approx((4 * width - fed) / (4 * width))


def _update_once(settings: ActorSettings, samples, adv, loss, **kw):
    """One update; returns (actor, the accumulated gradients seen by the optimizer, metrics)."""
    actor = make_actor(settings, **kw)
    grads, metrics = update_capturing_grads(actor, samples, adv, loss)
    return actor, grads, metrics


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_is_exact_across_micro_batch_layouts(mode, monkeypatch):
    samples = make_samples(1)
    adv = torch.linspace(-1.5, 2.0, len(samples))
    loss = LossSettings(loss_agg_mode=mode, loss_scale_len=10)
    one = dict(log_prob_max_token_len=4096, gradient_checkpointing=False)
    _, g_split, m_split = _update_once(
        ActorSettings(max_token_len=4096, **one), samples, adv, loss
    )  # padded, cut by padding
    _, g_budget, m_budget = _update_once(ActorSettings(max_token_len=20, **one), samples, adv, loss)
    _, g_fixed, m_fixed = _update_once(ActorSettings(micro_batch_size=2, **one), samples, adv, loss)
    monkeypatch.setattr(actor_module, "micro_batch_layout", lambda model: "packed")
    _, g_whole, m_whole = _update_once(ActorSettings(max_token_len=4096, **one), samples, adv, loss)  # ONE packed row
    assert m_whole["num_micro_batches"] == 1 and m_whole["padding_frac"] == 0.0
    assert m_split["num_micro_batches"] > 1 and m_budget["num_micro_batches"] > 3 and m_fixed["num_micro_batches"] == 6
    width = max(s.num_tokens for s in samples) - 1
    one_rectangle = 1 - sum(s.num_tokens - 1 for s in samples) / (len(samples) * width)
    assert 0 < m_split["padding_frac"] < one_rectangle  # cutting the sorted bin saved padded positions
    for m in (m_split, m_budget, m_fixed):
        assert m["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-4)
        assert m["loss"] == pytest.approx(m_whole["loss"], abs=1e-6)
    assert set(g_whole) == set(g_split) == set(g_budget) == set(g_fixed) and g_whole
    for name, g in g_whole.items():
        torch.testing.assert_close(g_split[name], g, atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(g_budget[name], g, atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(g_fixed[name], g, atol=1e-6, rtol=1e-4)


def test_on_policy_loss_value_is_minus_mean_advantage_and_weights_move():
    samples = make_samples(2)
    adv = torch.linspace(-1.0, 1.0, len(samples))  # token-mean of adv != 0 because lengths differ
    actor = make_actor(ActorSettings(max_token_len=64, gradient_checkpointing=False))
    before = copy.deepcopy(actor.policy.state_dict())
    m = actor.update(samples, adv, LossSettings())
    lens = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.float32)
    expected = -(adv * lens).sum() / lens.sum()  # ratio == 1: loss = -token-mean(advantage)
    assert m["pg_loss"] == pytest.approx(float(expected), abs=1e-6)
    assert m["grad_norm"] > 0
    moved = sum(float((p.detach() - before[n]).abs().sum()) for n, p in actor.policy.named_parameters())
    assert moved > 0


def test_fused_and_checkpointed_updates_match_plain():
    samples = make_samples(3)
    adv = torch.linspace(-1.0, 1.0, len(samples))
    loss = LossSettings(loss_agg_mode="seq-mean-token-mean")
    _, _, plain = _update_once(ActorSettings(max_token_len=64, gradient_checkpointing=False), samples, adv, loss)
    _, _, fused = _update_once(
        ActorSettings(max_token_len=64, gradient_checkpointing=False, fused_logprob=True), samples, adv, loss
    )
    _, _, ckpt = _update_once(ActorSettings(max_token_len=64, gradient_checkpointing=True), samples, adv, loss)
    for m in (fused, ckpt):
        assert m["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
        assert m["entropy"] == pytest.approx(plain["entropy"], rel=1e-4)


def test_reference_model_is_frozen_initial_policy_and_kl_appears_after_an_update():
    samples = make_samples(4)
    actor = make_actor(ActorSettings(max_token_len=64, gradient_checkpointing=False), with_ref=True)
    ref0 = actor.log_probs(samples, ref=True)
    pol0 = actor.log_probs(samples)
    for r, p in zip(ref0, pol0):
        torch.testing.assert_close(r, p)
    adv = torch.linspace(-1.0, 1.0, len(samples))
    m = actor.update(samples, adv, LossSettings(kl_coef=0.1), ref_logprobs=ref0)
    assert m["kl"] == pytest.approx(0.0, abs=1e-7)  # first step: policy == reference
    ref1 = actor.log_probs(samples, ref=True)
    pol1 = actor.log_probs(samples)
    for r0, r1 in zip(ref0, ref1):
        torch.testing.assert_close(r0, r1)  # the reference never moves
    assert max(float((a - b).abs().max()) for a, b in zip(pol1, ref1)) > 1e-4
    m2 = actor.update(samples, adv, LossSettings(kl_coef=0.1), ref_logprobs=ref1)
    assert m2["kl"] > 0


def test_truncated_samples_get_no_gradient_with_mask_truncated():
    samples = [Sample(s.prompt_ids, s.response_ids, truncated=True) for s in make_samples(5)]
    adv = torch.linspace(-1.0, 1.0, len(samples))
    _, _, masked = _update_once(
        ActorSettings(max_token_len=64, gradient_checkpointing=False), samples, adv, LossSettings(mask_truncated=True)
    )
    _, _, kept = _update_once(
        ActorSettings(max_token_len=64, gradient_checkpointing=False), samples, adv, LossSettings(mask_truncated=False)
    )
    assert masked["grad_norm"] == 0.0 and masked["num_tokens"] == 0
    assert kept["grad_norm"] > 0


def test_off_policy_old_logprobs_give_ratio_away_from_one():
    samples = make_samples(6)
    actor = make_actor(ActorSettings(max_token_len=64, gradient_checkpointing=False))
    old = [lp - 0.5 for lp in actor.log_probs(samples)]  # pretend the behaviour policy was less likely
    m = actor.update(samples, torch.ones(len(samples)), LossSettings(clip_high=0.2, clip_c=None), old_logprobs=old)
    assert m["ratio_mean"] == pytest.approx(float(torch.exp(torch.tensor(0.5))), rel=1e-4)
    assert m["clipfrac"] == pytest.approx(1.0)  # every ratio 1.65 > 1.2 with positive advantage: clipped
    assert m["grad_norm"] == 0.0  # clipped branch has no gradient


def test_state_dict_roundtrip_restores_policy_and_optimizer():
    samples = make_samples(7)
    a = make_actor(ActorSettings(max_token_len=64, gradient_checkpointing=False))
    a.update(samples, torch.linspace(-1, 1, len(samples)), LossSettings())
    state = copy.deepcopy(a.state_dict())
    b = make_actor(ActorSettings(max_token_len=64, gradient_checkpointing=False), seed=9)
    b.load_state_dict(state["model"], state["optimizer"])
    adv = torch.linspace(1, -1, len(samples))
    ma, mb = a.update(samples, adv, LossSettings()), b.update(samples, adv, LossSettings())
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-6)
    for (n, p), q in zip(a.policy.named_parameters(), b.policy.parameters()):
        torch.testing.assert_close(p, q, atol=0, rtol=0)


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts reads of tensor values by the host: `.item()`, `float()`, `int()`, `bool()` (aten._local_scalar_dense)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("with_ref", [False, True])
def test_update_reads_back_once_whatever_the_number_of_micro_batches(monkeypatch, with_ref):
    # metrics accumulate on the device; the mini-batch's one transfer is a .tolist() at the end (beside the
    # optimizer's own bookkeeping, which does not depend on the micro-batches either)
    samples = make_samples(4)
    adv = torch.linspace(-1.0, 1.0, len(samples))
    loss = LossSettings(kl_coef=0.01 if with_ref else 0.0, entropy_coeff=0.01)
    tolists = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: (tolists.append(self.numel()), real_tolist(self))[1])
    reads, metrics = [], []
    for micro in (len(samples), 1):
        actor = make_actor(ActorSettings(micro_batch_size=micro, gradient_checkpointing=False), with_ref=with_ref)
        old = actor.log_probs(samples)
        ref = actor.log_probs(samples, ref=True) if with_ref else None
        tolists.clear()
        with _HostReads() as counter:
            metrics.append(actor.update(samples, adv, loss, old_logprobs=old, ref_logprobs=ref))
        reads.append((counter.count, len(tolists)))
    assert metrics[0]["num_micro_batches"] <= 2 and metrics[1]["num_micro_batches"] == len(samples)
    assert reads[0] == reads[1] and reads[0][1] == 1, reads
    assert metrics[1]["loss"] == pytest.approx(metrics[0]["loss"], abs=1e-6)
    assert metrics[1]["entropy"] == pytest.approx(metrics[0]["entropy"], rel=1e-5)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("train", [False, True])
def test_padded_hidden_is_the_decoders_own_forward(model_type, train):
    from tiny_models import tiny

    from grpo_pilot.engine.actor import padded_hidden

    model = tiny(model_type)
    if train:  # checkpointed layers in train mode, as the update runs them
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    ids = torch.randint(2, 100, (3, 11), generator=torch.Generator().manual_seed(0))
    theirs = model.model(input_ids=ids, use_cache=False).last_hidden_state
    torch.testing.assert_close(padded_hidden(model, ids), theirs, atol=0, rtol=0)
