"""Per-token log-probabilities and entropies of sampled tokens, plain and in vocabulary-sized chunks.

Math (x = logits / temperature, over the vocabulary V, y the sampled token):
    log p(y) = x_y − logsumexp(x)              H = logsumexp(x) − Σ_v p_v x_v
    ∂ log p(y)/∂x = onehot(y) − p              ∂H/∂x = −p ⊙ (x − Σ_v p_v x_v)
The logits are divided by the sampling temperature before the softmax (as verl and TRL do), and the
softmax runs in float32 for bf16/fp16/fp32 models (float64 inputs stay float64, for tests).

Causal alignment (the caller's job): the log-prob of completion token t comes from the logits at
position t − 1, i.e. `token_logprobs(logits[:, P-1:-1], input_ids[:, P:])` for prompt length P.

`token_logprobs` / `entropy_from_logits` (the unfused path: the caller holds the logits) keep nothing
but the logits and a per-token logsumexp for backward: the float32 copy, softmax and gradient of the
softmax are formed `logits_chunk_tokens(V)` rows at a time, in forward and in backward, and the only
logits-sized buffer backward adds is the gradient of the logits in their own dtype. Peak per logits
element in training: the logits (c bytes) + their gradient (c bytes) + 8 bytes per element of one chunk,
against c + 14 per element for the plain autograd chain `logits.float() / T → gather − logsumexp`, which
keeps the float32 scaled copy for backward and forms two more in it (planner/memory/logits.py has the
measurements).

`chunked_token_logprobs` (the fused path) never materialises more than `chunk_tokens × V` logits at a
time, in the forward or the backward pass: a custom autograd function keeps only its inputs and
recomputes each chunk's logits in backward (the memory trick of fused linear cross-entropy kernels,
e.g. Liger's FLCE and TRL's fused LM head). Both paths give the values and gradients of the plain
autograd chain (tests compare them in float64).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo_pilot.errors import InputError
from grpo_pilot.kernels import UNFUSED_CHUNK_ELEMENTS

DEFAULT_CHUNK_TOKENS = 1024


def logits_chunk_tokens(vocab_size: int) -> int:
    """Rows of [N, V] logits the unfused path turns into float32 at once (UNFUSED_CHUNK_ELEMENTS elements;
    planner/memory/logits.py `unfused_chunk_tokens` models the same number)."""
    return max(1, UNFUSED_CHUNK_ELEMENTS // max(1, vocab_size))


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half/bfloat16/float32 logits, float64 for float64 ones."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_temperature(temperature: float) -> None:
    if not temperature > 0.0:
        raise InputError(
            f"Temperature must be > 0 to score log-probs, got {temperature}.",
            "Use the sampling temperature (1.0 for plain sampling).",
        )


def token_logprobs(logits: Tensor, target_ids: Tensor, *, temperature: float = 1.0) -> Tensor:
    """log p(target) in float32 (float64 for float64 logits), shape of `target_ids` [...], from `logits` [..., V].

    Lean: no full float32 copy of the logits is kept for backward (module docstring).
    """
    _check_temperature(temperature)
    if logits.shape[:-1] != target_ids.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match target_ids {tuple(target_ids.shape)} (+ vocab dim)"
        )
    flat = logits.reshape(-1, logits.shape[-1])
    logprobs, _ = _LogitsLogProbs.apply(
        flat, target_ids.reshape(-1).long(), float(temperature), logits_chunk_tokens(flat.shape[-1]), False
    )
    return logprobs.view(target_ids.shape)


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Entropy H of softmax(logits / temperature), shape [...] for `logits` [..., V]; float32 (float64 inputs: float64).

    Formed chunk by chunk like `token_logprobs`; differentiable (the entropy bonus) with the same lean backward.
    """
    _check_temperature(temperature)
    flat = logits.reshape(-1, logits.shape[-1])
    dummy_targets = torch.zeros(flat.shape[0], dtype=torch.long, device=flat.device)
    _, entropy = _LogitsLogProbs.apply(
        flat, dummy_targets, float(temperature), logits_chunk_tokens(flat.shape[-1]), True
    )
    return entropy.view(logits.shape[:-1])


def _scaled_rows(rows: Tensor, temperature: float) -> Tensor:
    """A softmax-dtype copy of `rows` / temperature (always a new tensor: callers work on it in place)."""
    dtype = _softmax_dtype(rows.dtype)
    scaled = rows.to(dtype, copy=True)
    return scaled.div_(temperature) if temperature != 1.0 else scaled


