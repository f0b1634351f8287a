"""The clipped GRPO policy loss with its variants: clip-higher, dual clip, GSPO, KL and entropy terms.

Shapes: `logprobs` (with grad), `old_logprobs`, `ref_logprobs`, `mask`, `entropy` [B, T] over the
completion tokens; `advantages` [B] (one per completion, broadcast over its tokens) or [B, T].
Padded positions must hold finite numbers (they are multiplied by mask 0).

Per token, with ρ = exp(clamp(log π_θ − log π_old, ±log_ratio_clamp)) and advantage Â
(PPO, arXiv 1707.06347; GRPO, arXiv 2402.03300 eq. 3):

    ℓ_pg = max(−Â·ρ, −Â·clip(ρ, 1 − clip_low, 1 + clip_high))          (= −min(ρÂ, clip(ρ)Â))
    dual clip (verl `clip_ratio_c`, arXiv 1912.09729), for Â < 0 only:  ℓ_pg = min(ℓ_pg, −c·Â)

- clip-higher (DAPO, arXiv 2503.14476): clip_low 0.2, clip_high 0.28.
- `ratio_level="sequence"` is GSPO (arXiv 2507.18071): one ratio per completion,
  s_i = exp(Σ_t m·log ρ_t / Σ_t m), clipped like ρ (the paper uses 3e-4 / 4e-4), broadcast over the
  completion's tokens before aggregation (TRL `importance_sampling_level="sequence"`; equal in value and
  gradient to verl's GSPO-token form with sequence-constant advantages).
- KL (when `ref_logprobs` is given): per-token estimator `kl_type` (k1, k2, k3/low_var_kl with verl's
  clamps, see `kl.py`); `loss += kl_coef · aggregate(kl)`. verl `use_kl_loss/kl_loss_coef`, TRL `beta`.
- Entropy bonus (when `entropy_coeff` ≠ 0): `loss −= entropy_coeff · aggregate(entropy)`, aggregated with
  the same mode as the policy term (verl `entropy_coeff`; TRL always uses the token mean).
- Aggregation and the global denominators for micro-batches: `aggregation.aggregate`.
- The log-ratio clamp (±20) is verl's (`compute_policy_loss_vanilla`); TRL has none (None disables it).

On-policy (one update per rollout batch, old = logprobs.detach()): ρ ≡ 1, so the loss value is
−(aggregate of Â) — ≈ 0 for group-normalised advantages — while the gradient is Σ −Â·∇log π ≠ 0.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

from grpo_pilot.engine.algos.aggregation import aggregate, check_agg_mode, masked_mean
from grpo_pilot.engine.algos.kl import canonical_kl_type, kl_penalty
from grpo_pilot.errors import InputError

RatioLevel = Literal["token", "sequence"]
VERL_LOG_RATIO_CLAMP = 20.0  # verl core_algos.compute_policy_loss_vanilla: clamp(log_ratio, -20, 20)


def _check_settings(
    *,
    loss_agg_mode: str,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
    ratio_level: str,
    kl_coef: float,
    kl_type: str,
    log_ratio_clamp: float | None,
) -> None:
    check_agg_mode(loss_agg_mode)
    canonical_kl_type(kl_type)
    if not 0.0 <= clip_low < 1.0:
        raise InputError(f"clip_low must be in [0, 1), got {clip_low}.", "Typical: 0.2 (PPO/GRPO); GSPO uses 3e-4.")
    if not clip_high >= 0.0:
        raise InputError(f"clip_high must be >= 0, got {clip_high}.", "Typical: 0.2, or 0.28 for DAPO clip-higher.")
    if clip_c is not None and not clip_c > 1.0:
        raise InputError(
            f"Dual-clip constant clip_c must be > 1, got {clip_c}.", "verl's default is 3.0; None disables dual clip."
        )
    if ratio_level not in ("token", "sequence"):
        raise InputError(f"Unknown ratio_level '{ratio_level}'.", "Use 'token' (PPO/GRPO) or 'sequence' (GSPO).")
    if not kl_coef >= 0.0:
        raise InputError(f"kl_coef must be >= 0, got {kl_coef}.", "Use 0 to disable the KL loss (typical: 0.001).")
    if log_ratio_clamp is not None and not log_ratio_clamp > 0.0:
        raise InputError(f"log_ratio_clamp must be > 0 or None, got {log_ratio_clamp}.", "verl uses 20.")


def _check_shapes(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logprobs: Tensor | None,
    entropy: Tensor | None,
) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for name, tensor in (
        ("old_logprobs", old_logprobs),
        ("mask", mask),
        ("ref_logprobs", ref_logprobs),
        ("entropy", entropy),
    ):
        if tensor is not None and tensor.shape != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)} like logprobs")
    if advantages.shape not in ((shape[0],), (shape[0], 1), shape):
        raise ValueError(
            f"advantages must be [B], [B, 1] or [B, T] with B, T = {tuple(shape)}, got {tuple(advantages.shape)}"
        )


def policy_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, **settings: Any
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss to back-propagate and metrics (python floats) for one (micro-)batch: `policy_loss_terms` with its
    statistics read back to the host in one transfer.

    Metrics: `loss`, `pg_loss`, `kl_loss`/`kl` (with `ref_logprobs`), `entropy_loss`/`entropy` (with
    `entropy`) are this call's terms under the given denominators — with global denominators they sum
    over micro-batches to the mini-batch value; `kl` and `entropy` are token means over this call's
    mask. `clipfrac` (tokens where the clipped branch is taken, verl's pg_clipfrac), `clipfrac_low` /
    `clipfrac_high` (ρ below/above the clip range with Â of the sign that clips, TRL's clip_ratio),
    `clipfrac_dual` (dual clip active), `ratio_mean` / `ratio_min` / `ratio_max`, `approx_kl`
    (token mean of log π_old − log π_θ, verl's ppo_kl), `num_tokens`, `num_seqs` are statistics of this
    call (token means; weight them by `num_tokens` to combine micro-batches).
    """
    total, stats = policy_loss_terms(logprobs, old_logprobs, advantages, mask, **settings)
    names = list(stats)
    values = torch.stack([stats[k].to(torch.float64).reshape(()) for k in names]).tolist()  # one host sync
    metrics = dict(zip(names, values))
    if metrics["num_tokens"] == 0:  # no token: extremes are undefined
        metrics.pop("ratio_min")
        metrics.pop("ratio_max")
    return total, metrics


