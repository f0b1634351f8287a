"""Token log-probs and entropies: closed forms, temperature, and the chunked path's values, gradients
and memory bound (no tensor larger than chunk_tokens × V, forward or backward)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from grpo_pilot.engine.algos import chunked_token_logprobs, entropy_from_logits, token_logprobs
from grpo_pilot.errors import InputError

F64 = torch.float64


def test_token_logprobs_closed_form_and_temperature():
    logits = torch.tensor([[[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]], dtype=F64)
    ids = torch.tensor([[2, 1]])
    z1 = math.exp(0) + math.exp(1) + math.exp(2)
    z2 = math.exp(3) + 2.0
    out = token_logprobs(logits, ids)
    assert out.dtype == F64
    assert out[0].tolist() == pytest.approx([2 - math.log(z1), 0 - math.log(z2)], abs=1e-12)
    hot = token_logprobs(logits, ids, temperature=0.5)  # logits doubled
    assert hot[0, 0].item() == pytest.approx(4 - math.log(1 + math.exp(2) + math.exp(4)), abs=1e-12)
    assert token_logprobs(logits.float(), ids).dtype == torch.float32


def test_token_logprobs_of_bf16_logits_are_float32():
    logits = torch.randn(2, 4, 7).to(torch.bfloat16)
    ids = torch.randint(0, 7, (2, 4))
    out = token_logprobs(logits, ids)
    assert out.dtype == torch.float32
    expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, expected)


def test_token_logprobs_gradient_is_onehot_minus_softmax():
    logits = torch.randn(3, 5, dtype=F64, requires_grad=True)
    ids = torch.tensor([0, 4, 2])
    token_logprobs(logits, ids, temperature=2.0).sum().backward()
    probs = torch.softmax(logits.detach() / 2.0, dim=-1)
    expected = (torch.nn.functional.one_hot(ids, 5).to(F64) - probs) / 2.0
    torch.testing.assert_close(logits.grad, expected, rtol=0, atol=1e-12)


def _plain_chain(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook autograd chain the lean path replaces: log_softmax + gather, softmax entropy."""
    scaled = logits.to(F64 if logits.dtype == F64 else torch.float32) / temperature
    lsm = torch.log_softmax(scaled, dim=-1)
    return lsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1), -(lsm.exp() * lsm).sum(dim=-1)


@pytest.mark.parametrize("chunk_rows", [1, 3, 64])
def test_lean_unfused_path_equals_the_plain_autograd_chain(monkeypatch, chunk_rows):
    import grpo_pilot.engine.algos.logprobs as logprobs_module

    vocab = 11
    monkeypatch.setattr(logprobs_module, "UNFUSED_CHUNK_ELEMENTS", chunk_rows * vocab)  # 1, 3 or all rows per chunk
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(2, 5, vocab, generator=gen, dtype=F64)
    ids = torch.randint(0, vocab, (2, 5), generator=gen)
    coef_lp, coef_h = torch.randn(2, 5, generator=gen, dtype=F64), torch.randn(2, 5, generator=gen, dtype=F64)

    def run(lean: bool):
        logits = base.clone().requires_grad_(True)
        if lean:
            lp, ent = token_logprobs(logits, ids, temperature=0.7), entropy_from_logits(logits, temperature=0.7)
        else:
            lp, ent = _plain_chain(logits, ids, 0.7)
        ((coef_lp * lp).sum() + (coef_h * ent).sum()).backward()
        return lp.detach(), ent.detach(), logits.grad

    for got, want in zip(run(True), run(False)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # log-prob gradient alone (the update without an entropy bonus): the in-place branch
    logits = base.clone().requires_grad_(True)
    (coef_lp * token_logprobs(logits, ids, temperature=0.7)).sum().backward()
    plain = base.clone().requires_grad_(True)
    (coef_lp * _plain_chain(plain, ids, 0.7)[0]).sum().backward()
    torch.testing.assert_close(logits.grad, plain.grad, rtol=0, atol=1e-12)


def test_lean_unfused_path_bf16_gradient_stays_in_the_logits_dtype():
    logits = torch.randn(6, 9).to(torch.bfloat16).requires_grad_(True)
    ids = torch.randint(0, 9, (6,))
    token_logprobs(logits, ids).sum().backward()
    plain = logits.detach().clone().requires_grad_(True)
    _plain_chain(plain, ids, 1.0)[0].sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad, plain.grad, rtol=1e-2, atol=1e-2)


