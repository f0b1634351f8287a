"""Group-relative outcome advantages (GRPO, arXiv 2402.03300 §4.1.2) and their variants.

Layout: `rewards` [B] group-contiguous, B = num_groups × group_size:
[p0g0, p0g1, …, p0g(G−1), p1g0, …]. Result [B], one advantage per completion (every token of
the completion gets it). With mean_g, std_g over the completion's own group:

| scale   | Â_i                                | peers                                                                 |
|---------|------------------------------------|-----------------------------------------------------------------------|
| `group` | (r_i − mean_g) / (std_g + eps)     | GRPO; verl norm_adv_by_std_in_grpo=True; TRL scale_rewards="group"    |
| `batch` | (r_i − mean_g) / (std_batch + eps) | TRL scale_rewards="batch" (std over all B rewards)                    |
| `none`  | r_i − mean_g                       | Dr. GRPO (2503.20783); verl norm_adv_by_std_in_grpo=False; TRL "none" |

Which std: the unbiased sample std (Bessel, divide by n − 1) — verl uses `torch.std` (unbiased
by default) and TRL its `nanstd` with Bessel's correction, so both agree with this choice.
eps: verl's default is 1e-6 (`compute_grpo_outcome_advantage`), TRL hard-codes 1e-4.

Edge cases (no NaN in any of them):
- zero-variance group (all rewards equal, e.g. all correct or all wrong): Â = 0 exactly for each
  member, in every mode — such groups carry no learning signal (DAPO drops and refills them,
  see `dapo.zero_variance_groups`).
- singleton groups (group_size = 1): Â = r − r = 0. TRL does the same (std set to 0);
  verl instead uses mean 0 and std 1 for a singleton (Â = r / (1 + eps)), i.e. plain REINFORCE
  without a baseline — not GRPO, so we do not copy it.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from grpo_pilot.errors import InputError

AdvantageScale = Literal["group", "batch", "none"]
ADVANTAGE_SCALES: tuple[str, ...] = ("group", "batch", "none")
VERL_ADV_EPS = 1e-6  # verl core_algos.compute_grpo_outcome_advantage(epsilon=1e-6)
TRL_ADV_EPS = 1e-4  # trl GRPOTrainer._generate_and_score_completions: (std_rewards + 1e-4)


def group_view(rewards: Tensor, group_size: int) -> Tensor:
    """rewards [B] -> view [num_groups, group_size]; `InputError` if B is not a multiple of group_size."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor [B], got shape {tuple(rewards.shape)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InputError(
            f"group_size must be a positive integer, got {group_size!r}.",
            "Use the number of completions per prompt (n).",
        )
    if rewards.numel() % group_size != 0:
        raise InputError(
            f"{rewards.numel()} rewards do not split into groups of {group_size}.",
            "Every prompt needs exactly n completions, laid out group by group.",
        )
    return rewards.reshape(-1, group_size)


def compute_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    scale: AdvantageScale = "group",
    eps: float = VERL_ADV_EPS,
) -> Tensor:
    """Advantages [B] for group-contiguous `rewards` [B] (see the module docstring for the formulas).

    Computed in float64 and returned in the rewards' floating dtype (float32 for integer rewards);
    never carries gradient.
    """
    if scale not in ADVANTAGE_SCALES:
        raise InputError(f"Unknown advantage scale '{scale}'.", f"Use one of {', '.join(ADVANTAGE_SCALES)}.")
    if not eps >= 0:
        raise InputError(f"Advantage eps must be >= 0, got {eps}.", "Use 1e-6 (verl) or 1e-4 (TRL).")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    with torch.no_grad():
        grouped = group_view(rewards.detach(), group_size).to(torch.float64)
        centred = grouped - grouped.mean(dim=1, keepdim=True)
        if scale == "group":
            std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped[:, :1])
            centred = centred / (std + eps)
        elif scale == "batch":
            flat = grouped.reshape(-1)
            std = flat.std() if flat.numel() > 1 else torch.zeros((), dtype=flat.dtype, device=flat.device)
            centred = centred / (std + eps)
        # Exactly zero for groups without reward spread (the mean of equal floats can be off by an ulp).
        flat_group = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
        centred = torch.where(flat_group, torch.zeros_like(centred), centred)
        return centred.reshape(-1).to(out_dtype)


def group_reward_stats(rewards: Tensor, group_size: int) -> dict[str, float]:
    """Metrics of a rollout batch: mean and unbiased std of all rewards, mean within-group std,
    and the fraction of groups with no reward spread (`frac_zero_std_groups`)."""
    grouped = group_view(rewards.detach(), group_size).to(torch.float64)
    group_std = grouped.std(dim=1) if group_size > 1 else torch.zeros(grouped.shape[0], dtype=torch.float64)
    flat = grouped.reshape(-1)
    flat_groups = (grouped.amax(dim=1) == grouped.amin(dim=1)).to(torch.float64)
    return {
        "reward_mean": float(flat.mean()),
        "reward_std": float(flat.std()) if flat.numel() > 1 else 0.0,
        "reward_group_std_mean": float(group_std.mean()),
        "frac_zero_std_groups": float(flat_groups.mean()),
    }
