"""Memory of turning the last hidden states into per-token log-probs (and entropy): the logits.

`tokens` are the scored positions on the rank (`tokens.scored_tokens`: our engine and TRL score the
response positions only, verl every packed position), V vocab, h hidden, c compute bytes (2 on GPU,
4 on cpu). `entropy` is "none", "metric" (computed without a gradient) or "grad" (entropy bonus).

grpo-pilot, unfused (engine/algos/logprobs.py `token_logprobs` / `entropy_from_logits`: one autograd
  node each that keeps only the logits and a per-token logsumexp; float32 copies are formed k =
  min(T, UNFUSED_CHUNK_ELEMENTS // V) rows at a time, in forward and in backward). Peak bytes in units
  of V, measured with the engine's live-tensor tracker (engine/profiling.py, byte-exact) on the bare
  functions, V = 8192, T = 1024–4096, k = 512–T, bf16 and fp32 (the formulas below are within 2%):
  forward-only  c·T + 4·k (the logits, one float32 chunk); with the entropy metric c·T + 8·k (its p ⊙ x
                chunk beside the scaled copy).
  training      the larger of the forward moment above and the backward one: 2c·T + 4·k (the logits kept
                for backward, their gradient, one float32 chunk worked in place); with an entropy
                gradient max(2c·T + 8·k, 3c·T + 4·k) (two autograd nodes, two logits-sized gradients).
  The autograd chain this replaced (`logits.float() / T`, gather − logsumexp) held (c + 14)·T in
  training (16 bytes per element for bf16; issue 8: 10.43 GiB peak for 4096 tokens × 152k vocab).
grpo-pilot, fused (`chunked_token_logprobs`, chunks of FUSED_LOGPROB_CHUNK_TOKENS recomputed in
  backward; bare-function trace, T = 2048, chunk 512, V = 8192): per chunk element forward 12
  (+4 with entropy); backward c + 12 (+4 with an entropy gradient; re-traced on the current kernel with
  chunk 1024, V = 16384: 14 bytes per element for bf16); in training also the fp32 lm_head
  weight-gradient accumulator (4·V·h) and the hidden gradient (c·T·h), then, after the chunk loop, the
  accumulator's cast back (c·V·h when c ≠ 4) instead of the chunk buffers.
verl, unfused (volcengine/verl@b178a3cd5 verl/workers/actor/dp_actor.py `_forward_micro_batch` L262–277,
  `__init__` L81–89): the packed logits in the compute dtype, divided by the temperature in place, go
  through flash-attn's Triton cross-entropy (verl/utils/torch_functional.py `logprobs_from_logits`: lse per
  token only) with `inplace_backward=True` unless entropy is computed — the loss gradient is written into
  the logits buffer — and entropy through `torch.compile(entropy_from_logits)` (`use_torch_compile`
  defaults True; also in verl 0.1's dp_actor), whose fused reductions materialise no logits-sized tensor
  in the forward. So: forward c (with or without the entropy metric); training c; with an entropy gradient
  3c (the logits kept, the cross-entropy's own gradient buffer once it is not in place, the compiled
  entropy backward's gradient). verl's old-log-prob pass computes entropy (compute_log_prob(
  calculate_entropy=True)), its update only when entropy_coeff != 0. Not traced (flash-attn kernels do
  not run on cpu).
verl, padded (`model.use_remove_padding=False`, the knob `remove_padding`; dp_actor.py `_forward_micro_batch` "not
  using rmpad" branch: Jiayi-Pan/TinyZero@b19c457 verl/workers/actor/dp_actor.py L122–137 (verl 0.1),
  volcengine/verl@b178a3cd5 L346–375). The model returns the logits of every padded position [B, S, V] in the
  compute dtype (bf16 autocast; transformers 4.45's Qwen2ForCausalLM still called `.float()` on them, marked there
  for removal in v4.46, and 4.46+ does not; TinyZero pins transformers<4.48 beside vllm 0.6.3's
  >=4.45.2, which resolves to 4.47); they are divided by the temperature in place and sliced to the response [B, R,
  V] (a view: the full tensor stays alive while any saved tensor views it). F = B·S·V, R = B·R·V elements.
  Log-probs: flash-attn's cross-entropy on `reshape(-1, V)` of the view — a compute-dtype copy (c·R), saved, with a
  gradient of its own in verl 0.1 (`cross_entropy_loss` default inplace_backward=False) and in place since. Entropy
  (verl/utils/torch_functional.py `entropy_from_logits`: softmax, logsumexp, sum(pd·logits)) runs EAGERLY here (only
  the rmpad branch goes through torch.compile), under CUDA autocast: softmax runs with dtype=float32 (its fp32
  output pd saved), logsumexp is in autocast's fp32 list (the fp32 copy x of the logits is saved: logsumexp backward
  needs its input), pd·logits promotes to fp32. Traced on cpu (the casts autocast makes on CUDA made explicit,
  flash-attn's kernel replaced by an autograd function that saves the logits and the per-row lse:
  engine/profiling.py LiveTensorBytes, bf16, V = 4096, S/R = 1.5–6; tests/planner/test_verl_padded_logits.py):
  forward c·F + (c + 2·4 + x)·R (copy, pd, x, one fp32 temporary: the product, or logsumexp's own exp(x − max));
  backward, in the order autograd runs it, the product's backward c·F + (2c + 3·4 + x)·R (two fp32 gradients and the
  bf16 cast of one beside everything saved), then, with the full logits released, logsumexp's backward (2c + 5·4 +
  x)·R (grad · exp(x − lse): three fp32 temporaries beside the saved pd, x, copy, the pending softmax gradient and
  the view's bf16 gradient), and last the slice's zero-filled gradient beside the division's 2c·F. Bytes per
  response element for bf16: 14 + 2·S/R forward, 20 + 2·S/R and 28 backward. Without a gradient (old-log-prob pass,
  entropy as a metric): c·F + (2·4 + x)·R (pd, x, logsumexp's temporary; read, the temporary is inside logsumexp
  where no dispatch trace sees it). Without entropy: the copy (c·R) and, training, its gradient (verl 0.1's; in
  place since, so an upper bound by c·R) or the 2c·F slice moment. Entropy is computed in every update and log-prob
  pass before verl 25b0f2262 (#1100), since only with entropy_coeff != 0 (or calculate_entropy); the planner asks
  for it as `entropy` says.
verl, fused (`use_fused_kernels`, FusedLinearForPPOFunction, chunk_size 512): per chunk element
  forward c + 12 (fp32 logits, log-probs, probs); backward c + 20 (fp32 logits, probs, log-probs,
  one-hot, dlogits and the cast back) plus the lm_head weight gradient (c·V·h).
trl (GRPOTrainer ≥ 1.x always patches a fused LM head, trl/kernels/chunked_logprob.py): tiles of
  [TRL_TOKEN_TILE, TRL_VOCAB_TILE] in the compute dtype and 7 fp32 statistics per token; backward
  adds fp32 accumulators for the hidden gradient (4·T·h) and the whole lm_head gradient (4·V·h) and a
  compute-dtype copy of one weight chunk. Entropy comes from the same pass; `fused_logprob` changes
  nothing for trl.
"""

