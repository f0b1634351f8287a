"""Helpers shared by all rollout backends: prompt checks, EOS ids, and where a completion ends.

Both backends pass their raw generated ids through `finish_completion`, so EOS / stop-string /
length handling is the same whichever engine sampled the tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from grpo_pilot.engine.rollout.protocol import Generation, SamplingConfig
from grpo_pilot.errors import InputError

Decode = Callable[[Sequence[int]], str]


def eos_token_ids(tokenizer: Any, model: Any | None = None) -> tuple[int, ...]:
    """Sorted ids that end a completion: the tokenizer's EOS plus the model's generation_config EOS.

    HF `generation_config.eos_token_id` may be an int or a list (Qwen2.5-Instruct lists two); a
    tokenizer without EOS and a model without one give an `InputError`.
    """
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    extra = getattr(gen_cfg, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, Iterable):
        ids.update(int(i) for i in extra)
    if not ids:
        raise InputError(
            "The tokenizer has no end-of-sequence token, so completions could never stop before max_new_tokens.",
            "Set tokenizer.eos_token (e.g. '<|endoftext|>') or eos_token_id in the model's generation_config.",
        )
    return tuple(sorted(ids))


def make_decoder(tokenizer: Any) -> Decode:
    """`ids -> text` with special tokens skipped (what rewards and stop strings see)."""

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))

    return decode


def check_prompts(
    prompt_ids: list[list[int]], sampling: SamplingConfig, *, max_model_len: int, vocab_size: int
) -> None:
    """Raise `InputError` for an empty prompt, an id outside the vocabulary, or
    prompt + max_new_tokens > max_model_len."""
    for i, ids in enumerate(prompt_ids):
        if len(ids) == 0:
            raise InputError(
                f"Prompt {i} is empty (0 tokens).",
                "Every prompt needs at least one token; check the dataset and chat template.",
            )
        bad = [t for t in ids if not 0 <= int(t) < vocab_size]
        if bad:
            raise InputError(
                f"Prompt {i} holds token id {bad[0]}, outside the model's vocabulary of {vocab_size}.",
                "Use the tokenizer that belongs to the model (or build the model with vocab_size=len(tokenizer)).",
            )
        total = len(ids) + sampling.max_new_tokens
        if total > max_model_len:
            raise InputError(
                f"Prompt {i} has {len(ids)} tokens; with max_new_tokens={sampling.max_new_tokens} "
                f"that is {total} tokens, "
                f"over max_model_len={max_model_len}.",
                "Raise max_model_len (prompt_len_tokens + response_len_tokens), shorten prompts, "
                "or lower max_new_tokens.",
            )


def stop_cut(token_ids: Sequence[int], stop: Sequence[str], decode: Decode) -> int | None:
    """Tokens to keep so the completion ends with its first stop string, or None if none occurs.

    Finds the shortest prefix whose decoding contains any stop string, by bisection over the prefix
    length (a decoded prefix only grows as tokens are added, so "contains a stop string" is monotone):
    O(log L) decodes instead of L.
    """
    if not stop or not token_ids or not any(s in decode(token_ids) for s in stop):
        return None
    lo, hi = 1, len(token_ids)  # invariant: prefix of length hi contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(token_ids[:mid]) for s in stop):
            hi = mid
        else:
            lo = mid + 1
    return hi


def finish_completion(
    raw_ids: Sequence[int], *, eos_ids: Sequence[int], sampling: SamplingConfig, decode: Decode
) -> Generation:
    """Cut raw generated ids (may run past EOS, e.g. padding) at the first EOS or stop string.

    EOS is kept (the loss counts it); a stop string's tokens are kept. Anything else that reaches
    `max_new_tokens` ends with `finish_reason="length"`.
    """
    ids = [int(t) for t in raw_ids[: sampling.max_new_tokens]]
    eos = set(eos_ids)
    reason = "length"
    for pos, tok in enumerate(ids):
        if tok in eos:
            ids = ids[: pos + 1]
            reason = "stop"
            break
    body = ids[:-1] if reason == "stop" else ids  # stop strings are searched before the EOS only
    cut = stop_cut(body, sampling.stop, decode)
    if cut is not None:
        ids = body[:cut]
        reason = "stop"
    return Generation(token_ids=tuple(ids), text=decode(ids), finish_reason=reason)
