"""Reduce a per-token loss matrix to the scalar that is back-propagated (verl's `loss_agg_mode`).

Shapes: `loss_mat` [B, T] and `mask` [B, T] over completion tokens (mask 1 = the token counts;
float masks act as per-token weights). Notation: m = mask, l = loss_mat, N_tok = Σ m,
N_seq = number of sequences (rows), L = a constant length.

| mode                      | value                                 | peers                                            |
|---------------------------|---------------------------------------|--------------------------------------------------|
| `token-mean`              | Σ_i Σ_t m·l / N_tok                   | verl default; TRL bnpo / dapo; DAPO (2503.14476) |
| `seq-mean-token-mean`     | Σ_i (Σ_t m·l / max(Σ_t m, 1)) / N_seq | GRPO paper (2402.03300); TRL grpo                |
| `seq-mean-token-sum`      | Σ_i Σ_t m·l / N_seq                   | verl                                             |
| `seq-mean-token-sum-norm` | Σ_i Σ_t m·l / (N_seq · L)             | Dr. GRPO (2503.20783); TRL dr_grpo               |

Gradient accumulation without bias: pass the denominators of the whole mini-batch
(`global_num_tokens` = N_tok, `global_num_seqs` = N_seq of the mini-batch, and a fixed
`loss_scale_len`) to every micro-batch call; the micro-batch results then sum exactly to the
mini-batch value (and so do their gradients). Without them each call uses its own denominators.

Differences from verl that are deliberate (see `verl/trainer/ppo/core_algos.py::agg_loss`):
- `seq-mean-token-sum-norm`: verl divides Σ_i Σ_t m·l by L only (no 1/N_seq); we follow the
  Dr. GRPO paper and TRL's `dr_grpo`, which divide by N_seq · L. Only the scale differs.
- Fully masked rows count in N_seq by default (as TRL's `grpo` does); verl ≥ 0.6 leaves them
  out. Pass `global_num_seqs` to choose.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from grpo_pilot.errors import InputError

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

# TRL `GRPOConfig.loss_type` -> our mode. "bnpo" uses the local token count, "dapo" the token count of
# the whole accumulated batch (pass it as `global_num_tokens`); "dr_grpo" uses L = max_completion_length
# (trl/trainer/grpo_trainer.py, `_compute_loss`, TRL 1.16).
TRL_LOSS_TYPE_TO_AGG_MODE: dict[str, str] = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}


def check_agg_mode(mode: str) -> str:
    """Return `mode` if it is a known aggregation mode, else raise an `InputError` naming the choices."""
    if mode not in AGG_MODES:
        raise InputError(
            f"Unknown loss aggregation mode '{mode}'.",
            f"Use one of {', '.join(AGG_MODES)} (verl's loss_agg_mode names; TRL's loss_type maps as "
            f"{', '.join(f'{k}->{v}' for k, v in TRL_LOSS_TYPE_TO_AGG_MODE.items())}).",
        )
    return mode


def _positive(name: str, value: float | int | Tensor | None) -> None:
    if value is None:
        return
    number = float(value.detach().reshape(()).item()) if isinstance(value, Tensor) else float(value)
    if not number > 0:
        raise InputError(
            f"{name} must be positive, got {number}.",
            "Pass the count or length of the whole mini-batch (> 0), or None.",
        )


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    loss_scale_len: int | None = None,
    global_num_tokens: int | float | Tensor | None = None,
    global_num_seqs: int | float | Tensor | None = None,
) -> Tensor:
    """Scalar loss from `loss_mat` [B, T] under `mask` [B, T] and aggregation `mode` (table above).

    `loss_scale_len` is L for `seq-mean-token-sum-norm` (default: T = mask.shape[-1], which changes
    with padding — pass the maximum response length for a constant normaliser). `global_num_tokens`
    replaces N_tok (token-mean) and `global_num_seqs` replaces N_seq (the seq-mean modes).
    A `loss_mat` of shape [B, 1] (one value per sequence) is broadcast over the tokens.
    """
    check_agg_mode(mode)
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    if loss_mat.shape != mask.shape:
        if loss_mat.dim() == 2 and loss_mat.shape[0] == mask.shape[0] and loss_mat.shape[1] == 1:
            loss_mat = loss_mat.expand_as(mask)
        else:
            raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must have the same shape")
    _positive("global_num_tokens", global_num_tokens)
    _positive("global_num_seqs", global_num_seqs)
    _positive("loss_scale_len", loss_scale_len)

    weights = mask.to(loss_mat.dtype)
    masked = loss_mat * weights
    if mode == "token-mean":
        denom = weights.sum().clamp(min=1.0) if global_num_tokens is None else global_num_tokens
        return masked.sum() / denom

    num_seqs = mask.shape[0] if global_num_seqs is None else global_num_seqs
    seq_sums = masked.sum(dim=-1)  # [B]
    if mode == "seq-mean-token-mean":
        seq_means = seq_sums / weights.sum(dim=-1).clamp(min=1.0)
        return seq_means.sum() / num_seqs
    if mode == "seq-mean-token-sum":
        return seq_sums.sum() / num_seqs
    length = mask.shape[-1] if loss_scale_len is None else loss_scale_len
    return seq_sums.sum() / (num_seqs * length)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Σ m·v / max(Σ m, 1) over all elements: a token mean for metrics ([B, T] or [B, 1] values)."""
    weights = mask.to(values.dtype)
    if values.shape != weights.shape:
        values = values.expand_as(weights)
    return (values * weights).sum() / weights.sum().clamp(min=1.0)
