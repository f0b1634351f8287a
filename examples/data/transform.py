"""Example data transform for `load_prompts(..., transform="examples/data/transform.py:to_prompt")`.

Maps a dataset's own field names to the prompt/answer format; returning None drops a line.
"""


def to_prompt(raw: dict) -> dict | None:
    if not raw.get("question", "").strip():
        return None  # nothing to ask: drop the line (counted in PromptSet.dropped)
    return {"prompt": raw["question"], "answer": raw["solution"], "difficulty": raw.get("difficulty")}