def _chunk_forward(scaled: Tensor, targets: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """(logsumexp [c], log p(target) [c], entropy [c] or None) of one chunk of scaled logits [c, V]."""
    lse = torch.logsumexp(scaled, dim=-1)
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        weighted = (scaled - lse.unsqueeze(-1)).exp_().mul_(scaled)  # p ⊙ x, one buffer
        entropy = lse - weighted.sum(dim=-1)
    return lse, picked, entropy


def _chunk_grad_scaled(
    *, scaled: Tensor, lse: Tensor, targets: Tensor, grad_logprobs: Tensor | None, grad_entropy: Tensor | None
) -> Tensor:
    """d objective / d scaled for one chunk [c, V]: g_lp · (onehot − p) + g_H · (−p ⊙ (x − E_p[x])).

    Works in place: `scaled` becomes the returned gradient (one more chunk buffer with an entropy gradient).
    """
    if grad_entropy is None:
        grad = scaled.sub_(lse.unsqueeze(-1)).exp_()  # p
        if grad_logprobs is None:
            return grad.zero_()
        g = grad_logprobs.to(grad.dtype).unsqueeze(-1)
        grad.mul_(g).neg_()
        return grad.scatter_add_(-1, targets.unsqueeze(-1), g)
    probs = (scaled - lse.unsqueeze(-1)).exp_()
    mean_x = torch.matmul(probs.unsqueeze(-2), scaled.unsqueeze(-1)).squeeze(-1)  # Σ_v p_v x_v, no [c, V] temporary
    grad = scaled.sub_(mean_x).mul_(probs).mul_(-grad_entropy.to(scaled.dtype).unsqueeze(-1))
    if grad_logprobs is not None:
        g = grad_logprobs.to(grad.dtype).unsqueeze(-1)
        grad.sub_(probs.mul_(g)).scatter_add_(-1, targets.unsqueeze(-1), g)
    return grad


class _LogitsLogProbs(torch.autograd.Function):
    """(logits [N, V], targets [N]) -> (logprobs [N], entropy [N]); saves the logits and logsumexp only."""

    @staticmethod
    def forward(
        ctx,
        logits: Tensor,
        targets: Tensor,
        temperature: float,  # type: ignore[override]
        chunk_tokens: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        num_tokens = logits.shape[0]
        out_dtype = _softmax_dtype(logits.dtype)
        logprobs = torch.empty(num_tokens, dtype=out_dtype, device=logits.device)
        entropy = torch.zeros(num_tokens, dtype=out_dtype, device=logits.device)
        lse = torch.empty(num_tokens, dtype=out_dtype, device=logits.device)
        for start in range(0, num_tokens, chunk_tokens):
            stop = min(start + chunk_tokens, num_tokens)
            scaled = _scaled_rows(logits[start:stop], temperature)
            lse[start:stop], logprobs[start:stop], ent = _chunk_forward(scaled, targets[start:stop], with_entropy)
            if ent is not None:
                entropy[start:stop] = ent
            del scaled, ent  # free this chunk before the next one is formed
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_tokens, ctx.with_entropy = temperature, chunk_tokens, with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None):  # type: ignore[override]
        logits, targets, lse = ctx.saved_tensors
        temperature, chunk_tokens = ctx.temperature, ctx.chunk_tokens
        grad_entropy = grad_entropy if ctx.with_entropy else None
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], chunk_tokens):
            stop = min(start + chunk_tokens, logits.shape[0])
            grad = _chunk_grad_scaled(
                scaled=_scaled_rows(logits[start:stop], temperature),
                lse=lse[start:stop],
                targets=targets[start:stop],
                grad_logprobs=grad_logprobs[start:stop] if grad_logprobs is not None else None,
                grad_entropy=grad_entropy[start:stop] if grad_entropy is not None else None,
            )
            if temperature != 1.0:
                grad.div_(temperature)
            grad_logits[start:stop] = grad
            del grad
        return grad_logits, None, None, None, None


def _no_autocast(tensor: Tensor) -> torch.autocast:
    """Autocast off: the head matmul runs in the inputs' dtype, identically in forward and recomputation."""
    return torch.autocast(device_type=tensor.device.type, enabled=False)


