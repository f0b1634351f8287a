"""The traced method for the HF rollout on the policy itself: the engine's decode loop on fake tensors.

`trace_hf_decode` runs engine/rollout/decode.py `decode_batch` — the prefill of the distinct prompts,
then one step per new token through the Llama-family step (engine/rollout/llama_step.py) — over the
fp32 policy, built in the fake mode on `cpu`, exactly as `HFRollout._generation_mode` runs it on a GPU:
eval mode, `torch.inference_mode`, bf16 autocast with CUDA's cast policy (`verify/cuda_autocast.py`),
and reads the peak of torch's `MemTracker` (autocast's parameter casts labelled apart,
`verify/single_rank.py`). Prompts come in GRPO groups (`group_size` copies of each, prefilled once).

Host syncs: the loop reads how many rows finished once per step; the fake mode answers 1
(`fake_trace.host_sync_fake_mode`), which never triggers a compaction for 8 rows or more (a compaction
needs a quarter of the batch finished) — the decode's peak is at full batch anyway. The completions
themselves are not materialised (fake tensors have no values).

`decode="static"` traces engine/rollout/static_decode.py `decode_static` instead, as the engine runs it on a
GPU: the same prefill under autocast, then the steps outside autocast on a bf16 copy of the weights
(static_step.DecodeWeights, built inside the trace, as `HFRollout.wake` builds it before the rollout) into
bf16 K/V buffers; without CUDA graphs (a graph replays the same step; its pool is reserved, not allocated,
memory: planner/memory/hf_generate.py). Its one host look answers "every row finished" (the placeholder
True): keep `new_tokens` below `kernels.STATIC_CHECK_EVERY_STEPS` so that every step runs.

Checked against one H200 (tests/planner/gpu_measurements, Qwen2.5-0.5B run, 64 rows of 62 + 256
tokens): the traced peak above the weights, 812,935,168 bytes, was the measured rollout peak above the
phase before it (813,292,544 bytes) to 0.04 %.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.verify.cuda_autocast import cuda_autocast_policy
from grpo_pilot.verify.fake_trace import (
    gpu_attention_masks,
    hf_config_from_spec,
    host_sync_fake_mode,
    reset_module_stats_on_root_forward,
    reset_peak,
    snapshot_labels,
    tracker_adjustments,
)
from grpo_pilot.verify.single_rank import build_fake_model, cast_labelling_tracker

DECODES = ("eager", "static")
MIN_ROWS = 8  # below, the placeholder finished count (1) would trigger a compaction


class DecodeTrace(Frozen):
    """The decode loop's peak on one GPU, by memory-tracker label."""

    model_name: str
    batch_seqs: int = Field(ge=MIN_ROWS)
    group_size: int = Field(ge=1)
    prompt_len_tokens: int = Field(ge=1)
    new_tokens: int = Field(ge=1)
    decode: str = Field(default="eager", description="'eager' (decode_batch) or 'static' (decode_static).")
    peak_bytes: int = Field(ge=0)
    labels: dict[str, int] = Field(description="MemTracker label -> bytes at the peak; sums to peak_bytes.")
    trace_s: float = Field(ge=0.0)


def trace_hf_decode(
    model_spec: ModelSpec,
    *,
    batch_seqs: int,
    group_size: int,
    prompt_len_tokens: int,
    new_tokens: int,
    decode: str = "eager",
) -> DecodeTrace:
    """Trace one `decode_batch` (or, `decode="static"`, one `decode_static`) over `batch_seqs` rows (module
    docstring), CUDA numerics."""
    if batch_seqs < MIN_ROWS or group_size < 1 or prompt_len_tokens < 1 or new_tokens < 1 or decode not in DECODES:
        raise InputError(
            f"The decode trace needs >= {MIN_ROWS} rows, positive lengths and a decode of {DECODES} (got "
            f"{batch_seqs} rows, group {group_size}, {prompt_len_tokens}+{new_tokens} tokens, decode {decode!r}).",
            f"Trace at least {MIN_ROWS} rows with decode 'eager' or 'static'.",
        )
    import torch

    from grpo_pilot.engine.rollout.decode import decode_batch

    started = time.perf_counter()
    vocab = model_spec.vocab_size
    prompts = [
        [(row // group_size * prompt_len_tokens + j) % (vocab - 1) + 1 for j in range(prompt_len_tokens)]
        for row in range(batch_seqs)
    ]
    with warnings.catch_warnings(), tracker_adjustments(), gpu_attention_masks(), host_sync_fake_mode():
        warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
        with cuda_autocast_policy():
            model = build_fake_model(hf_config_from_spec(model_spec)).eval()
            tracker = cast_labelling_tracker()
            tracker.track_external(model)
            # the step calls submodules directly, one top-level call after another
            hook = reset_module_stats_on_root_forward(tracker, tuple(model.modules()))
            try:
                with tracker, torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
                    reset_peak(tracker)
                    if decode == "static":
                        _decode_static(model, prompts, new_tokens)
                    else:
                        _decode(decode_batch, model, prompts, new_tokens)
                    labels = snapshot_labels(tracker.get_tracker_snapshot("peak"))
            finally:
                hook.remove()
    return DecodeTrace(
        model_name=model_spec.name,
        batch_seqs=batch_seqs,
        group_size=group_size,
        prompt_len_tokens=prompt_len_tokens,
        new_tokens=new_tokens,
        decode=decode,
        peak_bytes=sum(labels.values()),
        labels=labels,
        trace_s=time.perf_counter() - started,
    )


def _decode(decode_batch: Any, model: Any, prompts: list[list[int]], new_tokens: int) -> None:
    import torch

    decode_batch(
        model,
        prompts,
        max_new_tokens=new_tokens,
        eos_ids=[0],
        pad_id=0,
        temperature=1.0,
        top_p=1.0,
        generator=torch.Generator().manual_seed(0),
    )


def _decode_static(model: Any, prompts: list[list[int]], new_tokens: int) -> None:
    """The static loop as on a GPU: the bf16 weight copy, then `decode_static` without graphs (module docstring)."""
    import torch

    from grpo_pilot.engine.rollout.static_decode import decode_static
    from grpo_pilot.engine.rollout.static_step import DecodeWeights

    weights = DecodeWeights(model, torch.bfloat16)
    decode_static(
        model,
        weights,
        prompts,
        max_new_tokens=new_tokens,
        eos_ids=[0],
        pad_id=0,
        temperature=1.0,
        top_p=1.0,
        generator=torch.Generator().manual_seed(0),
    )
