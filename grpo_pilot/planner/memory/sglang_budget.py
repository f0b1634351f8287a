"""The SGLang engine's memory (verl `actor_rollout_ref.rollout.name=sglang`).

`mem_fraction_static` is a fraction of the memory that is *free when the engine starts*, not of the
device's total (unlike vLLM ≥ 0.9, whose `gpu_memory_utilization` is a fraction of total memory):
- `ModelRunner.init_torch_distributed` measures `min_per_gpu_memory = get_available_gpu_memory(...)`
  (`torch.cuda.mem_get_info` free bytes after `empty_cache`, the minimum over ranks) after the
  distributed init and *before* the weights load, and passes it on as `total_gpu_memory`
  (sglang python/sglang/srt/model_executor/model_runner.py, 0.5.x);
- `profile_max_num_token` (model_runner_kv_cache_mixin.py, 001ccef0) measures free memory again after
  loading and sizes the KV pool as
      rest = free_after_load − free_at_start · (1 − mem_fraction_static);   tokens = rest // cell_size
  with cell_size = kv_heads_per_tp · (head_dim + v_head_dim) · layers · kv dtype bytes (= our
  `kv_bytes_per_token`). So KV = mem_fraction_static · free_at_start − weights (− whatever else the load
  allocated), and the static part (weights + KV pool) is mem_fraction_static · free_at_start.
  Everything the trainer already holds on a colocated GPU when SGLang starts shrinks free_at_start.
- the rest, (1 − mem_fraction_static) · free_at_start, is the reserve for what is allocated after the
  measurement: `ReqToTokenPool` (int32 [max_running_requests + 1, context_len + 4], allocated under the
  KV-cache memory-saver region; max_running_requests defaults to
  clamp(KV tokens / context_len · 512, 2048, 4096) — mixin `init_memory`), CUDA graphs (captured after
  the pools), and the activations of a prefill chunk (`chunked_prefill_size` tokens) and of sampling.
SGLang's own default for mem_fraction_static (server_args.py `_handle_gpu_memory_settings`) reserves
512 MiB + 1.5 MiB per chunked-prefill token + 2 MiB per CUDA-graph batch size (+ TP·PP/8 GiB, at least
10 GiB above 60 GiB GPUs); verl always sets it: `mem_fraction_static = rollout.gpu_memory_utilization`
(workers/rollout/sglang_rollout/async_sglang_server.py b178a3cd L257–L273, which also passes
`disable_cuda_graph = enforce_eager`, `max_running_requests = rollout.max_num_seqs`,
`enable_memory_saver = True`, tp_size = rollout TP × DP; verl pins sglang 0.5.6 in setup.py).

CUDA graphs (server_args.py): `cuda_graph_max_bs` defaults by GPU memory and TP — 8 below 20 GiB;
24 (TP < 4) / 80 below 35 GiB; 32 / 160 below 60 GiB; 256 / 512 below 160 GiB (H100, A100-80G, H200,
H20); 512 above — and the captured batch sizes are [1, 2, 4, 8, 12] + 16..256 step 8 + 272..<512 step 16 +
512.. step 32, up to cuda_graph_max_bs and never above max_running_requests.

Between phases verl's hybrid engine calls `release_memory_occupation(tags=["kv_cache", "weights"])`
(torch_memory_saver): the KV pool, the ReqToTokenPool and the weights are freed, the CUDA graphs, NCCL
buffers and the context stay; `resume_memory_occupation` re-maps them (weights first, then kv_cache,
around the weight update). `enable_weights_cpu_backup` (sglang ≥ 0.5.3) is set only in verl's
COLOCATED mode (not the default hybrid one) and keeps a host copy of the weights.
"""

from __future__ import annotations

from typing import NamedTuple

REQ_TO_TOKEN_BYTES = 4  # int32 token indices
REQ_TO_TOKEN_EXTRA_CONTEXT = 4  # ReqToTokenPool max_context_len = context_len + 4
AUTO_MAX_REQS_PER_CONTEXT = 512  # mixin init_memory: KV tokens / context_len · 512
AUTO_MAX_REQS_BOUNDS = (2048, 4096)
GiB = 1 << 30
# (GPU memory below, cuda_graph_max_bs for TP < 4, for TP >= 4): server_args.py _handle_gpu_memory_settings
CUDA_GRAPH_MAX_BS_TABLE = ((20 * GiB, 8, 8), (35 * GiB, 24, 80), (60 * GiB, 32, 160), (160 * GiB, 256, 512))
CUDA_GRAPH_MAX_BS_LARGEST = 512
CHUNKED_PREFILL_TABLE = ((20 * GiB, 2048), (35 * GiB, 2048), (60 * GiB, 4096), (160 * GiB, 8192))
CHUNKED_PREFILL_LARGEST = 16384


def default_cuda_graph_max_bs(gpu_memory_bytes: int, tensor_parallel: int) -> int:
    """SGLang's default `cuda_graph_max_bs` for a GPU of this size (module docstring)."""
    for below, small_tp, large_tp in CUDA_GRAPH_MAX_BS_TABLE:
        if gpu_memory_bytes < below:
            return small_tp if tensor_parallel < 4 else large_tp
    return CUDA_GRAPH_MAX_BS_LARGEST


