"""Rollout on the policy itself (rollout_backend = "hf": engine/rollout/decode.py's loop).

No second copy of the weights and no vLLM budget: the policy generates for a batch of
B = min(max_num_seqs, responses this rank owns per step) sequences, of which U are distinct prompts
(GRPO's n completions of a prompt are consecutive and of one length, so they stay together when the
engine sorts prompts by length: U = `shared_prompts.groups_spanned(B, n)`). The loop runs under
`torch.inference_mode` and, on a GPU, bf16 autocast (engine/rollout/hf.py `_generation_mode`). Per GPU,
the largest of three moments:

- decode, at the LM head: the KV cache of the batch, B × (prompt + response) × 2·L·kv_dim bytes per
  element (the Llama-family step's buffers, allocated once for the maximum lengths); the LM head's
  weight cast (c·V·h: under inference mode autocast caches no cast, pytorch#158232, so every projection
  casts its weight anew and only the one in use is live — the head is the largest); the step's logits
  and the previous step's, which the loop still holds (2·c·B·V, logits_to_keep = 1), and the call's
  sampling tables (every step's uniforms, N·B·4 bytes, and the EOS lookup, V + 1 bytes);
- decode, sampling: the KV cache, the logits and two fp32 [B, V] tensors (probabilities and their
  cumulative sum: B·V·(c + 8); top-p < 1 adds the sort, not counted here);
- prefill: the prefill's cache of the U distinct prompts (U × prompt tokens) and the prefill's working
  set, the larger of one layer's activations over U × prompt tokens (per token as in
  `vllm_budget.forward_bytes_per_token` with t = 1) and the LM head's cast with U rows of logits.

KV element size: when the fp32 policy decodes under autocast (one unsharded GPU rank) the cache is
float32 — the rotary embedding's cos/sin take the fp32 embedding output's dtype, so the rotated keys are
fp32, and transformers' DynamicCache creates its value buffer in the keys' dtype, into which
`torch.cat` promotes the bf16 values (cache_utils `DynamicLayer.lazy_initialization`); the Llama step
allocates its buffers like the prefill's (checked on torch 2.13 / transformers 5.19). Measured on one
H200 (tests/planner/gpu_measurements, three Qwen2.5 runs): the rollout phase's tensor peak was the
resident states + 2 × the bf16-sized cache + the LM head's cast + 2·c·B·V to within 5 MiB.
A bf16 replica (the sharded trainer's) keeps a bf16 cache.

The static loop (`hf_decode` = static / cuda_graph, `static_decode_memory`; engine/rollout/static_decode.py,
static_step.py) keeps, beside the same prefill:
- a copy of the weights in the step's dtype (`static_step.DecodeWeights`: on CUDA bf16 from the fp32 policy,
  2·P bytes, tied embeddings once; none when the weights already are in that dtype, as on the cpu device),
  built by `HFRollout.wake` in the weight-sync phase and dropped by `sleep` after the rollout: the weight_sync
  and rollout phases hold it;
- the step's K and V buffers, allocated once per decode call in that dtype: L layers × (K, V) × [B, kv_heads,
  W + N, head_dim] (`StaticStep._allocate`), i.e. B·(W + N)·2·L·kv_dim·c with c the step dtype's bytes — not
  the eager loop's fp32 cache;
- per call: the result ids [B, N] int64 and the uniforms [N, B] fp32 (12·B·N bytes), the key mask [B, W + N]
  bool and the EOS table (V + 1 bools);
- its moments: loading the prefill (`StaticStep.load_prefill`: the buffers, all allocated, beside the whole
  prefill cache, one layer's K gathered to B rows and the prefill's [B, V] logits), and each step's sampling
  (the step's [B, V] logits in c and two fp32 [B, V] tensors, as the eager loop's); the steps run outside
  autocast on the copy, so no weight is cast per step (the prefill, on the module under autocast, casts the LM
  head as the eager loop does);
- with CUDA graphs, one private memory pool shared by every graph of the call (cuda_graphs.StepGraphs: one
  graph per (rows, 128-slot length) captured on first use). What a capture allocates comes from that pool and
  stays reserved for the graph's replays after the capture's tensors are freed (PyTorch docs, notes/cuda.rst
  "Graph memory management": a graph's private pool is kept until the graph is deleted; graphs that never run
  concurrently and keep no outputs may share one pool, `pool=`), so the pool holds one step's largest
  temporaries — the first, widest batch's sampling tensors, B·V·(c + 8) — reserved, not allocated, for the
  whole call: an `overhead_` item (planner/reports.py: not a tensor; the allocator reports it as reserved, not
  allocated — the capture's allocations are the step's temporaries the decode moment already counts).
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.units import FP32_BYTES

FP32 = FP32_BYTES


class HfGenerate(NamedTuple):
    batch_seqs: int
    kv_cache_bytes: int  # the whole batch's cache
    kv_cache_tokens: int
    items: dict[str, int]  # the peak moment's working set, by report item


def hf_generate_memory(
    *,
    batch_seqs: int,
    prompt_seqs: int,
    prompt_tokens: int,
    response_tokens: int,
    kv_bytes_per_token: int,
    prefill_bytes_per_token: int,
    vocab: int,
    compute_bytes: int,
    head_cast_bytes: int,
) -> HfGenerate:
    """Memory of one decode call over `batch_seqs` rows of `prompt_seqs` distinct prompts (module docstring).
    `head_cast_bytes`: the LM head's weight cast under autocast (0 when the weights are in the compute dtype)."""
    c, rows = compute_bytes, batch_seqs
    tokens = rows * (prompt_tokens + response_tokens)
    kv = tokens * kv_bytes_per_token
    # the call's uniforms [N, B] fp32 and the EOS table (V + 1 bools) live through the whole loop
    tables = FP32 * rows * response_tokens + vocab + 1
    head = {"autocast_weight_cache": head_cast_bytes, "hf_sampling_logits": 2 * c * rows * vocab + tables}
    sampling = {"hf_sampling_logits": rows * vocab * (c + 2 * FP32) + tables}
    prefill_tokens = prompt_seqs * prompt_tokens
    prefill_kv = prefill_tokens * kv_bytes_per_token
    moments = [
        {"hf_kv_cache": kv, **head},
        {"hf_kv_cache": kv, **sampling},
        {"hf_kv_cache": prefill_kv, "hf_prefill_activations": prefill_tokens * prefill_bytes_per_token},
        {
            "hf_kv_cache": prefill_kv,
            "autocast_weight_cache": head_cast_bytes,
            "hf_sampling_logits": c * prompt_seqs * vocab,
        },
    ]
    names = ("hf_kv_cache", "hf_prefill_activations", "hf_sampling_logits", "autocast_weight_cache")
    best = max(moments, key=lambda m: sum(m.values()))
    return HfGenerate(rows, kv, tokens, {name: best.get(name, 0) for name in names})


