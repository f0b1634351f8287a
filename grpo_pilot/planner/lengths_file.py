"""Length statistics from what a run or a dataset really holds (`--lengths`, `--lengths-from`).

- `lengths.jsonl`: one JSON object per generated sample, `{"prompt_tokens": int, "response_tokens": int}`
  (extra keys such as `step` are ignored) — what `grpo-run` writes to its output directory.
- a dataset's prompts, measured with a tokenizer (cli/plan_inputs.py does the tokenizing, through the engine's
  own loader and renderer): prompt lengths only.

`LengthStats` summarises either; `workload_fields` turns it into `Workload` fields (means, standard
deviations, the longest response as the rollout's tail, the maxima when the user gave none).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from grpo_pilot.errors import InputError
from grpo_pilot.inputs import JsonProblem, parse_json, read_input_text
from grpo_pilot.planner.config import MAX_SEQUENCE_TOKENS


class LengthStats(NamedTuple):
    """Sample statistics of prompt and response lengths (tokens); response fields are None when unknown."""

    count: int
    prompt_mean: float
    prompt_std: float
    prompt_max: int
    response_mean: float | None = None
    response_std: float | None = None
    response_max: int | None = None


def _mean_std(values: Sequence[int]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return mean, math.sqrt(var)


def stats_of(prompts: Sequence[int], responses: Sequence[int] | None = None) -> LengthStats:
    """Mean, standard deviation and maximum of the prompt (and response) lengths."""
    if not prompts:
        raise InputError("No lengths to summarise.", "Pass a file with at least one sample.")
    pm, ps = _mean_std(prompts)
    if not responses:
        return LengthStats(len(prompts), pm, ps, max(prompts))
    rm, rs = _mean_std(responses)
    return LengthStats(len(prompts), pm, ps, max(prompts), rm, rs, max(responses))


def _count(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQUENCE_TOKENS:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:20]}… ({len(repr(value))} characters)"
        raise InputError(
            f"{where}: '{key}' must be a non-negative integer token count of at most {MAX_SEQUENCE_TOKENS:,}, "
            f"got {shown}.",
            'Each line of a lengths file is {"prompt_tokens": int, "response_tokens": int} (grpo-run writes '
            "lengths.jsonl in its output directory).",
        )
    return value


def read_lengths_jsonl(path: str | Path) -> LengthStats:
    """Read a `lengths.jsonl` file (see module docstring); bad input is an `InputError` naming the line."""
    p = Path(path)
    hint = (
        'Each line is {"prompt_tokens": int, "response_tokens": int}; grpo-run writes one per generated '
        "sample to lengths.jsonl in its output directory."
    )
    lines = read_input_text(p, "lengths file", max_bytes=None, hint=hint).splitlines()  # regular UTF-8 files only
    prompts: list[int] = []
    responses: list[int] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{p}:{number}"
        try:
            row = parse_json(line)
        except JsonProblem as exc:
            raise InputError(f"{where} is not valid JSON ({exc}).", hint) from None
        if not isinstance(row, dict) or "prompt_tokens" not in row or "response_tokens" not in row:
            raise InputError(f"{where} has no prompt_tokens / response_tokens.", hint)
        prompts.append(_count(row["prompt_tokens"], "prompt_tokens", where))
        responses.append(_count(row["response_tokens"], "response_tokens", where))
    if not prompts:
        raise InputError(f"The lengths file '{p}' has no samples.", hint)
    return stats_of(prompts, responses)


def workload_fields(
    stats: LengthStats, prompt_cap: int | None, response_cap: int | None, source: str
) -> dict[str, Any]:
    """Workload fields from sample statistics. The caps (max prompt / response length of the run) default
    to the largest observed; observed lengths above a given cap are an input error (the file comes from
    a run with other limits)."""
    out: dict[str, Any] = {"lengths_source": source}
    p_cap = prompt_cap if prompt_cap is not None else stats.prompt_max
    if stats.prompt_max > p_cap:
        raise InputError(
            f"{source} holds prompts of up to {stats.prompt_max} tokens, above --prompt-len {p_cap}.",
            "Raise --prompt-len to the run's max prompt length, or measure data filtered to it.",
        )
    out.update(
        prompt_len_tokens=max(1, p_cap),
        prompt_len_mean_tokens=max(1.0, min(stats.prompt_mean, p_cap)),
        prompt_len_std_tokens=stats.prompt_std,
    )
    if stats.response_mean is not None and stats.response_max is not None:
        r_cap = response_cap if response_cap is not None else stats.response_max
        if stats.response_max > r_cap:
            raise InputError(
                f"{source} holds responses of up to {stats.response_max} tokens, above --response-len {r_cap}.",
                "Raise --response-len to the run's max response length.",
            )
        out.update(
            response_len_tokens=max(1, r_cap),
            response_len_mean_tokens=max(1.0, min(stats.response_mean, r_cap)),
            response_len_std_tokens=stats.response_std,
            response_tail_tokens=max(1, stats.response_max),
        )
    elif response_cap is not None:
        out["response_len_tokens"] = response_cap
    return out