def _chunk_scaled_logits(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    """Softmax-dtype logits / temperature for one chunk: hidden [c, h] @ weight[V, h]^T in the inputs' dtype."""
    return (hidden @ weight.t()).to(_softmax_dtype(weight.dtype)) / temperature


class _ChunkedLogProbs(torch.autograd.Function):
    """(hidden [N, h], weight [V, h], targets [N]) -> (logprobs [N], entropy [N]); recomputes in backward."""

    @staticmethod
    def forward(
        ctx,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        temperature: float,  # type: ignore[override]
        chunk_tokens: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)  # an unused output (e.g. entropy) then gets None, not zeros
        num_tokens = hidden.shape[0]
        out_dtype = _softmax_dtype(weight.dtype)
        logprobs = torch.empty(num_tokens, dtype=out_dtype, device=hidden.device)
        entropy = torch.zeros(num_tokens, dtype=out_dtype, device=hidden.device)
        with _no_autocast(hidden):
            for start in range(0, num_tokens, chunk_tokens):
                stop = min(start + chunk_tokens, num_tokens)
                scaled = _chunk_scaled_logits(hidden[start:stop], weight, temperature)  # [c, V] float32
                _, logprobs[start:stop], ent = _chunk_forward(scaled, targets[start:stop], with_entropy)
                if ent is not None:
                    entropy[start:stop] = ent
        ctx.save_for_backward(hidden, weight, targets)
        ctx.temperature, ctx.chunk_tokens, ctx.with_entropy = temperature, chunk_tokens, with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: Tensor | None, grad_entropy: Tensor | None):  # type: ignore[override]
        hidden, weight, targets = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        temperature, chunk_tokens = ctx.temperature, ctx.chunk_tokens
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        # float32 accumulator for the weight gradient: summing chunk contributions in bf16 would lose bits.
        acc_dtype = _softmax_dtype(weight.dtype)
        grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_weight else None
        use_entropy = ctx.with_entropy and grad_entropy is not None
        with _no_autocast(hidden):
            _chunked_backward(
                hidden=hidden,
                weight=weight,
                targets=targets,
                temperature=temperature,
                chunk_tokens=chunk_tokens,
                grad_logprobs=grad_logprobs,
                grad_entropy=grad_entropy if use_entropy else None,
                grad_hidden=grad_hidden,
                grad_weight=grad_weight,
            )
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _chunked_backward(
    *,
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    temperature: float,
    chunk_tokens: int,
    grad_logprobs: Tensor | None,
    grad_entropy: Tensor | None,
    grad_hidden: Tensor | None,
    grad_weight: Tensor | None,
) -> None:
    """Fill `grad_hidden` [N, h] and accumulate `grad_weight` [V, h] chunk by chunk (recomputing the logits)."""
    for start in range(0, hidden.shape[0], chunk_tokens):
        stop = min(start + chunk_tokens, hidden.shape[0])
        h_chunk = hidden[start:stop]
        scaled = _chunk_scaled_logits(h_chunk, weight, temperature)
        grad_scaled = _chunk_grad_scaled(
            scaled=scaled,
            lse=torch.logsumexp(scaled, dim=-1),
            targets=targets[start:stop],
            grad_logprobs=grad_logprobs[start:stop] if grad_logprobs is not None else None,
            grad_entropy=grad_entropy[start:stop] if grad_entropy is not None else None,
        )
        grad_logits = (grad_scaled / temperature).to(weight.dtype)  # [c, V]
        if grad_hidden is not None:
            grad_hidden[start:stop] = grad_logits @ weight
        if grad_weight is not None:
            grad_weight.addmm_(grad_logits.t().to(grad_weight.dtype), h_chunk.to(grad_weight.dtype))


def chunked_token_logprobs(
    hidden: Tensor,
    lm_head_weight: Tensor,
    target_ids: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """(logprobs [N], entropy [N] or None) for `hidden` [N, h], `lm_head_weight` [V, h], `target_ids` [N].

    `hidden` are the final-norm hidden states at the positions that predict `target_ids` (already
    shifted). The head is bias-free (as in Llama/Qwen). Outputs are float32 (float64 for float64 inputs).
    The matmul runs in `lm_head_weight`'s dtype with autocast disabled (`hidden` is cast to it), so the
    recomputation in backward sees exactly the forward's numbers; under FSDP2 mixed precision the
    gathered head is already in the compute dtype. Gradients flow to `hidden` and
    `lm_head_weight`; peak extra memory is a few `chunk_tokens × V` float32 buffers plus a float32
    [V, h] weight-gradient accumulator in backward.
    """
    _check_temperature(temperature)
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise InputError(
            f"chunk_tokens must be a positive integer, got {chunk_tokens!r}.",
            "A few thousand tokens is typical (memory: chunk_tokens × vocab × 4 bytes).",
        )
    if hidden.dim() != 2 or lm_head_weight.dim() != 2 or hidden.shape[1] != lm_head_weight.shape[1]:
        raise ValueError(
            f"need hidden [N, h] and lm_head_weight [V, h]; got {tuple(hidden.shape)} and {tuple(lm_head_weight.shape)}"
        )
    if target_ids.shape != hidden.shape[:1]:
        raise ValueError(f"target_ids must be [N] with N = {hidden.shape[0]}, got {tuple(target_ids.shape)}")
    if hidden.dtype != lm_head_weight.dtype:  # e.g. fp32 hidden under autocast with a bf16 head, or the reverse
        hidden = hidden.to(lm_head_weight.dtype)
    logprobs, entropy = _ChunkedLogProbs.apply(
        hidden, lm_head_weight, target_ids.long(), float(temperature), chunk_tokens, bool(with_entropy)
    )
    return logprobs, (entropy if with_entropy else None)
