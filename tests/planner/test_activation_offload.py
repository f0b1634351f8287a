"""verl activation offload: two layers on the GPU, the rest in power-of-two-rounded pinned host memory."""

from __future__ import annotations

import pytest

from grpo_pilot.planner.memory.activation_offload import (
    activation_offload_bytes,
    hf_layer_saved_tensor_bytes,
    host_bytes_per_node,
    power_of_two_ceil,
)
from grpo_pilot.planner.memory.activations import layer_activation_bytes_per_token


def test_power_of_two_ceil() -> None:
    assert [power_of_two_ceil(n) for n in (0, 1, 2, 3, 1000, 1024, 1025)] == [0, 1, 2, 4, 1024, 1024, 2048]


def test_tensor_split_sums_to_the_traced_layer_bytes() -> None:
    # Qwen2.5-7B shape: the split must add up to activations.py's traced per-layer bytes
    h, q, kv, i, a = 3584, 3584, 512, 18944, 28
    split = hf_layer_saved_tensor_bytes(h, q, i, a, kv_dim=kv, compute_bytes=2)
    assert sum(split) == layer_activation_bytes_per_token(
        hidden=h, q_dim=q, kv_dim=kv, intermediate=i, num_heads=a, compute_bytes=2
    )


def test_by_hand_without_checkpointing() -> None:
    per_token = (16, 16, 32, 8)  # four tensors, 72 bytes per token
    out = activation_offload_bytes(
        num_layers=5,
        tokens=100,
        layer_tensor_bytes_per_token=per_token,
        checkpoint_input_bytes_per_token=16,
        checkpointing=False,
    )
    assert out.gpu_saved_bytes == 2 * 7200 and out.gpu_recompute_bytes == 0
    assert out.transfer_bytes == 4 * 7200
    # pinned: 1600 → 2048 twice, 3200 → 4096, 800 → 1024 per layer, four offloaded layers
    assert out.host_bytes == 4 * (2048 + 2048 + 4096 + 1024)
    assert host_bytes_per_node(out, 8) == 8 * out.host_bytes


def test_by_hand_with_checkpointing() -> None:
    out = activation_offload_bytes(
        num_layers=5,
        tokens=100,
        layer_tensor_bytes_per_token=(16, 16, 32, 8),
        checkpoint_input_bytes_per_token=16,
        checkpointing=True,
    )
    assert out.gpu_saved_bytes == 2 * 1600 and out.gpu_recompute_bytes == 7200
    assert out.host_bytes == 4 * 2048 and out.transfer_bytes == 4 * 1600


def test_too_few_layers_disables_it_and_more_tokens_cost_more() -> None:
    short = activation_offload_bytes(
        num_layers=2,
        tokens=100,
        layer_tensor_bytes_per_token=(8,),
        checkpoint_input_bytes_per_token=8,
        checkpointing=False,
    )
    assert short.host_bytes == 0 and short.gpu_saved_bytes == 2 * 800
    split = hf_layer_saved_tensor_bytes(3584, 3584, 18944, 28, kv_dim=512, compute_bytes=2)
    sizes = [
        activation_offload_bytes(
            num_layers=28,
            tokens=t,
            layer_tensor_bytes_per_token=split,
            checkpoint_input_bytes_per_token=2 * 3584,
            checkpointing=False,
        )
        for t in (1024, 4096, 16384)
    ]
    assert sizes[0].host_bytes < sizes[1].host_bytes < sizes[2].host_bytes
    assert sizes[0].gpu_saved_bytes < sizes[1].gpu_saved_bytes < sizes[2].gpu_saved_bytes
    # 26 of 28 layers' activations leave the GPU: on-GPU saved bytes are 2/28 of the full set
    full = 28 * 16384 * sum(split)
    assert sizes[2].gpu_saved_bytes == pytest.approx(full * 2 / 28)
    assert full * 27 / 28 <= sizes[2].host_bytes <= 2 * full * 27 / 28
