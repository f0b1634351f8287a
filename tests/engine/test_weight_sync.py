"""Named weights in buckets: order, sizes, casts, tied names, and lazy gathering."""

from __future__ import annotations

import torch

from grpo_pilot.engine.model_factory import build_model
from grpo_pilot.engine.weight_sync import buckets, full_weights, stream


def test_buckets_keep_order_and_respect_the_size():
    weights = [(f"w{i}", torch.zeros(n)) for i, n in enumerate([4, 4, 10, 1, 1])]  # float32: 16, 16, 40, 4, 4 bytes
    parts = list(buckets(weights, 32))
    assert [[n for n, _ in b] for b in parts] == [["w0", "w1"], ["w2"], ["w3", "w4"]]  # w2 alone: above the size
    assert [n for n, _ in stream(parts)] == [f"w{i}" for i in range(5)]
    cast = list(buckets(weights, 32, dtype=torch.bfloat16))
    # bf16 halves the sizes: 8 + 8 (+ 20 would be 36 > 32), then 20 + 2 + 2
    assert [[n for n, _ in b] for b in cast] == [["w0", "w1"], ["w2", "w3", "w4"]]
    assert all(t.dtype == torch.bfloat16 for b in cast for _, t in b)


def test_full_weights_names_every_parameter_tied_ones_twice_and_is_lazy():
    model = build_model("examples/tiny")  # tied embeddings
    names = [n for n, _ in full_weights(model)]
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names
    assert len(names) == len(list(model.named_parameters(remove_duplicate=False)))
    pulled = []

    def source():
        for name, tensor in full_weights(model):
            pulled.append(name)
            yield name, tensor

    parts = buckets(source(), 1)  # one tensor per bucket
    first = next(parts)
    assert [n for n, _ in first] == pulled[:1] and len(pulled) <= 2  # nothing gathered beyond the next bucket
