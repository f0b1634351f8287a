"""SGLang budget: mem_fraction_static of the memory free at start, the reserve, graphs, defaults."""

from __future__ import annotations

import pytest

from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token
from grpo_pilot.planner.memory.sglang_budget import (
    auto_max_running_requests,
    cuda_graph_batch_sizes,
    default_chunked_prefill_size,
    default_cuda_graph_max_bs,
    req_to_token_bytes,
    sglang_budget,
    sglang_host_bytes,
    sglang_sleep_leftover_items,
)
from grpo_pilot.planner.memory.vllm_budget import forward_bytes_per_token
from tests.planner.conftest import spec

GiB = 1 << 30


def _budget(preexisting: int = 0, fraction: float = 0.5, **over):
    m = spec("qwen2.5-7b")
    kw = dict(
        total_memory_bytes=80 * GiB,
        preexisting_bytes=preexisting,
        mem_fraction_static=fraction,
        num_params=m.num_params,
        tensor_parallel=1,
        weight_bytes=2,
        kv_bytes_per_token=kv_bytes_per_token(
            num_layers=m.num_layers, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, tensor_parallel=1, kv_bytes=2
        ),
        context_len=m.max_position_embeddings,
        max_running_requests=256,
        cuda_graph_max_bs=0,
        disable_cuda_graph=False,
        chunked_prefill_size=0,
        forward_bytes_per_token=forward_bytes_per_token(
            hidden=m.hidden_size,
            q_dim=m.q_dim,
            kv_dim=m.kv_dim,
            intermediate=m.intermediate_size,
            tensor_parallel=1,
            compute_bytes=2,
        ),
        vocab=m.vocab_size,
        sampler_bytes_per_vocab_entry=8,
        cuda_graph_bytes_per_graph=8 << 20,
    )
    kw.update(over)
    return sglang_budget(**kw)


def test_fraction_of_free_memory_by_hand() -> None:
    # the trainer holds 20 GiB when SGLang measures: free 60 GiB, static 0.5 × 60 = 30 GiB
    b = _budget(preexisting=20 * GiB)
    weights = 2 * 7_615_616_512
    assert b.free_at_start_bytes == 60 * GiB and b.static_bytes == 30 * GiB
    assert b.weights_bytes == weights and b.kv_signed_bytes == 30 * GiB - weights
    assert b.kv_tokens == (30 * GiB - weights) // (2 * 28 * 4 * 128 * 2)
    # Qwen2.5-7B's config.json context (max_position_embeddings 131072): int32 [257, 131076]
    assert spec("qwen2.5-7b").max_position_embeddings == 131072
    assert b.req_to_token_bytes == 4 * 257 * 131076
    # H100-sized GPU, TP 1 → cuda_graph_max_bs 256: 5 small sizes + 16..256 step 8 (31) = 36 graphs
    fwd = forward_bytes_per_token(
        hidden=3584, q_dim=3584, kv_dim=512, intermediate=18944, tensor_parallel=1, compute_bytes=2
    )
    assert b.cuda_graph_bytes == 36 * (8 << 20) + 256 * fwd
    assert b.activation_bytes == max(8192 * fwd, 256 * 152064 * 8)
    reserve = 30 * GiB - b.req_to_token_bytes - b.cuda_graph_bytes - b.activation_bytes
    assert b.reserve_signed_bytes == reserve


def test_same_number_different_meaning_than_vllm() -> None:
    # vLLM >= 0.9: util × total = 40 GiB whatever the trainer holds; SGLang: 0.5 × what is free
    alone = _budget(preexisting=0)
    shared = _budget(preexisting=30 * GiB)
    assert alone.static_bytes == 40 * GiB and shared.static_bytes == 25 * GiB
    assert shared.kv_signed_bytes == alone.kv_signed_bytes - 15 * GiB


def test_monotone_and_refusal() -> None:
    more_trainer = [_budget(preexisting=p * GiB).kv_signed_bytes for p in (0, 10, 20, 40)]
    assert more_trainer == sorted(more_trainer, reverse=True)
    by_fraction = [_budget(fraction=f) for f in (0.3, 0.5, 0.7, 0.9)]
    assert [b.kv_signed_bytes for b in by_fraction] == sorted(b.kv_signed_bytes for b in by_fraction)
    assert [b.reserve_signed_bytes for b in by_fraction] == sorted(
        (b.reserve_signed_bytes for b in by_fraction), reverse=True
    )
    assert by_fraction[-1].reserve_signed_bytes < by_fraction[0].reserve_signed_bytes
    starved = _budget(preexisting=60 * GiB, fraction=0.5)  # 10 GiB static < 15.2 GB of weights
    assert starved.kv_signed_bytes < 0 and starved.kv_cache_bytes == 0 and starved.kv_tokens == 0
    eager = _budget(disable_cuda_graph=True)
    assert eager.cuda_graph_bytes == 0 and eager.reserve_signed_bytes > _budget().reserve_signed_bytes


def test_defaults_tables() -> None:
    assert default_cuda_graph_max_bs(16 * GiB, 1) == 8
    assert default_cuda_graph_max_bs(24 * GiB, 1) == 24 and default_cuda_graph_max_bs(24 * GiB, 4) == 80
    assert default_cuda_graph_max_bs(40 * GiB, 2) == 32 and default_cuda_graph_max_bs(40 * GiB, 8) == 160
    assert default_cuda_graph_max_bs(80 * GiB, 1) == 256 and default_cuda_graph_max_bs(141 * GiB, 4) == 512
    assert default_cuda_graph_max_bs(180 * GiB, 1) == 512
    assert [default_chunked_prefill_size(g * GiB) for g in (16, 24, 40, 80, 180)] == [2048, 2048, 4096, 8192, 16384]
    sizes = cuda_graph_batch_sizes(512, 4096)
    assert len(sizes) == 5 + 31 + 15 + 1 and sizes[-1] == 512
    assert cuda_graph_batch_sizes(512, 64)[-1] == 64  # never above max_running_requests
    assert cuda_graph_batch_sizes(8, 4096) == [1, 2, 4, 8]


def test_auto_requests_and_pool() -> None:
    assert auto_max_running_requests(1_000_000, 32768) == 4096
    assert auto_max_running_requests(100_000, 32768) == 2048
    assert auto_max_running_requests(200_000, 32768) == 3125
    assert req_to_token_bytes(2048, 131072) == 4 * 2049 * 131076
    auto = _budget(max_running_requests=0)
    assert auto.max_running_requests in (2048, 3125, 4096) and auto.max_running_requests >= 2048
    assert auto.req_to_token_bytes > _budget().req_to_token_bytes


def test_sleep_and_host() -> None:
    b = _budget()
    assert sglang_sleep_leftover_items(b) == {"sglang_cuda_graphs": b.cuda_graph_bytes}
    assert sglang_host_bytes(b, weights_cpu_backup=True) == b.weights_bytes
    assert sglang_host_bytes(b, weights_cpu_backup=False) == 0
    assert b.engine_bytes == (
        b.weights_bytes + b.kv_cache_bytes + b.req_to_token_bytes + b.cuda_graph_bytes + b.activation_bytes
    )
    assert b.engine_bytes + b.reserve_signed_bytes == pytest.approx(b.free_at_start_bytes, abs=1)
