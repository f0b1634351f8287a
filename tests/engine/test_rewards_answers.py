"""exact_match: final-answer extraction (boxed, ####, last number) and tolerant comparison."""

from __future__ import annotations

import pytest

from grpo_pilot.engine.data import PromptRecord
from grpo_pilot.engine.rewards import answers_match, build_reward, completion_answer, parse_number
from grpo_pilot.errors import InputError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so x = 3 and \boxed{\frac{1}{2}} hence", r"\frac{1}{2}"),
        (r"\boxed{1} then \boxed{ {a}+{b} }", "{a}+{b}"),
        (r"\boxed{unclosed then 7", "7"),
        ("step 1: 40 + 2\n#### 42\nthanks", "42"),
        ("I have 3 apples and 1,250 pears.", "1,250"),
        ("pages 3-5", "5"),
        ("it is -12.5 degrees", "-12.5"),
        ("list 1,2,3", "3"),
        ("no digits here", None),
    ],
)
def test_completion_answer_extraction(text: str, expected: str | None) -> None:
    assert completion_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,000", 1000.0),
        ("1000.0", 1000.0),
        ("$1,000.50", 1000.5),
        ("50%", 50.0),
        ("3/4", 0.75),
        (r"\frac{3}{4}", 0.75),
        (r"-\dfrac{1}{8}", -0.125),
        (r"\text{12}", 12.0),
        ("7.", 7.0),
        ("1e3", 1000.0),
    ],
)
def test_parse_number_formats(text: str, value: float) -> None:
    assert parse_number(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "1/0", "1,00", "x=3", "nan"])
def test_parse_number_rejects_non_numbers(text: str) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize(
    ("predicted", "reference", "equal"),
    [
        ("1,000", "1000.0", True),
        ("1000", "#### 1,000", True),
        ("0.75", r"The answer is \boxed{\frac{3}{4}}", True),
        ("72", "Natalia sold 48 + 24 = 72 clips.\n#### 72", True),
        ("71", "#### 72", False),
        ("1000.01", "1000", False),
        ("1000.0000001", "1000", True),
        ("Paris", "paris.", True),
        (r"\text{Paris}", "Paris", True),
        ("x + 1", "x+1", True),
        ("London", "Paris", False),
        (None, "1", False),
    ],
)
def test_answers_match(predicted: str | None, reference: str, equal: bool) -> None:
    assert answers_match(predicted, reference) is equal


def test_exact_match_reward_scores_a_batch() -> None:
    reward = build_reward("exact_match")
    records = [PromptRecord(line=1, prompt="q", answer="#### 1,000"), PromptRecord(line=2, prompt="q", answer="42")]
    completions = [r"Thinking... the total is \boxed{1000}.", "It is 41, no wait, 43"]
    result = reward.score(completions, records)
    assert result.total == (1.0, 0.0) and result.parts == {"exact_match": (1.0, 0.0)}


def test_exact_match_tolerance_option() -> None:
    record = PromptRecord(line=1, prompt="q", answer="3.14159")
    assert build_reward("exact_match").score(["3.1416"], [record]).total == (0.0,)
    assert build_reward("exact_match:rel_tol=1e-4").score(["3.1416"], [record]).total == (1.0,)


def test_exact_match_without_answers_names_the_lines() -> None:
    reward = build_reward("exact_match")
    records = [PromptRecord(line=4, prompt="q", answer="1"), PromptRecord(line=9, prompt="q")]
    with pytest.raises(InputError, match=r"line\(s\) 9 have none"):
        reward.check_records(records)
    with pytest.raises(InputError, match=r"line\(s\) 9 have none"):
        reward.score(["1", "1"], records)
    assert reward.required_fields == frozenset({"answer"})