def default_chunked_prefill_size(gpu_memory_bytes: int) -> int:
    """SGLang's default `chunked_prefill_size` for a GPU of this size."""
    for below, size in CHUNKED_PREFILL_TABLE:
        if gpu_memory_bytes < below:
            return size
    return CHUNKED_PREFILL_LARGEST


def cuda_graph_batch_sizes(cuda_graph_max_bs: int, max_running_requests: int) -> list[int]:
    """Batch sizes SGLang captures (server_args.py `_generate_cuda_graph_batch_sizes`, no speculative decoding)."""
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
    sizes += list(range(512, cuda_graph_max_bs + 1, 32))
    cap = min(cuda_graph_max_bs, max_running_requests)
    return [s for s in sizes if s <= cap]


def auto_max_running_requests(kv_tokens: int, context_len: int) -> int:
    """max_running_requests when unset: clamp(KV tokens / context_len · 512, 2048, 4096)."""
    low, high = AUTO_MAX_REQS_BOUNDS
    return min(max(int(kv_tokens / context_len * AUTO_MAX_REQS_PER_CONTEXT), low), high)


def req_to_token_bytes(max_running_requests: int, context_len: int) -> int:
    """The ReqToTokenPool: int32 [max_running_requests + 1, context_len + 4]."""
    return REQ_TO_TOKEN_BYTES * (max_running_requests + 1) * (context_len + REQ_TO_TOKEN_EXTRA_CONTEXT)


class SglangBudget(NamedTuple):
    free_at_start_bytes: int  # device memory free when the engine measures (after other processes)
    static_bytes: int  # mem_fraction_static · free_at_start: weights + KV pool
    weights_bytes: int
    kv_signed_bytes: int  # static − weights; ≤ 0: SGLang refuses to start ("Not enough memory")
    kv_tokens: int
    max_running_requests: int
    req_to_token_bytes: int
    cuda_graph_bytes: int
    activation_bytes: int  # the larger of a prefill chunk's forward and a sampling step
    reserve_signed_bytes: int  # (1 − f) · free_at_start − the three above; < 0: OOM after start

    @property
    def kv_cache_bytes(self) -> int:
        return max(0, self.kv_signed_bytes)

    @property
    def engine_bytes(self) -> int:
        """What the engine holds during rollout (weights, KV pool, ReqToTokenPool, graphs, activation peak)."""
        return (
            self.weights_bytes + self.kv_cache_bytes + self.req_to_token_bytes + self.cuda_graph_bytes
        ) + self.activation_bytes


def sglang_budget(
    *,
    total_memory_bytes: int,
    preexisting_bytes: int,
    mem_fraction_static: float,
    num_params: int,
    tensor_parallel: int,
    weight_bytes: int,
    kv_bytes_per_token: int,
    context_len: int,
    max_running_requests: int,
    cuda_graph_max_bs: int,
    disable_cuda_graph: bool,
    chunked_prefill_size: int,
    forward_bytes_per_token: int,
    vocab: int,
    sampler_bytes_per_vocab_entry: int,
    cuda_graph_bytes_per_graph: int,
) -> SglangBudget:
    """Split one GPU's SGLang memory (module docstring). `preexisting_bytes`: what other processes (the
    trainer, its CUDA context) and the engine's own context / NCCL buffers hold when it measures free
    memory. `max_running_requests`, `cuda_graph_max_bs`, `chunked_prefill_size`: 0 = SGLang's default."""
    free = max(0, total_memory_bytes - preexisting_bytes)
    static = int(mem_fraction_static * free)
    weights = -(-num_params // tensor_parallel) * weight_bytes
    kv_signed = static - weights
    kv_tokens = max(0, kv_signed) // kv_bytes_per_token
    reqs = max_running_requests or auto_max_running_requests(kv_tokens, context_len)
    pool = req_to_token_bytes(reqs, context_len)
    graphs = 0
    if not disable_cuda_graph:
        max_bs = cuda_graph_max_bs or default_cuda_graph_max_bs(total_memory_bytes, tensor_parallel)
        sizes = cuda_graph_batch_sizes(max_bs, reqs)
        graphs = len(sizes) * cuda_graph_bytes_per_graph + (sizes[-1] if sizes else 0) * forward_bytes_per_token
    chunk = chunked_prefill_size or default_chunked_prefill_size(total_memory_bytes)
    activations = max(chunk * forward_bytes_per_token, reqs * vocab * sampler_bytes_per_vocab_entry)
    reserve = free - static - pool - graphs - activations
    return SglangBudget(free, static, weights, kv_signed, kv_tokens, reqs, pool, graphs, activations, reserve)


def sglang_sleep_leftover_items(budget: SglangBudget) -> dict[str, int]:
    """What stays on the GPU while verl's hybrid engine has released `kv_cache` and `weights`."""
    return {"sglang_cuda_graphs": budget.cuda_graph_bytes}


def sglang_host_bytes(budget: SglangBudget, *, weights_cpu_backup: bool) -> int:
    """Host RAM of one engine rank: the weight backup (verl COLOCATED mode only)."""
    return budget.weights_bytes if weights_cpu_backup else 0
