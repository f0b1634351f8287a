"""Rewards for the engine: built-ins, user functions, and weighted sums of them.

    build_reward("exact_match=1.0,format=0.5") -> RewardModel
    RewardModel.score(completions, records, *, num_tokens=None) -> RewardResult(total, parts, weights)

Spec grammar: see `grpo_pilot.engine.rewards.spec`. Built-ins: exact_match, format, code, length,
overlong, char_fraction (see `BUILTINS` and `builtin_help()`). User functions: see `user.py`.
"""

from grpo_pilot.engine.rewards.answers import answers_match, completion_answer, parse_number
from grpo_pilot.engine.rewards.code import extract_code
from grpo_pilot.engine.rewards.model import RewardModel, RewardPart, build_reward
from grpo_pilot.engine.rewards.registry import BUILTINS, builtin_help
from grpo_pilot.engine.rewards.result import RewardResult, ScoreBatch
from grpo_pilot.engine.rewards.sandbox import SandboxLimits, SandboxResult, run_many, run_tests
from grpo_pilot.engine.rewards.settings import RewardSettings
from grpo_pilot.engine.rewards.spec import RewardTerm, parse_spec
from grpo_pilot.engine.rewards.text import overlong_penalty
from grpo_pilot.engine.rewards.user import batched_reward

__all__ = [
    "BUILTINS",
    "RewardModel",
    "RewardPart",
    "RewardResult",
    "RewardSettings",
    "RewardTerm",
    "SandboxLimits",
    "SandboxResult",
    "ScoreBatch",
    "answers_match",
    "batched_reward",
    "build_reward",
    "builtin_help",
    "completion_answer",
    "extract_code",
    "overlong_penalty",
    "parse_number",
    "parse_spec",
    "run_many",
    "run_tests",
]
