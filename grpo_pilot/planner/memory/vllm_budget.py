"""The vLLM engine's memory: `gpu_memory_utilization × total device memory`, split into parts.

vLLM ≥ 0.7 (V1 `Worker.determine_available_memory`) requests util × *total* memory regardless of
what other processes (our trainer) hold, then subtracts what its profile run consumed; the rest is
KV cache. From vLLM 0.21 the CUDA-graph estimate is inside the budget too. Per GPU of a t-way
tensor-parallel replica:

- weights        c · ceil(P / t)   (vocab-parallel embedding / lm_head are split as well)
- activations    peak of the profile run: max(forward of max_num_batched_tokens tokens, sampler run)
    forward per token: residual + normed hidden (2·c·h), qkv (c·(q+2kv)/t), attention output
    (c·q/t), gate_up + SiLU·up (3·c·I/t); one layer at a time, nothing saved.
    sampler: min(max_num_seqs, max_num_batched_tokens) requests × V × sampler bytes per entry.
- non-torch      NCCL / custom all-reduce / workspaces, growing with t (0 on cpu)
- CUDA graphs    graph modes × number of capture sizes × bytes per graph + the largest capture's
                 activations (0 with enforce_eager, and on cpu). Capture sizes follow
                 vllm/config/vllm.py: [1, 2, 4] + 8..248 step 8 + 256..max step 16, max =
                 min(2 · max_num_seqs, 512, max_num_batched_tokens).
- KV cache       the rest. It can be negative: the caller reports 0 and keeps the signed value so
                 constraints can say how far off the budget is.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from grpo_pilot.planner.overheads import Overheads
from grpo_pilot.profiles.spec import ModelSpec

VLLM_DEFAULT_MAX_CAPTURE_SIZE = 512  # vllm/config/vllm.py default_max_graph_size (1024 on Blackwell)


class VllmBudget(NamedTuple):
    budget_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv_signed_bytes: int  # budget minus everything else; negative = the engine cannot start

    @property
    def kv_cache_bytes(self) -> int:
        return max(0, self.kv_signed_bytes)


@lru_cache(maxsize=64)
def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, int]:
    """(number of CUDA-graph capture sizes, largest size) for vLLM's default capture list."""
    largest = min(2 * max_num_seqs, VLLM_DEFAULT_MAX_CAPTURE_SIZE, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8))
    sizes += list(range(256, largest + 1, 16))
    return len(sizes), (sizes[-1] if sizes else 0)


def forward_bytes_per_token(
    *, hidden: int, q_dim: int, kv_dim: int, intermediate: int, tensor_parallel: int, compute_bytes: int
) -> int:
    """Transient activation bytes per token of one vLLM decoder layer on one GPU."""
    t = tensor_parallel
    return compute_bytes * (2 * hidden + (2 * q_dim + 2 * kv_dim) // t + 3 * intermediate // t)


class VllmSettings(NamedTuple):
    """The engine settings that size its budget (verl's rollout config / vLLM's EngineArgs)."""

    utilization: float  # gpu_memory_utilization
    tensor_parallel: int
    max_num_batched_tokens: int
    max_num_seqs: int
    cuda_graphs: bool  # captured (a GPU and not enforce_eager)
    non_torch_buffers: bool  # NCCL / workspaces outside torch (a GPU)


def vllm_budget(
    *,
    model: ModelSpec,
    settings: VllmSettings,
    device_bytes: int,
    weight_bytes: int,
    overheads: Overheads,
    preexisting_bytes: int = 0,
) -> VllmBudget:
    """Split one GPU's vLLM budget into weights, activation peak, buffers, graphs and KV cache.

    `weight_bytes`: bytes per weight (and KV) element. `preexisting_bytes`: memory already in use on the
    GPU when the engine profiles, which vLLM <= 0.8 counts against the same budget
    (worker.determine_num_available_blocks / v1 gpu_worker.determine_available_memory: KV = total ×
    utilization − torch's process-wide allocated peak − every non-torch allocation on the device); 0 for
    vLLM >= 0.9, whose memory_profiling measures only the engine's own increase from its start snapshot."""
    s, ov, t = settings, overheads, settings.tensor_parallel
    budget = int(s.utilization * device_bytes) - preexisting_bytes
    weights = -(-model.num_params // t) * weight_bytes
    per_token = forward_bytes_per_token(
        hidden=model.hidden_size,
        q_dim=model.q_dim,
        kv_dim=model.kv_dim,
        intermediate=model.intermediate_size,
        tensor_parallel=t,
        compute_bytes=weight_bytes,
    )
    sampler_reqs = min(s.max_num_seqs, s.max_num_batched_tokens)
    activations = max(
        s.max_num_batched_tokens * per_token, sampler_reqs * model.vocab_size * ov.vllm_sampler_bytes_per_vocab_entry
    )
    non_torch = 0
    if s.non_torch_buffers:
        non_torch = ov.vllm_non_torch_base_bytes + (t - 1) * ov.vllm_non_torch_per_extra_tp_rank_bytes
    graphs = 0
    if s.cuda_graphs:
        num_sizes, largest = capture_sizes(s.max_num_seqs, s.max_num_batched_tokens)
        graphs = ov.vllm_cuda_graph_modes * num_sizes * ov.vllm_cuda_graph_bytes_per_graph + largest * per_token
    kv = budget - weights - activations - non_torch - graphs
    return VllmBudget(budget, weights, activations, non_torch, graphs, kv)
