"""Tokens one rank holds in one update or log-prob micro-batch (T in memory-model.md).

Variants:
- token budget (`max_token_len_per_gpu`, and log-prob passes without a fixed micro-batch): a
  micro-batch is packed up to the budget. verl multiplies the per-GPU budget by the Ulysses degree s
  and then splits the packed sequence across the s ranks (verl-config.md: "per-GPU budget is
  multiplied by SP inside the actor"), so each rank sees `budget` tokens; our engine and TRL treat the
  budget as per GPU before the split, so each rank sees `budget / s`.
- fixed micro-batch: the tokens B sequences hold under the executor's padding
  (`lengths.micro_batch_tokens`), `/ s` per rank.
Every packed micro-batch holds at least one whole sequence (seqlen_balancing.rearrange_micro_batches
never splits a sequence), and never more tokens than the rank's share of the (mini-)batch holds.
"""

from __future__ import annotations


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sequences_per_sp_group(num_sequences: int, trainer_gpus: int, ulysses_sp: int) -> int:
    """Sequences one SP group (data-parallel rank) processes: ceil(num_sequences / (D / s))."""
    groups = max(1, trainer_gpus // ulysses_sp)
    return _ceil_div(num_sequences, groups)


def budget_tokens_per_rank(
    *, budget_tokens: int, longest_seq_tokens: int, available_tokens: int, ulysses_sp: int, budget_scaled_by_sp: bool
) -> int:
    """Tokens per rank of one micro-batch packed up to a token budget (see module docstring):
    at least one whole (longest) sequence, at most what the rank's share of the batch holds."""
    group_budget = budget_tokens * ulysses_sp if budget_scaled_by_sp else budget_tokens
    group_tokens = max(group_budget, longest_seq_tokens)
    group_tokens = min(group_tokens, max(available_tokens, longest_seq_tokens))
    return _ceil_div(group_tokens, ulysses_sp)


def packed_tokens_per_rank(
    *, budget_tokens: int, seq_len_tokens: int, available_sequences: int, ulysses_sp: int, budget_scaled_by_sp: bool
) -> int:
    """`budget_tokens_per_rank` with every sequence at `seq_len_tokens` (the worst case)."""
    return budget_tokens_per_rank(
        budget_tokens=budget_tokens,
        longest_seq_tokens=seq_len_tokens,
        available_tokens=available_sequences * seq_len_tokens,
        ulysses_sp=ulysses_sp,
        budget_scaled_by_sp=budget_scaled_by_sp,
    )


def fixed_tokens_per_rank(micro_batch_tokens: int, ulysses_sp: int) -> int:
    """Tokens per rank of a fixed micro-batch whose SP group holds `micro_batch_tokens`."""
    return _ceil_div(micro_batch_tokens, ulysses_sp)


def scored_tokens(tokens_per_rank: int, response_share: float, scores_all_positions: bool) -> int:
    """Positions whose logits are computed: verl scores every packed position (logits_rmpad over the
    whole sequence, sliced afterwards); our engine (`logits_to_keep` = response positions) and TRL
    (fused head over positions with a label) score the response share only."""
    if scores_all_positions:
        return tokens_per_rank
    return int(-(-tokens_per_rank * response_share // 1))
