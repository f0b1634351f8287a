"""Memory of turning the last hidden states into per-token log-probs (and entropy): the logits.

`tokens` are the scored positions on the rank (`tokens.scored_tokens`: our engine and TRL score the
response positions only, verl every packed position), V vocab, h hidden, c compute bytes (2 on GPU,
4 on cpu). `entropy` is "none", "metric" (computed without a gradient) or "grad" (entropy bonus).

grpo-pilot, unfused (engine/algos/logprobs.py `token_logprobs`: scaled = logits.float() / T, gather −
  logsumexp; `entropy_from_logits` after it). Peak bytes per logits element, traced with the FSDP2
  memory tracker inside the full model (Qwen2.5-1.5B/7B shapes, 2 layers, 2048–4096 scored tokens) and
  with MemTracker on the bare functions (bf16 and fp32):
  forward-only  c + 4 + 4 with bf16 logits (fp32 upcast and scaled copy coexist) = 10; c + 4 in fp32
                (the upcast is a no-op) = 8; with entropy c + 12.
  training      c + 14 (16 bf16: memory-model.md's HF figure is 14); the engine's update always
                computes entropy as a metric (+2: 18 traced) and with an entropy bonus c + 22 (24 traced).
grpo-pilot, fused (`chunked_token_logprobs`, chunks of FUSED_LOGPROB_CHUNK_TOKENS recomputed in
  backward; bare-function trace, T = 2048, chunk 512, V = 8192): per chunk element forward 12
  (+4 with entropy); backward c + 20 (+4 with an entropy gradient); in training also the fp32 lm_head
  weight-gradient accumulator (4·V·h), its cast back (c·V·h when c ≠ 4) and the hidden gradient (c·T·h).
verl, unfused (flash-attn triton cross_entropy, inplace_backward=True; verl/utils/torch_functional.py
  logprobs_from_logits): forward c (lse per token only); training 2c (logits held for backward and
  one logits-sized gradient buffer); entropy (entropy_from_logits: softmax, p·logits) forward + 2c,
  training + 4c. verl's old-log-prob pass computes entropy (compute_log_prob(calculate_entropy=True)),
  its update only when entropy_coeff != 0. Not traced (flash-attn kernels do not run on cpu).
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

from grpo_pilot.units import FP32_BYTES

FUSED_LOGPROB_CHUNK_TOKENS = 1024  # our engine's chunk: grpo_pilot.engine imports this constant
VERL_FUSED_CHUNK_TOKENS = 512  # verl FusedLinearForPPOFunction.forward(chunk_size=512)
TRL_TOKEN_TILE = 4096  # trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE
TRL_VOCAB_TILE = 32768  # trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE
TRL_PER_TOKEN_STAT_BYTES = 7 * 4  # running max, sum-exp and five more fp32 vectors
FP32 = FP32_BYTES
ENTROPY_MODES = ("none", "metric", "grad")


def _ours_unfused(c: int, training: bool, entropy: str) -> int:
    if training:
        return c + 14 + {"none": 0, "metric": 2, "grad": 8}[entropy]
    if entropy != "none":
        return c + 12
    return c + FP32 + (FP32 if c != FP32 else 0)


def _verl_unfused(c: int, training: bool, entropy: str) -> int:
    if training:
        return 2 * c + (4 * c if entropy == "grad" else 0)
    return c + (2 * c if entropy != "none" else 0)


def _trl_bytes(tokens: int, vocab: int, hidden: int, c: int, training: bool) -> int:
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
    target: str,
    *,
    training: bool,
    fused: bool,
    entropy: str = "none",
) -> int:
    """Peak bytes of the log-prob (and entropy) computation for `tokens` scored positions on one rank."""
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy must be one of {ENTROPY_MODES}, got {entropy!r}")
    if tokens <= 0:
        return 0
    c = compute_bytes
    if target == "trl":
        return _trl_bytes(tokens, vocab, hidden, c, training)
    grad_hidden = c * tokens * hidden if training else 0
    if target == "verl":
        if not fused:
            return tokens * vocab * _verl_unfused(c, training, entropy) + grad_hidden
        chunk = min(tokens, VERL_FUSED_CHUNK_TOKENS)
        if training:
            return chunk * vocab * (c + 5 * FP32) + c * vocab * hidden + grad_hidden
        return chunk * vocab * (c + 3 * FP32)
    if not fused:
        return tokens * vocab * _ours_unfused(c, training, entropy) + grad_hidden
    chunk = min(tokens, FUSED_LOGPROB_CHUNK_TOKENS)
    forward = 3 * FP32 + (FP32 if entropy != "none" else 0)
    if not training:
        return chunk * vocab * forward
    backward = c + 5 * FP32 + (FP32 if entropy == "grad" else 0)
    weight_grad = FP32 * vocab * hidden + (c * vocab * hidden if c != FP32 else 0)
    return chunk * vocab * max(forward, backward) + weight_grad + grad_hidden
