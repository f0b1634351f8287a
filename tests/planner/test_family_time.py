"""Family time terms: pipeline bubble, TP collectives, offload traffic, dequantization."""

from __future__ import annotations

import pytest

from grpo_pilot.planner.family_time import (
    activation_offload_time_s,
    dequant_s,
    megatron_tp_comm_bytes_per_layer,
    megatron_tp_comm_s,
    offload_round_trip_s,
    pipeline_bubble_fraction,
    pipelined_step_s,
)


def test_pipeline_bubble() -> None:
    assert pipeline_bubble_fraction(1, 1, 8) == 0.0
    assert pipeline_bubble_fraction(4, 1, 8) == pytest.approx(3 / 8)
    assert pipeline_bubble_fraction(4, 2, 8) == pytest.approx(3 / 16)
    assert pipelined_step_s(0.1, 8, 4) == pytest.approx(0.1 * (8 + 3))
    assert pipelined_step_s(0.1, 8, 4, 3) == pytest.approx(0.1 * (8 + 1))
    assert pipelined_step_s(0.1, 16, 4) > pipelined_step_s(0.1, 8, 4)


def test_tp_comm() -> None:
    assert megatron_tp_comm_bytes_per_layer(1000, 4096, 2, 1) == 0.0
    assert megatron_tp_comm_bytes_per_layer(1000, 4096, 2, 4) == pytest.approx(4 * 0.75 * 2 * 1000 * 4096)
    bw = 100e9
    assert megatron_tp_comm_s(1000, 4096, 2, 4, link_bytes_per_s=bw) == pytest.approx(
        megatron_tp_comm_bytes_per_layer(1000, 4096, 2, 4) / bw
    )


def test_offload_times() -> None:
    assert offload_round_trip_s(32 * 10**9, 32e9) == pytest.approx(2.0)
    hidden = activation_offload_time_s(1_000_000, 10, 1e9, forward_layer_s=0.01, backward_layer_s=0.02)
    assert hidden.transfer_s == pytest.approx(0.02) and hidden.exposed_s == 0.0
    slow = activation_offload_time_s(100_000_000, 10, 1e9, forward_layer_s=0.05, backward_layer_s=0.08)
    assert slow.transfer_s == pytest.approx(2.0) and slow.exposed_s == pytest.approx(10 * (0.05 + 0.02))
    assert dequant_s(500, 2000, 3, 1000.0) == pytest.approx(7.5)
