"""Sequence lengths: from what the user knows (maxima, means, a lengths file) to tokens in a batch.

A GRPO step never holds every sequence at its maximum: GSM8K-style data has prompts of ~100 tokens and
responses of ~150–250 under caps of 512–1024 (verl's reference log, docs/validation.md). Memory and
time therefore follow the length distribution:

- memory is judged at a high quantile of what one micro-batch holds under the executor's padding
  (`ExecutorTraits.padding`): the sum of B real lengths when padding is removed (verl
  `use_remove_padding`), B × the longest of the rank's sequences when rows are sorted by length and
  padded to the longest of the micro-batch (our engine), B × the maximum when rows are padded to the longest of a
  generation batch of hundreds (TRL);
- time follows the expected lengths (tokens processed = sequences × mean length; attention and
  KV-cache reads follow the second moment), with the rollout paced by its longest response;
- the worst case (every sequence at its maximum) is evaluated separately (`Workload.worst_case`).

Quantiles. A sum of B independent lengths with mean μ and standard deviation σ is taken at
μ·B + z·σ·√B (central limit theorem), z = 3.09 for the 0.999 one-sided normal quantile: a run of a few
hundred steps forms thousands of micro-batches, and the 0.999 quantile is the one such a run is
expected to reach. One length (B = 1, or the longest row of a padded micro-batch) is taken at
μ + z·σ. Both are capped by the maxima, which the data cannot exceed (truncation).

When σ is unknown, the spread of the least-informative distribution on [0, max] with mean μ is used:
the maximum-entropy density under a known mean on a bounded interval is the truncated exponential
(Jaynes, "Information theory and statistical mechanics", Phys. Rev. 106, 1957; Cover & Thomas, *Elements
of Information Theory*, §12.1), ∝ exp(−λx), whose σ ≈ μ for μ ≪ max (uniform, σ = max/√12, at μ = max/2).
It stays above the spreads public RL runs log (verl's GSM8K reference run: σ ≈ 95 tokens for a 199-token
mean response, docs/validation.md) without assuming the two-point extreme of the Bhatia–Davis bound
(σ² ≤ (max − μ)·μ, `std_bound`), which puts most sequences at 0 and the rest at the cap. The prompt and
response deviations add linearly (σ_p + σ_r), the bound that holds for any correlation between the two
(Minkowski's inequality).
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist
from typing import NamedTuple

from grpo_pilot.planner.config import Workload

MEMORY_QUANTILE = 0.999
MEMORY_QUANTILE_Z = 3.090  # standard normal one-sided quantile of 0.999


class Lengths(NamedTuple):
    """Resolved length statistics of one workload (tokens)."""

    prompt_max: int
    response_max: int
    prompt_mean: float
    response_mean: float
    prompt_std: float
    response_std: float
    response_tail: int  # longest response one rollout waits for

    @property
    def seq_max(self) -> int:
        return self.prompt_max + self.response_max

    @property
    def seq_mean(self) -> float:
        return self.prompt_mean + self.response_mean

    @property
    def seq_std(self) -> float:
        return self.prompt_std + self.response_std

    @property
    def response_second_moment(self) -> float:
        """E[R²] = μ² + σ² of the response length (KV-cache reads and attention grow with it)."""
        return self.response_mean**2 + self.response_std**2


def std_bound(mean: float, max_len: int) -> float:
    """Largest standard deviation of a length in [0, max_len] with this mean (Bhatia–Davis)."""
    return math.sqrt(max(0.0, (max_len - mean) * mean))


def _truncated_exponential(z: float) -> tuple[float, float]:
    """(mean, variance) of the density ∝ exp(−z·x) on [0, 1]; symmetric in z ↦ −z, x ↦ 1 − x."""
    if z < 0:
        mean, var = _truncated_exponential(-z)
        return 1.0 - mean, var
    if z < 1e-6:
        return 0.5, 1.0 / 12.0
    if z > 700:  # the tail beyond 1 is negligible: an untruncated exponential
        return 1.0 / z, 1.0 / (z * z)
    e = math.expm1(z)
    return 1.0 / z - 1.0 / e, max(0.0, 1.0 / (z * z) - (e + 1.0) / (e * e))


@lru_cache(maxsize=4096)
def max_entropy_std(mean: float, max_len: int) -> float:
    """Standard deviation of the maximum-entropy length distribution on [0, max_len] with this mean (the
    truncated exponential; module docstring): bisection on its rate, whose mean falls as the rate grows."""
    if max_len <= 0 or mean <= 0 or mean >= max_len:
        return 0.0
    target = mean / max_len
    lo, hi = -1e4, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        if _truncated_exponential(mid)[0] > target:
            lo = mid
        else:
            hi = mid
    return max_len * math.sqrt(_truncated_exponential((lo + hi) / 2)[1])


@lru_cache(maxsize=256)  # a search evaluates one workload thousands of times (Workload is frozen)
def lengths_of(workload: Workload) -> Lengths:
    """The workload's length statistics with unknown deviations replaced by their bound."""
    pm, rm = workload.prompt_mean_tokens, workload.response_mean_tokens
    ps = workload.prompt_len_std_tokens
    rs = workload.response_len_std_tokens
    return Lengths(
        prompt_max=workload.prompt_len_tokens,
        response_max=workload.response_len_tokens,
        prompt_mean=pm,
        response_mean=rm,
        prompt_std=max_entropy_std(pm, workload.prompt_len_tokens) if ps is None else ps,
        response_std=max_entropy_std(rm, workload.response_len_tokens) if rs is None else rs,
        response_tail=workload.response_tail_tokens or workload.response_len_tokens,
    )


