"""Kernel constants the engine runs with and the planner models: one home both sides import.

- FUSED_LOGPROB_CHUNK_TOKENS: rows per chunk of our fused (chunked, recomputed in backward) log-prob
  kernel (engine/algos/logprobs.py `chunked_token_logprobs`; planner/memory/logits.py sizes its buffers).
- UNFUSED_CHUNK_ELEMENTS: our unfused log-prob path forms float32 logits this many elements at a time
  (engine/algos/logprobs.py `logits_chunk_tokens`).
- LLAMA_FAMILY_MODEL_TYPES: the model types our lean decode step and shared-prompt forward run
  (engine/rollout/llama_step.py `unsupported_reason`, engine/shared_prefix.py; planner/memory/shared_prompts.py).
- HF_DECODE_MODES, `device_decode_mode`: the hf rollout's decode loops (run config / plan knob `hf_decode`) and
  which one a mode runs on a device type (engine/rollout/hf.py `resolve_decode`; planner/memory/hf_generate.py
  `planned_decode_mode`, planner/rollout_time.py).
- STATIC_CHECK_EVERY_STEPS, STATIC_LENGTH_BUCKET_TOKENS: the static decode loop's host look every 8 tokens and
  its attended length rounded up to 128 slots, i.e. one CUDA graph per (rows, 128-token bucket)
  (engine/rollout/static_decode.py; planner/rollout_time.py counts its captures).
"""

from __future__ import annotations

FUSED_LOGPROB_CHUNK_TOKENS = 1024
UNFUSED_CHUNK_ELEMENTS = 1 << 24
LLAMA_FAMILY_MODEL_TYPES = ("llama", "qwen2", "qwen3")
HF_DECODE_MODES = ("auto", "eager", "static", "cuda_graph")
STATIC_CHECK_EVERY_STEPS = 8  # host looks (one sync) per 8 tokens: <= 7 wasted steps at the end, 1/8 of the syncs
STATIC_LENGTH_BUCKET_TOKENS = 128  # attended slots round up to this: <= 127 masked slots read per row and step


def device_decode_mode(mode: str, device_type: str) -> str:
    """The loop `mode` runs on a `device_type` ("cuda" / "cpu") for a model the static step supports: auto =
    cuda_graph on CUDA, eager elsewhere (where the eager loop is the faster one); cuda_graph off CUDA runs static
    (the same step without graphs). `mode` must be one of HF_DECODE_MODES."""
    if mode == "eager" or (mode == "auto" and device_type != "cuda"):
        return "eager"
    if mode in ("auto", "cuda_graph"):
        return "cuda_graph" if device_type == "cuda" else "static"
    return "static"
