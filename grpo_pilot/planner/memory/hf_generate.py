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
