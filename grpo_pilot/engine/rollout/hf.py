"""`hf` rollout: transformers `generate` on the policy module itself (any device, no second copy).

Because it samples from the very module the trainer updates, there are no weights to push:
`sync_weights(model)` only switches to `model` when the caller hands over a different module object
(e.g. after wrapping it), and is a no-op for the same object.

Batching: prompts are sorted by length (less padding), left-padded and generated in chunks of at
most `max_num_seqs` rows; when `kv_cache_bytes` is given, a chunk also holds no more rows than
fit that KV-cache budget at `max prompt + max_new_tokens` tokens each. Results come back in the
caller's order. Sampling runs under a forked RNG seeded with `sampling.seed`, so the trainer's RNG
stream is untouched and the same seed gives the same completions.

During `generate` the module is put in eval mode (transformers' `GradientCheckpointingLayer` only
checkpoints when `self.training`, so checkpointing is off), the KV cache is on, and on CUDA the
forward runs under bf16 autocast; train mode, `config.use_cache` and the module's own
`generation_config` are restored afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from grpo_pilot.engine.rollout.completion import check_prompts, eos_token_ids, finish_completion, make_decoder
from grpo_pilot.engine.rollout.protocol import Generation, SamplingConfig
from grpo_pilot.errors import InputError, RunError


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """K and V for one token over all layers: 2 × layers × kv_heads × head_dim × bytes.

    The standard full-attention KV size (vLLM's `FullAttentionSpec.page_size_bytes` per token).
    """
    heads = int(getattr(config, "num_attention_heads"))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return 2 * int(config.num_hidden_layers) * kv_heads * head_dim * dtype_bytes


class _StopStringTail:
    """Stopping criterion: a row is done once its last few generated tokens decode to a stop string.

    Only the tail (longest stop string + 1 tokens) is decoded each step; the exact cut is made
    afterwards by `finish_completion`, so this only saves compute.
    """

    def __init__(self, stop: Sequence[str], prompt_width: int, tokenizer: Any) -> None:
        self.stop = tuple(stop)
        self.prompt_width = prompt_width
        self.window = max(len(s) for s in stop) + 1
        self.tokenizer = tokenizer

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        tails = input_ids[:, max(self.prompt_width, input_ids.shape[1] - self.window) :].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        done = [any(s in t for s in self.stop) for t in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class HFRollout:
    """Rollout backend `hf`; see the module docstring for batching, RNG and mode handling."""

    name = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, max_model_len: int, max_num_seqs: int = 256, kv_cache_bytes: int | None = None) -> None:
        if max_model_len < 2 or max_num_seqs < 1 or (kv_cache_bytes is not None and kv_cache_bytes < 1):
            raise InputError(
                f"Invalid hf rollout limits: max_model_len={max_model_len}, max_num_seqs={max_num_seqs}, kv_cache_bytes={kv_cache_bytes}.",
                "Use max_model_len >= 2, max_num_seqs >= 1 and a positive kv_cache_bytes (or None).",
            )
        self._model: torch.nn.Module | None = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.kv_cache_bytes = kv_cache_bytes
        self.eos_ids = eos_token_ids(tokenizer, model)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        self._decode = make_decoder(tokenizer)

    # -- protocol -------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        model = self._live_model()
        check_prompts(prompt_ids, sampling, max_model_len=self.max_model_len, vocab_size=model.get_input_embeddings().num_embeddings)
        if not prompt_ids:
            return []
        device = next(model.parameters()).device
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        rows = self.rows_per_chunk(max(len(p) for p in prompt_ids) + sampling.max_new_tokens, device)
        raw: dict[int, list[int]] = {}
        with self._generation_mode(model, device), _forked_rng(device, sampling.seed):
            for start in range(0, len(order), rows):
                chunk = order[start : start + rows]
                outs = self._generate_chunk(model, [prompt_ids[i] for i in chunk], sampling, device)
                raw.update(zip(chunk, outs))
        return [finish_completion(raw[i], eos_ids=self.eos_ids, sampling=sampling, decode=self._decode) for i in range(len(prompt_ids))]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Generation already uses the policy's live parameters; only adopt a different module object."""
        self._live_model()
        if model is not self._model:
            self._model = model

    def sleep(self) -> None:
        """Return the generation KV cache blocks held by the CUDA caching allocator; nothing to do on CPU."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def wake(self) -> None:
        """Nothing to restore: the KV cache is allocated again by the next `generate`."""
        self._live_model()

    def close(self) -> None:
        self._model = None

    # -- internals ------------------------------------------------------------------------------
    def rows_per_chunk(self, seq_len_tokens: int, device: torch.device) -> int:
        """Rows per `generate` call: `max_num_seqs`, capped by the KV budget when one is set."""
        if self.kv_cache_bytes is None:
            return self.max_num_seqs
        model = self._live_model()
        dtype_bytes = 2 if device.type == "cuda" else next(model.parameters()).element_size()
        per_seq = kv_bytes_per_token(model.config, dtype_bytes) * seq_len_tokens
        return max(1, min(self.max_num_seqs, self.kv_cache_bytes // per_seq))

    def _live_model(self) -> torch.nn.Module:
        if self._model is None:
            raise RunError("The hf rollout backend was closed.", "Build a new backend with build_rollout('hf', ...).")
        return self._model

    def _generate_chunk(self, model: Any, prompts: list[list[int]], sampling: SamplingConfig, device: torch.device) -> list[list[int]]:
        """Left-pad `prompts`, run one `model.generate`, return each row's generated ids (may include padding)."""
        from transformers import GenerationConfig, StoppingCriteriaList

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p) :] = 1
        sample = not sampling.greedy
        cfg = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=sample,
            temperature=sampling.temperature if sample else None,
            top_p=sampling.top_p if sample else None,
            top_k=0 if sample else None,  # transformers' global default is top_k=50; our sampling is temperature + top-p only
            pad_token_id=self.pad_id,
            eos_token_id=list(self.eos_ids),
            use_cache=True,
        )
        criteria = StoppingCriteriaList([_StopStringTail(sampling.stop, width, self.tokenizer)]) if sampling.stop else None
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=cfg, stopping_criteria=criteria)
        return out[:, width:].tolist()

    @contextlib.contextmanager
    def _generation_mode(self, model: Any, device: torch.device) -> Iterator[None]:
        """Eval mode, KV cache on, neutral generation_config, no grad, bf16 autocast on CUDA; restore after."""
        from transformers import GenerationConfig

        was_training = model.training
        config = getattr(model, "config", None)
        old_use_cache = getattr(config, "use_cache", None)
        old_gen_cfg = getattr(model, "generation_config", None)
        model.eval()
        if config is not None:
            config.use_cache = True
        if old_gen_cfg is not None:
            # A checkpoint's generation_config.json (e.g. top_k=20, repetition_penalty=1.05) would be
            # merged into ours by transformers; the rollout must sample exactly as SamplingConfig says.
            model.generation_config = GenerationConfig()
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
        try:
            with torch.no_grad(), autocast:
                yield
        finally:
            if old_gen_cfg is not None:
                model.generation_config = old_gen_cfg
            if config is not None:
                config.use_cache = old_use_cache
            model.train(was_training)


@contextlib.contextmanager
def _forked_rng(device: torch.device, seed: int) -> Iterator[None]:
    """Seed torch's RNG for sampling without disturbing the caller's stream."""
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
