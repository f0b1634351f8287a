"""Tokens one rank holds in one update or log-prob micro-batch (T in memory-model.md).

Variants:
- dynamic batching (`max_token_len_per_gpu` set): a micro-batch is packed up to the token budget
  (padding removed). verl multiplies the per-GPU budget by the Ulysses degree s and then splits the
  packed sequence across the s ranks (verl-config.md: "per-GPU budget is multiplied by SP inside the
  actor"), so each rank sees `budget` tokens; our engine and TRL treat the budget as per GPU before
  the split, so each rank sees `budget / s`.
- fixed micro-batch: `micro × (prompt + response)` padded tokens per SP group, `/ s` per rank.
- log-prob passes always pack by `log_prob_max_token_len_per_gpu` (same rule as dynamic batching).
Every packed micro-batch holds at least one whole sequence (seqlen_balancing.rearrange_micro_batches
never splits a sequence), and never more tokens than the rank's share of the (mini-)batch.
"""

from __future__ import annotations


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sequences_per_sp_group(num_sequences: int, trainer_gpus: int, ulysses_sp: int) -> int:
    """Sequences one SP group (data-parallel rank) processes: ceil(num_sequences / (D / s))."""
    groups = max(1, trainer_gpus // ulysses_sp)
    return _ceil_div(num_sequences, groups)


def packed_tokens_per_rank(
    budget_tokens: int, seq_len_tokens: int, available_sequences: int, ulysses_sp: int, budget_scaled_by_sp: bool
) -> int:
    """Tokens per rank of one packed micro-batch with a token budget (see module docstring)."""
    group_budget = budget_tokens * ulysses_sp if budget_scaled_by_sp else budget_tokens
    group_tokens = max(group_budget, seq_len_tokens)  # at least one whole sequence
    group_tokens = min(group_tokens, available_sequences * seq_len_tokens)
    return _ceil_div(group_tokens, ulysses_sp)


def padded_tokens_per_rank(
    micro_batch_seqs: int, seq_len_tokens: int, available_sequences: int, ulysses_sp: int
) -> int:
    """Tokens per rank of a fixed micro-batch of padded sequences."""
    seqs = min(micro_batch_seqs, available_sequences)
    return _ceil_div(seqs * seq_len_tokens, ulysses_sp)


def scored_tokens(tokens_per_rank: int, response_len_tokens: int, seq_len_tokens: int, target: str) -> int:
    """Positions whose logits are computed: verl scores every packed position (logits_rmpad over the
    whole sequence, sliced afterwards); our engine (`logits_to_keep` = response positions) and TRL
    (fused head over positions with a label) score the response share only."""
    if target == "verl":
        return tokens_per_rank
    return _ceil_div(tokens_per_rank * response_len_tokens, seq_len_tokens)