def sum_quantile_tokens(
    *,
    count: int,
    mean: float,
    std: float,
    max_len: int,
    z: float = MEMORY_QUANTILE_Z,
    population: int | None = None,
) -> int:
    """Tokens of `count` sequences together at the quantile z: count·μ + z·σ·√count, within
    [count·μ, count·max]. `population`: the sequences are drawn without replacement from a set of that
    many whose total is fixed at its mean (verl's balanced partitions), so the deviation of the sum
    shrinks by the finite-population factor √((N − count)/(N − 1))."""
    if count <= 0:
        return 0
    expected = count * mean
    spread = std * math.sqrt(count)
    if population is not None and population > count:
        spread *= math.sqrt((population - count) / (population - 1))
    elif population is not None:
        spread = 0.0  # the whole balanced population: its total is the mean
    high = expected + z * spread
    return int(min(count * max_len, math.ceil(high)))


def one_quantile_tokens(mean: float, std: float, max_len: int, z: float = MEMORY_QUANTILE_Z) -> int:
    """One sequence's tokens at the quantile z, capped by the maximum."""
    return int(min(max_len, math.ceil(mean + z * std)))


def longest_of_z(count: int, z: float = MEMORY_QUANTILE_Z) -> float:
    """The per-row normal quantile at which the longest of `count` independent rows reaches the
    quantile z: P(max ≤ x) = F(x)^count, so F(x) = Φ(z)^(1/count)."""
    if count <= 1:
        return z
    normal = NormalDist()
    return normal.inv_cdf(normal.cdf(z) ** (1.0 / count))


def micro_batch_tokens(
    count: int,
    lengths: Lengths,
    *,
    padding: str,
    pool: int | None = None,
    z: float = MEMORY_QUANTILE_Z,
    population: int | None = None,
) -> int:
    """Tokens one micro-batch of `count` sequences holds at the memory quantile (see module docstring).

    packed ("remove"): the quantile of the sum of count lengths; rows padded to the longest of their
    micro-batch after sorting the rank's `pool` sequences by length, longest first ("sorted_rows", our
    engine's micro_batches.py): the first micro-batch holds the pool's longest rows, count × the quantile
    of the longest of `pool` rows; rows padded to the longest of the rank's generation batch ("batch_max", TRL:
    `pool` is that batch): count × (the longest prompt + the longest completion of `pool` rows, each at its
    quantile). `population`: see `sum_quantile_tokens` (packed only)."""
    if padding == "remove":
        return sum_quantile_tokens(
            count=count, mean=lengths.seq_mean, std=lengths.seq_std, max_len=lengths.seq_max, z=z, population=population
        )
    if padding == "batch_max":
        # TRL left-pads prompts to the longest prompt and right-pads completions to the longest completion of the
        # rank's generation batch, then splits it into micro-batches that keep that width (trl 1.16
        # grpo_trainer.py `_generate_and_score_completions`: `pad(completion_ids, ..., padding_side="right")`
        # lines 2454-2461; `_prepare_inputs`: `split_tensor_dict(generation_batch, steps_per_generation)` line
        # 1544; trl v0.15.0 padded each micro-step's own generation, grpo_trainer.py line 556). A batch of
        # hundreds reaches the maxima; a small one (steps_per_generation 1, TRL <= 0.16) pads to its own longest.
        return count * batch_max_width_tokens(lengths, max(count, pool or count), z)
    rows = max(count, pool or count)
    return count * one_quantile_tokens(lengths.seq_mean, lengths.seq_std, lengths.seq_max, longest_of_z(rows, z))


def batch_max_width_tokens(lengths: Lengths, rows: int, z: float = MEMORY_QUANTILE_Z) -> int:
    """The width TRL pads every row of a generation batch of `rows` rows to (`micro_batch_tokens`, "batch_max"):
    its longest prompt plus its longest completion, each at the quantile z of the longest of `rows` (z = 0: the
    median longest, what a step costs in time)."""
    longest = longest_of_z(rows, z)
    prompt = one_quantile_tokens(lengths.prompt_mean, lengths.prompt_std, lengths.prompt_max, longest)
    return prompt + one_quantile_tokens(lengths.response_mean, lengths.response_std, lengths.response_max, longest)


def response_share(lengths: Lengths, z: float = MEMORY_QUANTILE_Z) -> float:
    """Share of a micro-batch's positions that are response tokens (at the quantile lengths)."""
    response = one_quantile_tokens(lengths.response_mean, lengths.response_std, lengths.response_max, z)
    seq = one_quantile_tokens(lengths.seq_mean, lengths.seq_std, lengths.seq_max, z)
    return min(1.0, response / seq)


def tokens_per_sequence_for_time(lengths: Lengths, padding: str, batch_rows: int = 1) -> float:
    """Tokens one sequence costs in a forward/backward pass: its real length, except under TRL's
    batch-max padding, where every row is as wide as the median longest prompt plus the median longest
    completion of its rank's generation batch of `batch_rows` rows (`batch_max_width_tokens` at z = 0; the
    maxima where the lengths are unknown)."""
    return float(batch_max_width_tokens(lengths, batch_rows, 0.0)) if padding == "batch_max" else lengths.seq_mean
