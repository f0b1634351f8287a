"""`hf` rollout: the policy module itself generates (any device, no second copy of the weights).

On one unsharded worker it samples from the very module the trainer updates (`shares_policy=True`),
so there are no weights to push and `sync_weights` is a no-op. Otherwise (the trainer's module is
FSDP-sharded across workers, or the rollout runs on its own worker) the backend owns a replica of the
model and `sync_weights(weights)` copies every (name, tensor) pair into it, refusing a sync that leaves
a parameter out.

Decoding: our own batched loops instead of transformers `generate`, whose per-token Python (logits
processors, stopping criteria, mask rebuilding, multinomial) outweighed a tiny model's forward several
times (benchmarks/engine_cpu.py); `decode` (run config `hf_decode`, else the plan's knob; `resolve_decode`) picks one:
- "eager" (`decode.decode_batch`): one prefill, then one forward per token with the model's KV cache,
  a host check per token (finished rows leave the batch), fp32 weights under bf16 autocast on CUDA;
- "static" / "cuda_graph" (`static_decode.decode_static`): the same prefill and completions, with a
  preallocated cache, fixed shapes, sampling and EOS on the device and a host look every 8 tokens; on
  CUDA the steps read a bf16 copy of the weights (`static_step.DecodeWeights`, 2 bytes per parameter:
  built or refreshed in place by `wake` in the weight-sync phase, dropped by `sleep` after the rollout;
  `weight_copy_bytes`, reported in profile.json) and "cuda_graph" replays each step as a CUDA graph;
- "auto" (default): cuda_graph on CUDA, eager on the CPU (where the eager loop is the faster one).
Llama-family models only for the static loops (llama_step, static_step); any other runs eager.
The module's own `generation_config` (e.g. a checkpoint's top_k or repetition_penalty) is never
consulted: sampling is exactly what `SamplingConfig` says (temperature, top-k, top-p); its
`eos_token_id` does end completions (`completion.eos_token_ids`).

Batching: prompts are sorted by length (less padding), left-padded and generated in chunks of at
most `max_num_seqs` rows; when `kv_cache_bytes` is given, a chunk also holds no more rows than
fit that KV-cache budget at `max prompt + max_new_tokens` tokens each. Results come back in the
caller's order. Sampling draws from a `torch.Generator` seeded with `sampling.seed`, so the
trainer's RNG stream is untouched and the same seed gives the same completions.

While decoding, the module is in eval mode (transformers' `GradientCheckpointingLayer` only
checkpoints when `self.training`, so checkpointing is off) under `torch.no_grad` (not inference
mode: buffers a forward may refresh must stay usable by autograd) — except for the Llama-family
models `llama_step` decodes with default RoPE, whose forward refreshes no buffer: those decode
under `torch.inference_mode` (no autograd bookkeeping per op; completions leave as Python ints), and on
CUDA the forward runs under bf16 autocast (the static loops: the prefill only); train mode is restored
afterwards and `config` is not touched (the KV cache is requested per call).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from grpo_pilot.engine.rollout.completion import check_prompts, eos_token_ids, finish_completion, make_decoder
from grpo_pilot.engine.rollout.decode import decode_batch
from grpo_pilot.engine.rollout.llama_step import unsupported_reason
from grpo_pilot.engine.rollout.protocol import Generation, SamplingConfig
from grpo_pilot.engine.rollout.static_decode import decode_static
from grpo_pilot.engine.rollout.static_step import DecodeWeights, table_unsupported
from grpo_pilot.errors import InputError, RunError
from grpo_pilot.kernels import HF_DECODE_MODES, device_decode_mode
from grpo_pilot.profiles.spec import kv_bytes_per_token as spec_kv_bytes_per_token

DECODE_MODES = HF_DECODE_MODES


def resolve_decode(mode: str, model: Any, device: torch.device) -> str:
    """The decode loop a call runs: "eager" (decode.py), "static" or "cuda_graph" (static_decode.py).

    auto = cuda_graph on CUDA, eager on CPU; cuda_graph off CUDA runs static (the same step, no graphs); a model
    the static step does not support (`static_step.table_unsupported`) runs eager whatever was asked."""
    if mode not in DECODE_MODES:
        raise InputError(f"Unknown hf decode mode {mode!r}.", f"Use one of {', '.join(DECODE_MODES)}.")
    return "eager" if table_unsupported(model) is not None else device_decode_mode(mode, device.type)


def rollout_dtype(model: Any, device: torch.device) -> torch.dtype:
    """The static step's weight dtype: bf16 on CUDA (a copy of fp32 weights), the model's own on the CPU."""
    return torch.bfloat16 if device.type == "cuda" else next(model.parameters()).dtype


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """K and V for one token over all layers: 2 × layers × kv_heads × head_dim × bytes.

    The standard full-attention KV size (vLLM's `FullAttentionSpec.page_size_bytes` per token).
    """
    heads = int(getattr(config, "num_attention_heads"))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    # one formula for planner and engine (profiles/spec.py): one GPU, no tensor parallelism
    return spec_kv_bytes_per_token(
        num_layers=int(config.num_hidden_layers),
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        tensor_parallel=1,
        kv_bytes=dtype_bytes,
    )


class _StopStringTail:
    """Stop check for `decode_batch`: a row is done once its last few generated tokens decode to a
    string that contains a stop string.

    Only the tail (longest stop string + 1 tokens, `window`) is decoded each step; the exact cut is
    made afterwards by `finish_completion`, so this only saves compute.
    """

    def __init__(self, stop: Sequence[str], tokenizer: Any) -> None:
        self.stop = tuple(stop)
        self.window = max(len(s) for s in stop) + 1
        self.tokenizer = tokenizer

    def __call__(self, tails: list[list[int]]) -> list[bool]:
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        return [any(s in t for s in self.stop) for t in texts]


def _refreshes_no_buffers(model: Any) -> bool:
    """True for the Llama-family decoders `llama_step` supports with default RoPE: their forward only
    reads parameters and buffers, so decoding them in inference mode leaves nothing autograd cannot use."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    return unsupported_reason(model) is None and getattr(rotary, "rope_type", None) == "default"


class HFRollout:
    """Rollout backend `hf`; see the module docstring for batching, RNG and mode handling."""

    name = "hf"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        max_model_len: int,
        max_num_seqs: int = 256,
        kv_cache_bytes: int | None = None,
        shares_policy: bool = True,
        decode: str = "auto",
    ) -> None:
        if max_model_len < 2 or max_num_seqs < 1 or (kv_cache_bytes is not None and kv_cache_bytes < 1):
            raise InputError(
                f"Invalid hf rollout limits: max_model_len={max_model_len}, max_num_seqs={max_num_seqs}, "
                f"kv_cache_bytes={kv_cache_bytes}.",
                "Use max_model_len >= 2, max_num_seqs >= 1 and a positive kv_cache_bytes (or None).",
            )
        self._model: torch.nn.Module | None = model
        self.shares_policy = shares_policy
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.kv_cache_bytes = kv_cache_bytes
        self.eos_ids = eos_token_ids(tokenizer, model)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        self._decode = make_decoder(tokenizer)
        if decode not in DECODE_MODES:
            raise InputError(f"Unknown hf decode mode {decode!r}.", f"Use one of {', '.join(DECODE_MODES)}.")
        self.decode = decode
        self._weights: DecodeWeights | None = None  # the static step's weights (a bf16 copy on CUDA), wake..sleep
        self.decode_stats: dict[str, Any] = {}  # the last generate's static-loop counts (steps, graph captures)

    # -- protocol -------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        model = self._live_model()
        check_prompts(
            prompt_ids,
            sampling,
            max_model_len=self.max_model_len,
            vocab_size=model.get_input_embeddings().num_embeddings,
        )
        if not prompt_ids:
            return []
        device = next(model.parameters()).device
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        rows = self.rows_per_chunk(max(len(p) for p in prompt_ids) + sampling.max_new_tokens, device)
        raw: dict[int, list[int]] = {}
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
        mode = resolve_decode(self.decode, model, device)
        # the static loops' weights: those `wake` prepared this step, else built here (outside inference mode)
        weights = (self._weights or self._static_weights(model, device)) if mode != "eager" else None
        self.decode_stats = {"mode": mode}
        with self._generation_mode(model, device):
            for start in range(0, len(order), rows):
                chunk = order[start : start + rows]
                outs = self._generate_chunk(
                    model,
                    prompts=[prompt_ids[i] for i in chunk],
                    sampling=sampling,
                    generator=generator,
                    weights=weights,
                    mode=mode,
                )
                raw.update(zip(chunk, outs))
        return [
            finish_completion(raw[i], eos_ids=self.eos_ids, sampling=sampling, decode=self._decode)
            for i in range(len(prompt_ids))
        ]

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (name, tensor) pairs into the replica; nothing to do when generating on the policy itself."""
        model = self._live_model()
        if self.shares_policy:
            return
        params = dict(model.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        with torch.no_grad():
            for name, tensor in weights:
                target = params.get(name)
                if target is None or target.shape != tensor.shape:
                    held = "does not have" if target is None else f"holds as {tuple(target.shape)}"
                    raise RunError(
                        f"Weight sync into the hf rollout replica got '{name}' {tuple(tensor.shape)}, "
                        f"which the replica {held}.",
                        "The trainer and the rollout replica must be built from the same model.",
                    )
                target.copy_(tensor)
                loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise RunError(
                f"Weight sync left {len(missing)} parameter(s) of the hf rollout replica stale: "
                f"{', '.join(missing[:5])}.",
                "Every parameter name (tied ones included) must be sent.",
            )

    def sleep(self) -> None:
        """Drop the static step's weight copy (the KV cache lives in one `generate` only); whether the allocator's
        cached blocks go back to the driver is the run's `release_cache` policy (engine/device_memory.py, called by
        the worker)."""
        self._live_model()
        self._weights = None

    def wake(self) -> None:
        """Before a rollout (the worker's weight-sync phase): build, or refresh in place, the static step's bf16
        copy of the weights from the module's current values (CUDA, static decode, fp32 module); else nothing."""
        model = self._live_model()
        device = next(model.parameters()).device
        if (
            resolve_decode(self.decode, model, device) != "eager"
            and rollout_dtype(model, device) != next(model.parameters()).dtype
        ):
            self._static_weights(model, device)

    def weight_copy_bytes(self, device: torch.device) -> int:
        """Bytes of the bf16 weight copy the static decode holds on `device` from wake to sleep (0: none)."""
        model = self._live_model()
        if resolve_decode(self.decode, model, device) == "eager":
            return 0
        dtype = rollout_dtype(model, device)
        return sum(p.numel() * dtype.itemsize for p in model.parameters() if p.dtype != dtype)

    def replica_bytes(self) -> int:
        """Bytes of the replica's parameters (tied ones once), resident from start to `close` (0: generating on the
        trainer's module, `shares_policy`); the planner's `hf_replica_weights` (planner/memory/hf_rollout.py)."""
        model = self._live_model()
        return 0 if self.shares_policy else sum(p.numel() * p.element_size() for p in model.parameters())

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

    def _static_weights(self, model: Any, device: torch.device) -> DecodeWeights:
        """The static step's weights: built on first use after a sleep, refreshed in place after that."""
        with torch.no_grad():
            if self._weights is None:
                self._weights = DecodeWeights(model, rollout_dtype(model, device))
            else:
                self._weights.refresh(model)
        return self._weights

    def _generate_chunk(
        self,
        model: Any,
        *,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generator: torch.Generator,
        weights: DecodeWeights | None,
        mode: str,
    ) -> list[list[int]]:
        """One decode over `prompts`; each row's generated ids (may run past its end with padding)."""
        stop = _StopStringTail(sampling.stop, self.tokenizer) if sampling.stop else None
        common: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            temperature=0.0 if sampling.greedy else sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            generator=generator,
            stop=stop,
            stop_window=stop.window if stop is not None else None,
        )
        if weights is None:
            return decode_batch(model, prompts, **common)
        return decode_static(model, weights, prompts, graphs=mode == "cuda_graph", stats=self.decode_stats, **common)

    @contextlib.contextmanager
    def _generation_mode(self, model: Any, device: torch.device) -> Iterator[None]:
        """Eval mode, inference mode (no grad), bf16 autocast on CUDA; train mode restored after."""
        was_training = model.training
        model.eval()
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
        try:
            with torch.inference_mode() if _refreshes_no_buffers(model) else torch.no_grad(), autocast:
                yield
        finally:
            model.train(was_training)
