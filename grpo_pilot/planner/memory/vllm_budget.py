"""The vLLM engine's memory: `gpu_memory_utilization × total device memory`, split into parts.

vLLM requests util × *total* memory, then subtracts what its profile run consumed; the rest is KV
cache. What "consumed" covers is the `vllm_memory` knob (planner/config.py): the V1 engine of vLLM 0.7–0.8
(v1/worker/gpu_worker.py `determine_available_memory`, v0.8.3) subtracts the process-wide torch peak and
every non-torch byte on the device, so the trainer sharing the GPU counts ('device'); vLLM >= 0.9's V1 and
the V0 engine of vLLM 0.7–0.8 (vllm/worker/worker.py `determine_num_available_blocks` and
vllm/utils.py `memory_profiling`, v0.8.3: weights + the torch peak's increase during the profile run + the
non-torch increase since the worker's init_device snapshot) count only the engine's own memory ('instance').
From vLLM 0.21 the CUDA-graph estimate is inside the budget too. verl's own vendored workers for vLLM 0.3.1,
0.4.2, 0.5.4 and 0.6.3 ('free'; verl/third_party/vllm/vllm_v_0_6_3/worker.py `determine_num_available_blocks`,
volcengine/verl v0.1–v0.4.1, and the same lines in vllm_v_0_3_1 `profile_num_available_blocks`, vllm_v_0_4_2,
vllm_v_0_5_4) size it differently: after `torch.cuda.empty_cache()` and the profile run they read
`torch.cuda.mem_get_info()` and take gpu_memory_utilization × the *free* memory (what the trainer, the engine's
weights, the profile run's cached peak and every non-torch buffer left), the upstream formula commented out beside
it. verl used them whenever the installed vLLM was one of those four (verl/third_party/vllm/__init__.py), the only
choice before f8b4d0857 (#209, 2025-02-15) added vLLM >= 0.7's own worker; #2257 (52065c640, 2025-06-29)
dropped them. The count is fixed at the engine's build (`cache_config.num_gpu_blocks`): with
rollout.free_cache_engine each rollout re-allocates the same blocks (vllm_rollout.py generate_sequences
`init_cache_engine`), beside whatever the trainer holds by then. CUDA graphs are captured after the cache, outside
it. Per GPU of a t-way tensor-parallel replica:

- weights        c · ceil(P / t)   (vocab-parallel embedding / lm_head are split as well)
- activations    peak of the profile run: max(forward of max_num_batched_tokens tokens, sampler run)
    forward per token: residual + normed hidden (2·c·h), qkv (c·(q+2kv)/t), attention output
    (c·q/t), gate_up + SiLU·up (3·c·I/t); one layer at a time, nothing saved.
    sampler: min(max_num_seqs, max_num_batched_tokens) requests × V × sampler bytes per entry (V1's
    `_dummy_sampler_run`, or V0's profile prompts through its top-k/top-p sampler: `Overheads`).
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
    engine: str = "v1"  # 'v0' profiles its sampler differently (Overheads.vllm_v0_sampler_bytes_per_vocab_entry)
    of_free: bool = False  # verl's vendored worker: utilization × the memory free after the profile (docstring)


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
    GPU when the engine profiles, which the V1 engine of vLLM <= 0.8 counts against the same budget
    (v1/worker/gpu_worker.py determine_available_memory: KV = total × utilization − torch's process-wide
    allocated peak − every non-torch allocation on the device); 0 for vLLM >= 0.9 and for vLLM 0.7–0.8's V0
    engine (module docstring), whose memory_profiling measures only the engine's own increase from its start
    snapshot. With `settings.of_free` (verl's vendored workers, module docstring) the KV cache is utilization ×
    (device − preexisting − weights − activation peak − non-torch) and the budget is what the engine then holds."""
    s, ov, t = settings, overheads, settings.tensor_parallel
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
    sampler_entry = (
        ov.vllm_v0_sampler_bytes_per_vocab_entry if s.engine == "v0" else ov.vllm_sampler_bytes_per_vocab_entry
    )
    activations = max(s.max_num_batched_tokens * per_token, sampler_reqs * model.vocab_size * sampler_entry)
    non_torch = 0
    if s.non_torch_buffers:
        non_torch = ov.vllm_non_torch_base_bytes + (t - 1) * ov.vllm_non_torch_per_extra_tp_rank_bytes
    graphs = 0
    if s.cuda_graphs:
        num_sizes, largest = capture_sizes(s.max_num_seqs, s.max_num_batched_tokens)
        graphs = ov.vllm_cuda_graph_modes * num_sizes * ov.vllm_cuda_graph_bytes_per_graph + largest * per_token
    if s.of_free:
        free = device_bytes - preexisting_bytes - weights - activations - non_torch
        kv = int(s.utilization * free) if free > 0 else free  # negative: the profile run itself does not fit
        return VllmBudget(weights + activations + non_torch + max(0, kv), weights, activations, non_torch, graphs, kv)
    budget = int(s.utilization * device_bytes) - preexisting_bytes
    kv = budget - weights - activations - non_torch - graphs
    return VllmBudget(budget, weights, activations, non_torch, graphs, kv)
