"""Kernel constants the engine runs with and the planner models: one home both sides import.

- FUSED_LOGPROB_CHUNK_TOKENS: rows per chunk of our fused (chunked, recomputed in backward) log-prob
  kernel (engine/algos/logprobs.py `chunked_token_logprobs`; planner/memory/logits.py sizes its buffers).
- UNFUSED_CHUNK_ELEMENTS: our unfused log-prob path forms float32 logits this many elements at a time
  (engine/algos/logprobs.py `logits_chunk_tokens`).
- LLAMA_FAMILY_MODEL_TYPES: the model types our lean decode step and shared-prompt forward run
  (engine/rollout/llama_step.py `unsupported_reason`, engine/shared_prefix.py; planner/memory/shared_prompts.py).
"""

from __future__ import annotations

FUSED_LOGPROB_CHUNK_TOKENS = 1024
UNFUSED_CHUNK_ELEMENTS = 1 << 24
LLAMA_FAMILY_MODEL_TYPES = ("llama", "qwen2", "qwen3")