def policy_loss_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
    ratio_level: RatioLevel = "token",
    entropy: Tensor | None = None,
    entropy_coeff: float = 0.0,
    loss_scale_len: int | None = None,
    global_num_tokens: int | float | Tensor | None = None,
    global_num_seqs: int | float | Tensor | None = None,
    log_ratio_clamp: float | None = VERL_LOG_RATIO_CLAMP,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Scalar loss to back-propagate and its statistics as 0-d device tensors (the metrics of `policy_loss`), so
    that a caller accumulating micro-batches reads nothing back per micro-batch (engine/actor.py). With no
    token under the mask `ratio_min` / `ratio_max` hold ±float max (`policy_loss` drops them)."""
    _check_settings(
        loss_agg_mode=loss_agg_mode,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
        ratio_level=ratio_level,
        kl_coef=kl_coef,
        kl_type=kl_type,
        log_ratio_clamp=log_ratio_clamp,
    )
    _check_shapes(logprobs, old_logprobs, advantages, mask, ref_logprobs=ref_logprobs, entropy=entropy)
    _check_inputs_for_terms(kl_coef, ref_logprobs, entropy_coeff, entropy)
    agg = {"loss_scale_len": loss_scale_len, "global_num_tokens": global_num_tokens, "global_num_seqs": global_num_seqs}

    clipped = _clipped_pg(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        ratio_level=ratio_level,
        log_ratio_clamp=log_ratio_clamp,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
    )
    pg_loss = aggregate(clipped.pg, mask, loss_agg_mode, **agg)

    stats: dict[str, Tensor] = {"pg_loss": pg_loss.detach()}
    total = pg_loss
    if ref_logprobs is not None:
        with torch.set_grad_enabled(torch.is_grad_enabled() and kl_coef > 0.0):
            kl_mat = kl_penalty(logprobs, ref_logprobs, kl_type)
            kl_loss = aggregate(kl_mat, mask, loss_agg_mode, **agg)
        if kl_coef > 0.0:
            total = total + kl_coef * kl_loss
        stats["kl_loss"] = kl_loss.detach()
        stats["kl"] = masked_mean(kl_mat.detach(), mask)
    if entropy is not None:
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_coeff != 0.0):
            entropy_loss = aggregate(entropy, mask, loss_agg_mode, **agg)
        if entropy_coeff != 0.0:
            total = total - entropy_coeff * entropy_loss
        stats["entropy_loss"] = entropy_loss.detach()
        stats["entropy"] = masked_mean(entropy.detach(), mask)
    stats["loss"] = total.detach()
    return total, {**stats, **_clip_stats(clipped, mask, clip_low, clip_high)}


class _Clipped(NamedTuple):
    """The clipped policy-gradient term and what its statistics read ([B, T]; `adv` and a sequence-level
    ratio may be [B, 1])."""

    adv: Tensor
    log_ratio: Tensor
    ratio: Tensor
    loss_unclipped: Tensor
    loss_clipped: Tensor
    dual_active: Tensor  # where the dual clip (clip_c) capped a negative-advantage token
    pg: Tensor


def _clipped_pg(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ratio_level: str,
    log_ratio_clamp: float | None,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
) -> _Clipped:
    """PPO's clipped surrogate per token: max(−A·r, −A·clip(r, 1 − low, 1 + high)), capped at −A·clip_c where
    A < 0 when a dual-clip constant `clip_c` is set."""
    adv = advantages.detach().to(logprobs.dtype)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    log_ratio = logprobs - old_logprobs.detach()  # [B, T]
    ratio = torch.exp(_level_log_ratio(log_ratio, mask.to(logprobs.dtype), ratio_level, log_ratio_clamp))

    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(loss_unclipped, loss_clipped)
    dual_active = torch.zeros_like(pg, dtype=torch.bool)
    if clip_c is not None:
        cap = -adv * clip_c
        dual_active = (adv < 0) & (pg > cap)
        pg = torch.where(adv < 0, torch.minimum(pg, cap), pg)
    return _Clipped(adv, log_ratio, ratio, loss_unclipped, loss_clipped, dual_active, pg)


def _check_inputs_for_terms(
    kl_coef: float, ref_logprobs: Tensor | None, entropy_coeff: float, entropy: Tensor | None
) -> None:
    """The KL and entropy terms need their inputs."""
    if kl_coef > 0.0 and ref_logprobs is None:
        raise InputError(
            "kl_coef > 0 needs reference log-probs.",
            "Pass ref_logprobs (from the frozen reference model) or set kl_coef=0.",
        )
    if entropy_coeff != 0.0 and entropy is None:
        raise InputError(
            "entropy_coeff != 0 needs per-token entropies.",
            "Pass entropy (e.g. from chunked_token_logprobs(with_entropy=True)).",
        )


def _level_log_ratio(log_ratio: Tensor, weights: Tensor, ratio_level: str, clamp: float | None) -> Tensor:
    """The log-ratio the ratio is taken of: per token, or GSPO's length-normalised sequence log-ratio [B, 1];
    clamped to ±`clamp` (None: not clamped)."""
    if ratio_level == "sequence":
        log_ratio = (log_ratio * weights).sum(-1, keepdim=True) / weights.sum(-1, keepdim=True).clamp(min=1.0)
    return log_ratio if clamp is None else torch.clamp(log_ratio, min=-clamp, max=clamp)


def _clip_stats(clipped: _Clipped, mask: Tensor, clip_low: float, clip_high: float) -> dict[str, Tensor]:
    """Token-mean clip statistics over `mask` ([B, T]; [B, 1] tensors are broadcast), on detached tensors."""
    ratio, adv, dual_active = clipped.ratio.detach(), clipped.adv, clipped.dual_active
    loss_unclipped, loss_clipped = clipped.loss_unclipped.detach(), clipped.loss_clipped.detach()
    log_ratio = clipped.log_ratio.detach()
    valid = mask.bool()
    full_ratio = ratio.expand(valid.shape)
    low = (ratio < 1.0 - clip_low) & (adv < 0)
    high = (ratio > 1.0 + clip_high) & (adv > 0)
    big = torch.finfo(full_ratio.dtype).max
    return {
        "clipfrac": masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype), mask),
        "clipfrac_low": masked_mean(low.to(ratio.dtype), mask),
        "clipfrac_high": masked_mean(high.to(ratio.dtype), mask),
        "clipfrac_dual": masked_mean(dual_active.to(ratio.dtype), mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_min": torch.where(valid, full_ratio, torch.full_like(full_ratio, big)).amin(),
        "ratio_max": torch.where(valid, full_ratio, torch.full_like(full_ratio, -big)).amax(),
        "approx_kl": masked_mean(-log_ratio, mask),
        "num_tokens": mask.to(torch.float64).sum(),
        "num_seqs": torch.tensor(float(mask.shape[0]), dtype=torch.float64, device=mask.device),
    }
