"""Rules the planner, the tuner and the engine share — each written once, here.

- Phase names: the planner's four memory/time phases every plan has (`PLAN_PHASES`), the two a PPO
  plan adds for its critic (`CRITIC_PHASES`: verl's `compute_values` and `update_critic`), all six in
  the order a step runs them (`PHASE_ORDER`: verl ray_trainer `fit` — generate, old log-probs, ref,
  values, advantages, update_critic, update_actor, then the next step's weight sync), and the engine's
  five timed phases in execution order (`RUN_PHASES`, which adds the driver's reward scoring). A plan
  file holds the phases its algorithm runs: plans written before the critic phases existed (and every
  GRPO plan) hold the four, and load unchanged.
- `heads_divisible`: a tensor-parallel (vLLM) or Ulysses degree k splits the attention heads: the query
  heads must divide by k, and the kv heads must divide by k or be replicated (k a multiple of them):
  vLLM `QKVParallelLinear` (kv heads replicated once t > kv heads), verl's Ulysses monkey patch
  (`ulysses_sequence_parallel_size` must divide the heads).
- `old_logprob_pass_runs`: whether a step runs an old-policy log-prob pass before the update. The
  ratio π/π_old is 1 by construction when the batch is one on-policy update (one mini-batch, one
  epoch): TRL (`GRPOTrainer._generate_and_score_completions`) and our engine skip the pass then; verl
  always recomputes old log-probs (`compute_log_prob` in its PPO loop: `ExecutorTraits.always_old_logprob`).
- `num_mini_batches`: mini-batches of a step (the last one may be partial).
"""

from __future__ import annotations

from typing import Iterable, Literal

PhaseName = Literal["rollout", "log_prob", "values", "critic_update", "update", "weight_sync"]
PLAN_PHASES: tuple[PhaseName, ...] = ("rollout", "log_prob", "update", "weight_sync")
CRITIC_PHASES: tuple[PhaseName, ...] = ("values", "critic_update")
PHASE_ORDER: tuple[PhaseName, ...] = ("rollout", "log_prob", "values", "critic_update", "update", "weight_sync")
# The engine's timed phases in the order one step runs them (engine/loop.py `grpo_step`).
RUN_PHASES: tuple[str, ...] = ("weight_sync", "rollout", "reward", "log_prob", "update")


def phases_present(names: Iterable[str]) -> tuple[PhaseName, ...]:
    """The phases among `names` (a plan's or report's keys), in execution order."""
    present = set(names)
    return tuple(p for p in PHASE_ORDER if p in present)


def heads_divisible(num_heads: int, num_kv_heads: int, degree: int) -> bool:
    """Whether `degree` ranks can split the attention heads (module docstring)."""
    return num_heads % degree == 0 and (num_kv_heads % degree == 0 or degree % num_kv_heads == 0)


def num_mini_batches(num_prompts: int, mini_batch_prompts: int) -> int:
    """Mini-batches of `num_prompts` prompts (ceil: the last one may be partial)."""
    return -(-num_prompts // max(1, mini_batch_prompts))


def old_logprob_pass_runs(*, num_mini_batches: int, ppo_epochs: int, always: bool = False) -> bool:
    """Whether the step runs an old-policy log-prob pass (module docstring)."""
    return always or num_mini_batches * ppo_epochs > 1
