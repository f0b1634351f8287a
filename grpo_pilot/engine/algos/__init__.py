"""The GRPO math of the engine, one small module per piece (each docstring gives variant and shapes).

- `advantages`: group-relative advantages (GRPO / Dr. GRPO / batch-scaled).
- `policy_loss`: clipped surrogate with clip-higher, dual clip, GSPO ratios, KL and entropy terms.
- `kl`: per-token KL estimators k1 / k2 / k3 (low_var_kl).
- `aggregation`: loss aggregation modes and micro-batch denominators.
- `dapo`: dynamic sampling (zero-variance groups) and overlong handling.
- `logprobs`: per-token log-probs / entropy, plain and vocabulary-chunked.
"""

from grpo_pilot.engine.algos.advantages import ADVANTAGE_SCALES, compute_advantages, group_reward_stats, group_view
from grpo_pilot.engine.algos.aggregation import AGG_MODES, TRL_LOSS_TYPE_TO_AGG_MODE, aggregate, masked_mean
from grpo_pilot.engine.algos.dapo import (
    informative_sample_indices,
    mask_truncated,
    overlong_penalty,
    truncated_samples,
    zero_variance_groups,
)
from grpo_pilot.engine.algos.kl import KL_TYPES, kl_penalty
from grpo_pilot.engine.algos.logprobs import chunked_token_logprobs, entropy_from_logits, token_logprobs
from grpo_pilot.engine.algos.policy_loss import policy_loss

__all__ = [
    "ADVANTAGE_SCALES",
    "AGG_MODES",
    "KL_TYPES",
    "TRL_LOSS_TYPE_TO_AGG_MODE",
    "aggregate",
    "chunked_token_logprobs",
    "compute_advantages",
    "entropy_from_logits",
    "group_reward_stats",
    "group_view",
    "informative_sample_indices",
    "kl_penalty",
    "mask_truncated",
    "masked_mean",
    "overlong_penalty",
    "policy_loss",
    "token_logprobs",
    "truncated_samples",
    "zero_variance_groups",
]
