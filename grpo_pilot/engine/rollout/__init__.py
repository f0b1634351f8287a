"""Rollout backends behind one protocol (`RolloutBackend`), and `build_rollout` to pick one.

- `hf`: our batched decode loop (`decode.py`, `llama_step.py`) on the policy module itself (`hf.HFRollout`);
- `vllm`: an in-process vLLM V1 engine with weight sync from the policy (`vllm_backend.VLLMRollout`).

vLLM is imported only when the `vllm` backend is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_pilot.engine.rollout.hf import HFRollout
from grpo_pilot.engine.rollout.protocol import BackendName, FinishReason, Generation, RolloutBackend, SamplingConfig
from grpo_pilot.engine.rollout.vllm_backend import VLLMRollout
from grpo_pilot.errors import InputError

__all__ = ["BackendName", "FinishReason", "Generation", "RolloutBackend", "SamplingConfig", "build_rollout"]


def build_rollout(
    name: BackendName,
    model: Any,
    tokenizer: Any,
    *,
    max_model_len: int,
    gpu_memory_utilization: float,
    tensor_parallel_size: int = 1,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    enforce_eager: bool = True,
    kv_cache_bytes: int | None = None,
    seed: int = 0,
    workdir: Path | None = None,
    hf_decode: str = "auto",
) -> RolloutBackend:
    """The rollout backend `name` for `model` (a transformers causal LM) and its tokenizer.

    `max_model_len` bounds prompt + completion tokens. `gpu_memory_utilization`,
    `max_num_batched_tokens`, `enforce_eager`, `seed` and `workdir` (where the policy directory
    vLLM starts from is written; a temp dir when None) only matter to `vllm`; `hf_decode` (hf.DECODE_MODES)
    only to `hf`. `max_num_seqs` caps
    concurrent sequences (hf: rows per decode batch); `kv_cache_bytes` sizes the KV cache (vllm)
    or caps rows per call (hf). The `vllm` backend needs the caller's script to guard its entry
    point with `if __name__ == "__main__":`.
    """
    if name == "hf":
        if tensor_parallel_size != 1:
            raise InputError(
                f"The hf rollout backend generates on the policy module itself; "
                f"tensor_parallel_size={tensor_parallel_size} does not apply.",
                "Use rollout_tp=1 with rollout_backend='hf'.",
            )
        return HFRollout(
            model,
            tokenizer,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            kv_cache_bytes=kv_cache_bytes,
            decode=hf_decode,
        )
    if name == "vllm":
        return VLLMRollout(
            model,
            tokenizer,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enforce_eager=enforce_eager,
            kv_cache_bytes=kv_cache_bytes,
            seed=seed,
            workdir=workdir,
        )
    raise InputError(f"Unknown rollout backend {name!r}.", "Use 'hf' or 'vllm'.")
