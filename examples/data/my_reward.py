"""Example user reward functions for `build_reward("examples/data/my_reward.py:short_answer")`.

A per-completion function takes (completion, record) and returns a float; a batched one takes
(completions, records) and returns one float per completion.
"""


def short_answer(completion: str, record) -> float:
    """1.0 for completions of at most 20 characters, falling linearly to 0.0 at 120."""
    excess = max(0, len(completion) - 20)
    return max(0.0, 1.0 - excess / 100)


def mentions_answer(completions: list[str], records: list) -> list[float]:
    """Batched: 1.0 when the reference answer appears verbatim in the completion."""
    return [1.0 if r.answer and r.answer in c else 0.0 for c, r in zip(completions, records)]
