"""format, char_fraction, length and overlong built-ins, and the weighted sum of parts."""

from __future__ import annotations

import pytest

from grpo_pilot.engine.data import PromptRecord
from grpo_pilot.engine.model_factory import build_char_tokenizer
from grpo_pilot.engine.rewards import build_reward, overlong_penalty
from grpo_pilot.errors import InputError

REC = PromptRecord(line=1, prompt="p", answer="42")


def score(spec: str, completions: list[str], **kw) -> tuple[float, ...]:
    return build_reward(spec).score(completions, [REC] * len(completions), **kw).total


def test_default_format_needs_think_block_then_an_answer() -> None:
    completions = [
        "<think>6*7</think> 42",
        "  <think>\nmulti\nline\n</think>\n\\boxed{42}",
        "<think>no answer</think>   ",
        "42 <think>late</think> x",
        "<think>unclosed 42",
    ]
    assert score("format", completions) == (1.0, 1.0, 0.0, 0.0, 0.0)


def test_format_full_versus_partial_match() -> None:
    assert score("format:pattern=<answer>.*</answer>", ["<answer>1</answer>", "so <answer>1</answer>"]) == (1.0, 0.0)
    assert score("format:pattern=<answer>.*</answer>;match=partial", ["so <answer>1</answer>", "none"]) == (1.0, 0.0)


def test_char_fraction() -> None:
    assert score("char_fraction", ["aaaa", "abab", "", "bbb"]) == (1.0, 0.5, 0.0, 0.0)
    assert score("char_fraction:char=b", ["abab"]) == (0.5,)
    assert score("char_fraction:char=' '", ["a b "]) == (0.5,)


def test_overlong_follows_dapo_equation_13() -> None:
    # L_max = 20, L_cache = 4: 0 up to 16, linear to -1 at 20, -1 beyond.
    assert [overlong_penalty(n, 20, 4) for n in (0, 16, 17, 18, 20, 21, 100)] == [
        0.0,
        0.0,
        -0.25,
        -0.5,
        -1.0,
        -1.0,
        -1.0,
    ]
    assert score("overlong:max_len=20;cache_len=4;unit=chars", ["x" * 10, "x" * 18, "x" * 30]) == (0.0, -0.5, -1.0)


def test_overlong_counts_tokens_from_the_engine_or_the_tokenizer() -> None:
    spec = "overlong:max_len=8;cache_len=4"
    assert score(spec, ["short", "this is long"], num_tokens=[6, 8]) == (-0.5, -1.0)
    tokenized = build_reward(spec, tokenizer=build_char_tokenizer())
    assert tokenized.score(["abcde", "abcdefgh"], [REC, REC]).total == (-0.25, -1.0)  # one token per char
    with pytest.raises(InputError, match="counts tokens but has neither token counts nor a tokenizer"):
        score(spec, ["abc"])


def test_plain_length_penalty() -> None:
    assert score("length:max_len=10;unit=chars", ["", "x" * 5, "x" * 10, "x" * 40]) == (-0.0, -0.5, -1.0, -1.0)
    assert score("length=-1:max_len=10;unit=chars", ["x" * 5]) == (0.5,)  # negative weight: a bonus


def test_weighted_sum_of_parts() -> None:
    reward = build_reward("exact_match=1.0,format=0.5,char_fraction=0.25")
    result = reward.score(["<think>a</think> 42", "42", "aaaa"], [REC] * 3)
    assert result.parts["exact_match"] == (1.0, 1.0, 0.0)
    assert result.parts["format"] == (1.0, 0.0, 0.0)
    assert result.total == pytest.approx((1.0 + 0.5 + 0.25 * 1 / 19, 1.0, 0.25))
    assert result.mean() == pytest.approx(sum(result.total) / 3) and result.mean("format") == pytest.approx(1 / 3)


def test_score_checks_batch_shapes() -> None:
    reward = build_reward("char_fraction")
    with pytest.raises(ValueError, match="2 completions but 1 records"):
        reward.score(["a", "b"], [REC])
    with pytest.raises(ValueError, match="1 token counts for 2 completions"):
        reward.score(["a", "b"], [REC, REC], num_tokens=[1])
    assert reward.score([], []).total == ()
