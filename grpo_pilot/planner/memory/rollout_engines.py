"""The rollout engine's budget behind one view (`VllmBudget`'s fields), for vLLM and for SGLang, and the
memory items each engine reports.

- vLLM: `vllm_budget.py` (gpu_memory_utilization × total device memory).
- SGLang (`sglang_budget.py`): verl passes `mem_fraction_static = rollout.gpu_memory_utilization`,
  `max_running_requests = rollout.max_num_seqs`, `disable_cuda_graph = rollout.enforce_eager`
  (workers/rollout/sglang_rollout/async_sglang_server.py, volcengine/verl b178a3cd L257–L283) and no
  `context_length` (SGLang takes the model config's `max_position_embeddings`) nor `chunked_prefill_size`
  (SGLang's default for the GPU). The static part — weights and KV pool — is `mem_fraction_static` of the
  memory *free when the engine measures*, after the trainer (and the engine's own process) took theirs: the
  KV pool is that minus the weights. The ReqToTokenPool, the CUDA graphs and a prefill chunk's activations
  are allocated after, in the rest; when they exceed it the engine runs out of memory, which the rollout
  phase's total shows (it exceeds the device). The view maps SGLang's parts onto vLLM's fields:
  `budget_bytes` the static part, `non_torch_bytes` the ReqToTokenPool.
Between phases verl releases SGLang's `kv_cache` and `weights` (the graphs stay: `sglang_sleep_leftover_items`),
as vLLM's sleep level 2 does.
"""

from __future__ import annotations

from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token_per_gpu
from grpo_pilot.planner.memory.sglang_budget import sglang_budget
from grpo_pilot.planner.memory.vllm_budget import VllmBudget, forward_bytes_per_token
from grpo_pilot.planner.overheads import Overheads
from grpo_pilot.profiles.spec import ModelSpec

# engine item name → VllmBudget field, per engine (the order the rollout table shows them)
_ITEMS = {
    "vllm": (
        ("vllm_weights", "weights_bytes"),
        ("vllm_activation_peak", "activation_bytes"),
        ("vllm_non_torch", "non_torch_bytes"),
        ("vllm_cuda_graphs", "cuda_graph_bytes"),
        ("vllm_kv_cache", "kv_cache_bytes"),
    ),
    "sglang": (
        ("sglang_weights", "weights_bytes"),
        ("sglang_activation_peak", "activation_bytes"),
        ("sglang_req_to_token_pool", "non_torch_bytes"),
        ("sglang_cuda_graphs", "cuda_graph_bytes"),
        ("sglang_kv_cache", "kv_cache_bytes"),
    ),
}
# every rollout-engine item name: memory the engine holds outside the trainer's caching allocator
ENGINE_ITEM_NAMES: frozenset[str] = frozenset(name for pairs in _ITEMS.values() for name, _ in pairs)


# What a sleeping engine has resumed while the trainer's weights arrive: vLLM its weights (sleep level 2 frees
# weights and KV cache; graphs and non-torch buffers never leave), SGLang its weights (verl resumes `weights`,
# syncs, then resumes `kv_cache`, the tag the ReqToTokenPool is allocated under) and its graphs.
SYNC_FIELDS = {
    "vllm": ("weights_bytes", "non_torch_bytes", "cuda_graph_bytes"),
    "sglang": ("weights_bytes", "cuda_graph_bytes"),
}


def engine_items(engine: str, budget: VllmBudget, *, include: tuple[str, ...] | None = None) -> dict[str, int]:
    """The engine's memory items (all of them, or the fields named in `include`)."""
    return {name: getattr(budget, field) for name, field in _ITEMS[engine] if include is None or field in include}


def sglang_engine_budget(
    model: ModelSpec,
    *,
    utilization: float,
    tensor_parallel: int,
    max_num_seqs: int,
    cuda_graphs: bool,
    device_bytes: int,
    weight_bytes: int,
    overheads: Overheads,
    preexisting_bytes: int,
) -> VllmBudget:
    """SGLang's budget on one GPU in the shared view (module docstring)."""
    t = tensor_parallel
    b = sglang_budget(
        total_memory_bytes=device_bytes,
        preexisting_bytes=preexisting_bytes,
        mem_fraction_static=utilization,
        num_params=model.num_params,
        tensor_parallel=t,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes_per_token_per_gpu(model, t, weight_bytes),
        context_len=model.max_position_embeddings,
        max_running_requests=max_num_seqs,
        cuda_graph_max_bs=0,
        disable_cuda_graph=not cuda_graphs,
        chunked_prefill_size=0,
        forward_bytes_per_token=forward_bytes_per_token(
            hidden=model.hidden_size,
            q_dim=model.q_dim,
            kv_dim=model.kv_dim,
            intermediate=model.intermediate_size,
            tensor_parallel=t,
            compute_bytes=weight_bytes,
        ),
        vocab=model.vocab_size,
        sampler_bytes_per_vocab_entry=overheads.vllm_sampler_bytes_per_vocab_entry,
        cuda_graph_bytes_per_graph=overheads.vllm_cuda_graph_bytes_per_graph,
    )
    return VllmBudget(
        budget_bytes=b.static_bytes,
        weights_bytes=b.weights_bytes,
        activation_bytes=b.activation_bytes,
        non_torch_bytes=b.req_to_token_bytes,
        cuda_graph_bytes=b.cuda_graph_bytes,
        kv_signed_bytes=b.kv_signed_bytes,
    )


def sleep_leftovers(engine: str, budget: VllmBudget) -> dict[str, int]:
    """What a released engine keeps on the GPU between rollouts (verl's hybrid engine): SGLang's CUDA graphs
    (memory/sglang_budget.py `sglang_sleep_leftover_items`), vLLM's graphs and non-torch buffers."""
    if engine == "sglang":
        return {"sglang_cuda_graphs": budget.cuda_graph_bytes}
    return {"vllm_non_torch": budget.non_torch_bytes, "vllm_cuda_graphs": budget.cuda_graph_bytes}
