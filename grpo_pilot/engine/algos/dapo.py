"""DAPO's data-side pieces (arXiv 2503.14476): dynamic sampling and overlong handling.

- Dynamic sampling (§3.2): groups whose rewards are all equal (all correct / all wrong) give zero
  advantage, hence no gradient; DAPO drops them and keeps sampling until the batch is full.
  `zero_variance_groups` finds them, `informative_sample_indices` gives the rows to keep; the
  refill (generating more prompts) is the step loop's job.
- Overlong reward shaping (§3.4, eq. 13): a soft length penalty added to the reward,
  `overlong_penalty`; and overlong filtering: drop the loss of truncated samples from the
  update, `mask_truncated` (TRL: `mask_truncated_completions`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo_pilot.engine.algos.advantages import group_view
from grpo_pilot.errors import InputError


def zero_variance_groups(rewards: Tensor, group_size: int) -> Tensor:
    """Bool [num_groups]: True where every reward of the group is equal (singletons included).

    `rewards` [B] group-contiguous (B = num_groups × group_size, as in `compute_advantages`).
    """
    grouped = group_view(rewards.detach(), group_size)
    return grouped.amax(dim=1) == grouped.amin(dim=1)


def informative_sample_indices(rewards: Tensor, group_size: int) -> Tensor:
    """Long [K·group_size]: row indices of the samples in groups with reward spread, in order.

    Index a rollout batch with it to drop the zero-variance groups (DAPO dynamic sampling).
    """
    keep_groups = ~zero_variance_groups(rewards, group_size)
    rows = torch.arange(rewards.numel(), device=rewards.device).reshape(-1, group_size)
    return rows[keep_groups].reshape(-1)


def overlong_penalty(
    lengths: Tensor,
    *,
    max_len: int,
    cache_len: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """DAPO soft overlong punishment R_length(|y|), float32 [B] for completion `lengths` [B].

    With L_max = `max_len`, L_cache = `cache_len` (DAPO eq. 13):
      0                                  if |y| ≤ L_max − L_cache
      ((L_max − L_cache) − |y|) / L_cache if L_max − L_cache < |y| ≤ L_max   (falls linearly to −1)
      −1                                  if |y| > L_max
    multiplied by `penalty_factor` (verl's `overlong_buffer.penalty_factor`, default 1).
    `cache_len` = 0 gives the hard step: 0 up to L_max, −1 beyond. The paper's run uses
    L_max = 20480 (16384 expected + 4096 cache).
    """
    if max_len < 1 or cache_len < 0 or cache_len > max_len:
        raise InputError(
            f"Overlong penalty needs 0 <= cache_len <= max_len and max_len >= 1, "
            f"got max_len={max_len}, cache_len={cache_len}.",
            "Set cache_len to the soft-penalty window (DAPO uses 4096 of a 20480-token limit).",
        )
    length = lengths.to(torch.float32)
    expected = float(max_len - cache_len)
    if cache_len == 0:
        soft = torch.zeros_like(length)
    else:
        soft = torch.clamp((expected - length) / cache_len, max=0.0)
    penalty = torch.where(length > max_len, torch.full_like(length, -1.0), soft)
    return penalty * penalty_factor


def truncated_samples(completion_ids: Tensor, mask: Tensor, eos_token_ids: int | list[int] | tuple[int, ...]) -> Tensor:
    """Bool [B]: True for completions with no EOS among their valid tokens (cut at the length cap).

    `completion_ids`, `mask` [B, T]. Prefer the rollout engine's finish reason when it has one.
    """
    if completion_ids.shape != mask.shape:
        raise ValueError(f"completion_ids {tuple(completion_ids.shape)} and mask {tuple(mask.shape)} must match")
    eos = torch.as_tensor(
        [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids), device=completion_ids.device
    )
    is_eos = torch.isin(completion_ids, eos) & mask.bool()
    return ~is_eos.any(dim=1)


def mask_truncated(mask: Tensor, truncated: Tensor) -> Tensor:
    """Copy of `mask` [B, T] with the rows of `truncated` (bool [B]) zeroed: DAPO overlong filtering.

    The rows stay in the batch (and in N_seq of the seq-mean modes, as in TRL); only their tokens
    stop contributing to the loss.
    """
    if truncated.dim() != 1 or truncated.shape[0] != mask.shape[0]:
        raise ValueError(f"truncated must be [B] with B = {mask.shape[0]}, got {tuple(truncated.shape)}")
    keep = (~truncated.bool()).to(mask.dtype).unsqueeze(1)
    return mask * keep
