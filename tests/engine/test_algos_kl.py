"""KL estimators k1/k2/k3: closed-form values, autograd vs hand derivatives, verl's clamps, aliases."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_pilot.engine.algos import kl_penalty
from grpo_pilot.errors import InputError

F64 = torch.float64
LOGP = [-1.0, -2.0, -0.5]
REF = [-1.5, -1.0, -0.5]
D = [a - b for a, b in zip(LOGP, REF)]  # log π − log π_ref = [0.5, -1.0, 0.0]


@pytest.mark.parametrize(
    ("kind", "value", "grad"),
    [
        ("k1", D, [1.0, 1.0, 1.0]),
        ("kl", D, [1.0, 1.0, 1.0]),
        ("k2", [0.5 * d * d for d in D], D),
        ("mse", [0.5 * d * d for d in D], D),
        ("k3", [math.exp(-d) + d - 1 for d in D], [1 - math.exp(-d) for d in D]),
        ("low_var_kl", [math.exp(-d) + d - 1 for d in D], [1 - math.exp(-d) for d in D]),
        ("abs", [abs(d) for d in D], [1.0, -1.0, 0.0]),
    ],
)
def test_closed_form_value_and_gradient(kind, value, grad):
    logp = torch.tensor([LOGP], dtype=F64, requires_grad=True)
    ref = torch.tensor([REF], dtype=F64, requires_grad=True)
    kl = kl_penalty(logp, ref, kind)
    torch.testing.assert_close(kl, torch.tensor([value], dtype=F64), rtol=0, atol=1e-12)
    kl.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([grad], dtype=F64), rtol=0, atol=1e-12)
    assert ref.grad is None  # the reference is a constant


@pytest.mark.parametrize("d", [30.0, -30.0, 12.0])
def test_k3_clamps_like_verl(d):
    logp = torch.tensor([[d - 1.0]], dtype=F64, requires_grad=True)
    kl = kl_penalty(logp, torch.tensor([[-1.0]], dtype=F64), "k3")
    # exponent argument clamped to ±20, value clamped to ±10: all three saturate at 10 with zero gradient
    assert kl.item() == 10.0
    kl.sum().backward()
    assert logp.grad.item() == 0.0


def test_k3_inside_the_clamps_is_unclamped():
    logp = torch.tensor([[2.0]], dtype=F64)
    assert kl_penalty(logp, torch.tensor([[0.0]], dtype=F64), "k3").item() == pytest.approx(math.exp(-2) + 1.0)


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=-8.0, max_value=8.0), st.floats(min_value=-8.0, max_value=0.0))
def test_k3_is_non_negative_and_close_to_k2_for_small_differences(d, ref):
    logp = torch.tensor([[ref + d]], dtype=F64)
    ref_t = torch.tensor([[ref]], dtype=F64)
    k3 = kl_penalty(logp, ref_t, "k3").item()
    assert k3 >= -4 * 2.0**-52  # e^-d + d - 1 >= 0 exactly; allow float64 rounding of the three terms
    if abs(d) < 1e-2:
        assert k3 == pytest.approx(0.5 * d * d, abs=abs(d) ** 3 + 1e-15)  # third-order term + cancellation


def test_unknown_kind_raises_input_error():
    with pytest.raises(InputError) as info:
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "k4")
    assert "low_var_kl" in info.value.hint