def test_lean_unfused_backward_holds_no_float32_copy_of_the_logits(monkeypatch):
    import grpo_pilot.engine.algos.logprobs as logprobs_module

    num_tokens, vocab, chunk_rows = 64, 50, 8
    monkeypatch.setattr(logprobs_module, "UNFUSED_CHUNK_ELEMENTS", chunk_rows * vocab)
    logits = torch.randn(num_tokens, vocab).to(torch.bfloat16).requires_grad_(True)
    ids = torch.randint(0, vocab, (num_tokens,))
    with _LargestTensor(dtype=torch.float32) as tracker:
        lp = token_logprobs(logits, ids)
        ent = entropy_from_logits(logits)
        (lp.sum() + ent.sum()).backward()
    assert tracker.max_numel <= chunk_rows * vocab  # every float32 buffer is one chunk; gradients stay bf16
    with _LargestTensor(dtype=torch.float32) as plain:
        _plain_chain(logits.detach().clone().requires_grad_(True), ids, 1.0)[0].sum().backward()
    assert plain.max_numel >= num_tokens * vocab  # the chain it replaces keeps a float32 [T, V] copy


def test_entropy_closed_forms():
    uniform = torch.zeros(2, 8)
    assert entropy_from_logits(uniform).tolist() == pytest.approx([math.log(8)] * 2, abs=1e-6)
    peaked = torch.tensor([[100.0, 0.0, 0.0]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
    two = torch.tensor([[0.0, math.log(3.0)]])  # p = [1/4, 3/4]
    assert entropy_from_logits(two).item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    # temperature → ∞ flattens to uniform
    assert entropy_from_logits(torch.tensor([[0.0, 5.0, 1.0]]), temperature=1e6).item() == pytest.approx(
        math.log(3), abs=1e-4
    )


def _head(num_tokens=7, hidden_size=5, vocab=11, seed=0, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, hidden_size, generator=gen, dtype=dtype)
    weight = torch.randn(vocab, hidden_size, generator=gen, dtype=dtype)
    targets = torch.randint(0, vocab, (num_tokens,), generator=gen)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk_tokens", [1, 3, 7, 100])
@pytest.mark.parametrize("use_entropy", [True, False])
def test_chunked_matches_unchunked_values_and_gradients(chunk_tokens, use_entropy):
    hidden, weight, targets = _head()
    coef_lp = torch.randn(hidden.shape[0], dtype=F64, generator=torch.Generator().manual_seed(1))
    coef_h = torch.randn(hidden.shape[0], dtype=F64, generator=torch.Generator().manual_seed(2))

    def run(chunked: bool):
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        if chunked:
            lp, ent = chunked_token_logprobs(
                h, w, targets, temperature=0.7, chunk_tokens=chunk_tokens, with_entropy=True
            )
        else:
            logits = h @ w.t()
            lp, ent = token_logprobs(logits, targets, temperature=0.7), entropy_from_logits(logits, temperature=0.7)
        objective = (coef_lp * lp).sum() + ((coef_h * ent).sum() if use_entropy else 0.0)
        objective.backward()
        return lp.detach(), ent.detach(), h.grad, w.grad

    for got, want in zip(run(True), run(False)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_chunked_float64_inputs_agree_tightly_and_grad_only_for_weight():
    hidden, weight, targets = _head(num_tokens=10, seed=4)
    w_a = weight.clone().requires_grad_(True)
    lp_a, none = chunked_token_logprobs(hidden, w_a, targets, chunk_tokens=4)
    assert none is None
    lp_a.sum().backward()
    w_b = weight.clone().requires_grad_(True)
    reference = torch.log_softmax(hidden @ w_b.t(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    reference.sum().backward()
    assert lp_a.dtype == F64
    torch.testing.assert_close(lp_a, reference, rtol=0, atol=1e-12)
    torch.testing.assert_close(w_a.grad, w_b.grad, rtol=0, atol=1e-12)


def test_chunked_bf16_head_gradients_close_to_unchunked():
    hidden, weight, targets = _head(num_tokens=16, hidden_size=8, vocab=32, seed=5, dtype=torch.bfloat16)
    h_a, w_a = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    lp_a, _ = chunked_token_logprobs(h_a, w_a, targets, chunk_tokens=5)
    lp_a.sum().backward()
    h_b, w_b = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    lp_b = token_logprobs(h_b @ w_b.t(), targets)
    lp_b.sum().backward()
    assert lp_a.dtype == torch.float32 and w_a.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=1e-6)  # same bf16 matmul, float32 softmax
    torch.testing.assert_close(h_a.grad, h_b.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(w_a.grad, w_b.grad, rtol=2e-2, atol=2e-2)


def test_chunked_ignores_autocast_and_casts_hidden_to_the_head_dtype():
    hidden, weight, targets = _head(num_tokens=9, hidden_size=6, vocab=13, seed=6, dtype=torch.float32)
    w_a = weight.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp_a, _ = chunked_token_logprobs(hidden, w_a, targets, chunk_tokens=4)
        lp_a.sum().backward()
    w_b = weight.clone().requires_grad_(True)
    lp_b = token_logprobs(hidden @ w_b.t(), targets)  # plain float32, no autocast
    lp_b.sum().backward()
    torch.testing.assert_close(lp_a, lp_b, rtol=0, atol=1e-6)
    torch.testing.assert_close(w_a.grad, w_b.grad, rtol=1e-6, atol=1e-6)

    h_bf16 = hidden.to(torch.bfloat16).requires_grad_(True)
    lp_c, _ = chunked_token_logprobs(h_bf16, weight, targets, chunk_tokens=4)
    lp_c.sum().backward()
    assert lp_c.dtype == torch.float32 and h_bf16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lp_c, token_logprobs(h_bf16.detach().float() @ weight.t(), targets), rtol=0, atol=1e-6)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces (of `dtype`, when given)."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.max_numel = 0
        self.dtype = dtype

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and (self.dtype is None or leaf.dtype == self.dtype):
                self.max_numel = max(self.max_numel, leaf.numel())
        return out


def _peak_numel(chunked: bool, num_tokens=64, hidden_size=4, vocab=50, chunk_tokens=8) -> int:
    hidden, weight, targets = _head(num_tokens=num_tokens, hidden_size=hidden_size, vocab=vocab, dtype=torch.float32)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    with _LargestTensor() as tracker:
        if chunked:
            lp, ent = chunked_token_logprobs(hidden, weight, targets, chunk_tokens=chunk_tokens, with_entropy=True)
        else:
            logits = hidden @ weight.t()
            lp, ent = token_logprobs(logits, targets), entropy_from_logits(logits)
        (lp.sum() + ent.sum()).backward()
    return tracker.max_numel


def test_chunked_path_never_materialises_more_than_a_chunk_of_logits():
    # N = 64 tokens, V = 50, chunk 8: full logits are 3200 elements, one chunk 400; hidden is 256, the head 200.
    assert _peak_numel(chunked=False) >= 64 * 50  # the tracker sees the full logits of the plain path
    assert _peak_numel(chunked=True) <= 8 * 50


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {"chunk_tokens": 0}, {"chunk_tokens": 2.5}])
def test_bad_settings_raise_input_error(kwargs):
    hidden, weight, targets = _head()
    with pytest.raises(InputError):
        chunked_token_logprobs(hidden, weight, targets, **kwargs)


def test_shape_mismatch_is_a_programming_error():
    hidden, weight, targets = _head()
    with pytest.raises(ValueError):
        chunked_token_logprobs(hidden, weight[:, :3], targets)
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
