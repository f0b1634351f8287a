"""User reward functions: per-completion and batched shapes, detection, loading and failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_pilot.engine.data import PromptRecord
from grpo_pilot.engine.rewards import batched_reward, build_reward
from grpo_pilot.engine.rewards.user import is_batched
from grpo_pilot.errors import InputError, RunError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data" / "my_reward.py"
RECS = [PromptRecord(line=1, prompt="p", answer="42"), PromptRecord(line=2, prompt="p", answer="7")]


def test_example_file_functions_single_and_batched() -> None:
    single = build_reward(f"{EXAMPLE}:short_answer")
    assert single.score(["x" * 20, "x" * 70], RECS).total == (1.0, 0.5)
    batched = build_reward(f"{EXAMPLE}:mentions_answer=2")
    result = batched.score(["it is 42", "it is 8"], RECS)
    assert result.total == (2.0, 0.0) and result.parts == {f"{EXAMPLE}:mentions_answer": (1.0, 0.0)}


def test_module_reference_combined_with_a_builtin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rewards_mod_h4.py").write_text("def has_q(completion, record):\n    return 'q' in completion\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = build_reward("rewards_mod_h4:has_q=0.5,char_fraction:char=q")
    result = reward.score(["qq", "ab"], RECS)
    assert result.parts == {"rewards_mod_h4:has_q": (1.0, 0.0), "char_fraction": (1.0, 0.0)}
    assert result.total == (1.5, 0.0)


def test_batched_detection() -> None:
    def by_name(completions, records):
        return [0.0] * len(completions)

    def by_annotation(texts_in: list[str], recs: list) -> list[float]:
        return [0.0] * len(texts_in)

    def by_string_annotation(x: "Sequence[str]", y):  # noqa: F821 - a postponed annotation
        return [0.0]

    def single(completion: str, record) -> float:
        return 0.0

    @batched_reward
    def marked(a, b):
        return [0.0] * len(a)

    single.batched = False  # an explicit attribute wins over the signature
    assert [is_batched(f) for f in (by_name, by_annotation, by_string_annotation, single, marked)] == [
        True,
        True,
        True,
        False,
        True,
    ]


def write_module(tmp_path: Path, body: str, name: str = "user_reward") -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return str(path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "def f(completion, record):\n    return 1 / 0\n",
            "raised ZeroDivisionError: division by zero on the completion for prompt line 1",
        ),
        ("def f(completion, record):\n    return 'high'\n", "returned 'high' for completion 0"),
        ("def f(completion, record):\n    return float('nan')\n", "returned nan for completion 0"),
        ("def f(completions, records):\n    return [1.0]\n", "returned 1 scores for 2 completions"),
        ("def f(completions, records):\n    return 3.0\n", "returned float, not a list of numbers"),
    ],
)
def test_failures_at_score_time_are_run_errors(tmp_path: Path, body: str, message: str) -> None:
    reward = build_reward(write_module(tmp_path, body) + ":f")
    with pytest.raises(RunError) as info:
        reward.score(["a", "b"], RECS)
    assert message in info.value.message


def test_bad_signatures_and_references_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot be called with two arguments"):
        build_reward(write_module(tmp_path, "def f(completion):\n    return 1.0\n") + ":f")
    with pytest.raises(InputError, match="is a int, not a function"):
        build_reward(write_module(tmp_path, "f = 3\n", name="not_callable") + ":f")


def test_numpy_and_bool_results_are_accepted(tmp_path: Path) -> None:
    body = "import numpy as np\n\ndef f(completions, records):\n    return np.array([True, False])\n"
    assert build_reward(write_module(tmp_path, body) + ":f").score(["a", "b"], RECS).total == (1.0, 0.0)