from __future__ import annotations

from grpo_pilot.kernels import FUSED_LOGPROB_CHUNK_TOKENS, UNFUSED_CHUNK_ELEMENTS
from grpo_pilot.planner.traits import LogitsKernel
from grpo_pilot.units import FP32_BYTES

VERL_FUSED_CHUNK_TOKENS = 512  # verl FusedLinearForPPOFunction.forward(chunk_size=512)
TRL_TOKEN_TILE = 4096  # trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE
TRL_VOCAB_TILE = 32768  # trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE
TRL_PER_TOKEN_STAT_BYTES = 7 * 4  # running max, sum-exp and five more fp32 vectors
FP32 = FP32_BYTES
ENTROPY_MODES = ("none", "metric", "grad")


def unfused_chunk_tokens(tokens: int, vocab: int) -> int:
    """Rows our unfused path turns into float32 at once (engine/algos/logprobs.py `logits_chunk_tokens`)."""
    return min(tokens, max(1, UNFUSED_CHUNK_ELEMENTS // max(1, vocab)))


def _ours_unfused(*, tokens: int, vocab: int, c: int, training: bool, entropy: str) -> int:
    """Peak bytes of our unfused log-prob (and entropy) path: the largest of its moments (module docstring)."""
    t, k = tokens * vocab, unfused_chunk_tokens(tokens, vocab) * vocab
    forward = c * t + (8 if entropy != "none" else 4) * k
    if not training:
        return forward
    if entropy == "grad":
        return max(forward, 2 * c * t + 8 * k, 3 * c * t + 4 * k)
    return max(forward, 2 * c * t + 4 * k)


def _verl_unfused(c: int, training: bool, entropy: str) -> int:
    """Bytes per logits element of verl's unfused path (module docstring)."""
    if training and entropy == "grad":
        return 3 * c
    return c


def _verl_padded(*, tokens: int, response_tokens: int, vocab: int, c: int, training: bool, entropy: str) -> int:
    """Peak bytes of verl's padded path on `tokens` padded positions, `response_tokens` of them the response
    slice the log-probs and entropy run on (module docstring)."""
    full, resp = tokens * vocab, min(response_tokens, tokens) * vocab
    x = FP32 if c != FP32 else 0  # autocast's fp32 copy of the logits for logsumexp
    if not training:
        if entropy == "none":
            return c * full + c * resp
        return c * full + max(c * resp, (2 * FP32 + x) * resp)
    slice_moment = 2 * c * full
    if entropy != "grad":
        return max(c * full + 2 * c * resp, slice_moment)
    forward = c * full + (c + 2 * FP32 + x) * resp
    product_backward = c * full + (2 * c + 3 * FP32 + x) * resp
    logsumexp_backward = (2 * c + 5 * FP32 + x) * resp
    return max(forward, product_backward, logsumexp_backward, slice_moment)


def _trl_bytes(*, tokens: int, vocab: int, hidden: int, c: int, training: bool) -> int:
    tile = c * min(tokens, TRL_TOKEN_TILE) * min(vocab, TRL_VOCAB_TILE)
    stats = TRL_PER_TOKEN_STAT_BYTES * tokens
    if not training:
        return tile + stats
    weight_chunk = c * min(vocab, TRL_VOCAB_TILE) * hidden
    return tile + stats + weight_chunk + FP32 * vocab * hidden + FP32 * tokens * hidden


def logprob_logits_bytes(
    tokens: int,
    vocab: int,
    hidden: int,
    compute_bytes: int,
    *,
    kernel: LogitsKernel,
    training: bool,
    fused: bool,
    entropy: str = "none",
    padded_response_tokens: int | None = None,
) -> int:
    """Peak bytes of the log-prob (and entropy) computation for `tokens` scored positions on one rank, with
    the executor's log-prob implementation (`ExecutorTraits.logits_kernel`). `padded_response_tokens`: verl's
    padded path (use_remove_padding False), the response positions among `tokens`."""
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy must be one of {ENTROPY_MODES}, got {entropy!r}")
    if tokens <= 0:
        return 0
    c = compute_bytes
    if kernel == "trl":
        return _trl_bytes(tokens=tokens, vocab=vocab, hidden=hidden, c=c, training=training)
    grad_hidden = c * tokens * hidden if training else 0
    if kernel == "verl":
        if not fused and padded_response_tokens is not None:
            padded = _verl_padded(
                tokens=tokens,
                response_tokens=padded_response_tokens,
                vocab=vocab,
                c=c,
                training=training,
                entropy=entropy,
            )
            return padded + grad_hidden
        if not fused:
            return tokens * vocab * _verl_unfused(c, training, entropy) + grad_hidden
        chunk = min(tokens, VERL_FUSED_CHUNK_TOKENS)
        if training:
            return chunk * vocab * (c + 5 * FP32) + c * vocab * hidden + grad_hidden
        return chunk * vocab * (c + 3 * FP32)
    if not fused:
        return _ours_unfused(tokens=tokens, vocab=vocab, c=c, training=training, entropy=entropy) + grad_hidden
    chunk = min(tokens, FUSED_LOGPROB_CHUNK_TOKENS)
    forward = 3 * FP32 + (FP32 if entropy != "none" else 0)
    if not training:
        return chunk * vocab * forward
    # traced (MemTracker on chunked_token_logprobs; N = 4096, V = 16384, h = 256, chunk 1024, bf16): 14 bytes
    # per chunk element in backward beside the accumulator and the hidden gradient (fp32 logits, their
    # softmax gradient in place, its compute-dtype cast, one fp32 transient)
    backward = c + 3 * FP32 + (FP32 if entropy == "grad" else 0)
    # the fp32 weight-gradient accumulator and the hidden gradient live through the chunk loop; the cast
    # back to the compute dtype runs after it (engine/algos/logprobs.py `_ChunkedLogProbs.backward`), so
    # it never coexists with the chunk buffers (traced: Qwen2.5-3B, 12k tokens, tied head)
    cast_back = c * vocab * hidden if c != FP32 else 0
    in_backward = FP32 * vocab * hidden + grad_hidden + max(chunk * vocab * backward, cast_back)
    return max(chunk * vocab * forward, in_backward)  # the forward's chunks come before any gradient


def logits_block_bytes(
    tokens: int,
    vocab: int,
    compute_bytes: int,
    *,
    kernel: LogitsKernel,
    fused: bool,
    padded_response_tokens: int | None = None,
) -> int:
    """The largest single block the log-prob computation allocates for `tokens` scored positions per rank —
    what the caching allocator must find anew for every micro-batch (planner/memory/allocator.py): the
    logits in the compute dtype on the unfused paths (on verl's padded path with entropy, the larger of
    them and the float32 [B, R, V] tensors of the eager entropy), one float32 chunk's logits on the fused
    ones, one tile for trl (module docstring)."""
    if tokens <= 0:
        return 0
    if kernel == "verl" and not fused and padded_response_tokens is not None:
        return max(compute_bytes * tokens, FP32 * min(padded_response_tokens, tokens)) * vocab
    if kernel == "trl":
        return compute_bytes * min(tokens, TRL_TOKEN_TILE) * min(vocab, TRL_VOCAB_TILE)
    if not fused:
        return compute_bytes * tokens * vocab
    chunk = VERL_FUSED_CHUNK_TOKENS if kernel == "verl" else FUSED_LOGPROB_CHUNK_TOKENS
    return FP32 * min(tokens, chunk) * vocab