class StaticDecode(NamedTuple):
    generate: HfGenerate  # the tensors' peak moment, as `hf_generate_memory`
    weight_copy_bytes: int  # the step's copy of the weights (weight_sync and rollout phases)
    graph_pool_bytes: int  # CUDA graphs' private pool, reserved through the call (0 without graphs)


def static_decode_memory(
    *,
    batch_seqs: int,
    prompt_seqs: int,
    prompt_tokens: int,
    response_tokens: int,
    kv_bytes_per_token: int,
    prefill_kv_bytes_per_token: int,
    layers: int,
    prefill_bytes_per_token: int,
    vocab: int,
    compute_bytes: int,
    head_cast_bytes: int,
    weight_copy_bytes: int,
    graphs: bool,
) -> StaticDecode:
    """Memory of one static decode call (module docstring). `kv_bytes_per_token`: the step's buffers (its
    dtype); `prefill_kv_bytes_per_token`: the prefill's cache (fp32 under autocast); `compute_bytes`: the step's
    dtype, which is also its logits'; `weight_copy_bytes`: the copy (0 when the weights are in the step dtype)."""
    c, rows = compute_bytes, batch_seqs
    total = prompt_tokens + response_tokens
    kv = rows * total * kv_bytes_per_token
    # result ids [B, N] int64 + uniforms [N, B] fp32, the key mask [B, W + N] bool, the EOS table
    tables = (8 + FP32) * rows * response_tokens + rows * total + vocab + 1
    prefill_tokens = prompt_seqs * prompt_tokens
    prefill_kv = prefill_tokens * prefill_kv_bytes_per_token
    one_layer_keys = rows * prompt_tokens * prefill_kv_bytes_per_token // (2 * layers)  # gathered to B rows
    step_temporaries = rows * vocab * (c + 2 * FP32)  # logits and two fp32 [B, V] tensors at sampling
    moments = [
        {"hf_kv_cache": kv, "hf_sampling_logits": step_temporaries + tables},
        {"hf_kv_cache": kv + prefill_kv + one_layer_keys, "hf_sampling_logits": c * rows * vocab + rows * total},
        {"hf_kv_cache": prefill_kv, "hf_prefill_activations": prefill_tokens * prefill_bytes_per_token},
        {
            "hf_kv_cache": prefill_kv,
            "autocast_weight_cache": head_cast_bytes,
            "hf_sampling_logits": c * prompt_seqs * vocab,
        },
    ]
    names = ("hf_kv_cache", "hf_prefill_activations", "hf_sampling_logits", "autocast_weight_cache")
    best = max(moments, key=lambda m: sum(m.values()))
    items = {"hf_decode_weight_copy": weight_copy_bytes, **{name: best.get(name, 0) for name in names}}
    return StaticDecode(HfGenerate(rows, kv, rows * total, items), weight_copy_bytes, step_temporaries if graphs else 0)
