"""planner/verdict.py under unknown lengths: the boundary on the mean response with prompts at their maximum, the
joint boundary on both means where prompts bind alone, and "even at the shortest" only where that was computed.

Each boundary is re-assessed here at the lengths it names (it fits) and one step further (it does not)."""

from __future__ import annotations

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import PlanInputs, assess, model_ref
from grpo_pilot.planner.verdict import mean_lengths_boundary, scale_steps, scaled_means, verdict_of
from grpo_pilot.profiles import resolve_model

# verl, one H100, 32 sequences per update and log-prob micro-batch: the packed micro-batch (32 × (P + R) tokens,
# every position scored) holds 32 × 8192 prompt tokens even at 1-token responses
KNOBS = Knobs(
    micro_batch_size_per_gpu=32, max_token_len_per_gpu=None, log_prob_micro_batch_size_per_gpu=32, rollout_tp=1
)
LONG_PROMPTS = Workload(
    prompt_len_tokens=8192, response_len_tokens=2048, prompts_per_step=64, n=8, mini_batch_prompts=64
)


def _inputs(workload: Workload, model: str = "qwen2.5-0.5b", gpus: str = "1xH100") -> PlanInputs:
    return PlanInputs(
        model=model_ref(resolve_model(model)),
        cluster=parse_cluster(gpus),
        workload=workload,
        target="verl",
        headroom_fraction=0.0,
    )


def _fits(inputs: PlanInputs, *, prompt: float | None, response: float, knobs: Knobs = KNOBS) -> bool:
    w = inputs.workload.model_copy(update={"prompt_len_mean_tokens": prompt, "response_len_mean_tokens": response})
    return assess(inputs.model_copy(update={"workload": w}), knobs).fits


def test_prompts_that_bind_alone_get_a_boundary_on_both_means() -> None:
    inputs = _inputs(LONG_PROMPTS)
    a = assess(inputs, KNOBS)
    assert not a.fits and not _fits(inputs, prompt=None, response=1)  # prompts at their maximum bind alone
    verdict = verdict_of(inputs, a)
    assert verdict.kind == "fits_below_mean_lengths" and not verdict.lengths_known
    prompt, response = verdict.boundary_mean_prompt_tokens, verdict.boundary_mean_response_tokens
    assert 1 <= prompt < 8192 and 1 <= response < 2048
    assert abs(prompt / 8192 - response / 2048) <= 1 / 2048  # one scale for both (rounded down)
    assert _fits(inputs, prompt=prompt, response=response)  # the boundary fits when re-assessed ...
    assert not _fits(inputs, prompt=prompt + 1, response=(prompt + 1) / 4)  # ... one prompt token more does not
    assert (
        f"mean prompt of up to {prompt}" in verdict.message and f"mean response of up to {response}" in verdict.message
    )
    assert "8192/2048" in verdict.message and "even at the shortest" not in verdict.message


def test_the_joint_scale_runs_from_one_token_to_the_maxima() -> None:
    assert scale_steps(LONG_PROMPTS) == 8192
    assert scaled_means(LONG_PROMPTS, 1) == (1.0, 1.0)
    assert scaled_means(LONG_PROMPTS, 4096) == (4096.0, 1024.0)
    assert scaled_means(LONG_PROMPTS, 8192) == (8192.0, 2048.0)
    longer_responses = Workload(prompt_len_tokens=512, response_len_tokens=4096)
    assert scaled_means(longer_responses, 2048) == (256.0, 2048.0)  # one step = one token on the longer mean


def test_the_response_boundary_with_prompts_at_their_maximum_comes_first() -> None:
    """Where some mean response fits with prompts at their maximum, that boundary is the verdict (the joint search
    does not run), and it says it rests on prompts at their maximum."""
    w = LONG_PROMPTS.model_copy(update={"prompt_len_tokens": 6144})
    inputs = _inputs(w)
    a = assess(inputs, KNOBS)
    verdict = verdict_of(inputs, a)
    assert verdict.kind == "fits_below_mean_response" and verdict.boundary_mean_prompt_tokens is None
    n = verdict.boundary_mean_response_tokens
    assert _fits(inputs, prompt=None, response=n) and not _fits(inputs, prompt=None, response=n + 1)
    assert "with prompts at their maximum (6144)" in verdict.message


@pytest.mark.parametrize(("model", "gpus"), [("qwen2.5-7b", "1xL4"), ("qwen2.5-14b", "1xH100")])
def test_a_job_that_fits_at_no_length_reads_even_at_the_shortest(model: str, gpus: str) -> None:
    knobs = KNOBS.model_copy(update={"param_offload": False, "optimizer_offload": False})
    inputs = _inputs(LONG_PROMPTS, model, gpus)
    a = assess(inputs, knobs)
    assert not _fits(inputs, prompt=1, response=1, knobs=knobs)  # computed: 1-token means do not fit
    assert mean_lengths_boundary(inputs, knobs) is None
    verdict = verdict_of(inputs, a)
    assert (
        verdict.kind == "does_not_fit" and verdict.message == "does not fit even at the shortest prompts and responses"
    )
    assert verdict.boundary_mean_prompt_tokens is None and verdict.boundary_mean_response_tokens is None


def test_known_lengths_get_no_boundary() -> None:
    inputs = _inputs(
        LONG_PROMPTS.model_copy(update={"prompt_len_mean_tokens": 8000.0, "response_len_mean_tokens": 8.0})
    )
    verdict = verdict_of(inputs, assess(inputs, KNOBS))
    assert verdict.kind == "does_not_fit" and verdict.lengths_known and verdict.message == "does not fit"
