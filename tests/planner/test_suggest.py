"""Suggestions are computed with the estimator: each one is checked to actually fit (and be minimal)."""

from __future__ import annotations

import re

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import PlanInputs, assess, model_ref
from grpo_pilot.planner.search import search
from grpo_pilot.planner.suggest import first_fit, suggest
from grpo_pilot.profiles import resolve_model


def inputs(model: str, gpus: str, **kw) -> PlanInputs:
    return PlanInputs(model=model_ref(resolve_model(model)), cluster=parse_cluster(gpus), **kw)


def test_offload_suggestion_for_a_pinned_config_fits() -> None:
    inp = inputs("qwen-32b", "8xA100-80G")
    failed = assess(inp, Knobs())
    assert not failed.fits
    out = suggest(inp, failed, pins={"param_offload": False})
    assert out[0].startswith("turning on param_offload, optimizer_offload, ref_param_offload fits")
    on = assess(inp, Knobs(param_offload=True, optimizer_offload=True, ref_param_offload=True))
    assert on.fits and f"peak {on.memory.peak_gpu_bytes / 2**30:.1f} GiB" in out[0]


def test_fewest_gpus_is_minimal() -> None:
    inp = inputs("llama-70b", "1xA100-80G")
    result = search(inp, trials=20)
    assert not result.best.fits
    out = suggest(inp, result.best)
    line = next(s for s in out if s.startswith("fewest"))
    count = int(re.search(r"fit: (\d+) ", line).group(1))
    label = re.search(r"--gpus (\S+)\)", line).group(1)
    assert first_fit(inputs("llama-70b", label), {}) is not None
    smaller = {2: "1xA100-80G", 4: "2xA100-80G", 8: "4xA100-80G", 16: "8xA100-80G"}[count]
    assert first_fit(inputs("llama-70b", smaller), {}) is None


def test_longest_response_fits_and_one_more_token_does_not() -> None:
    w = Workload(prompts_per_step=64, mini_batch_prompts=16, n=4, prompt_len_tokens=256, response_len_tokens=65536)
    inp = inputs("qwen2.5-0.5b", "1xL4", workload=w)
    failed = search(inp, trials=10).best
    assert not failed.fits
    line = next(s for s in suggest(inp, failed) if s.startswith("responses of up to"))
    n = int(re.search(r"up to (\d+) tokens", line).group(1))

    def fits(length: int) -> bool:
        shorter = inp.model_copy(update={"workload": w.model_copy(update={"response_len_tokens": length})})
        return first_fit(shorter, {}) is not None

    assert fits(n) and not fits(n + 1)


def test_host_ram_suggestion_when_host_ram_binds() -> None:
    inp = inputs("qwen-72b", "8xA100-80G")
    result = search(inp, trials=20)
    assert not result.best.fits and result.best.memory.host.total_bytes > inp.cluster.host_ram_bytes_per_node
    line = next(s for s in suggest(inp, result.best) if "host RAM" in s)
    need = int(re.search(r"--host-ram (\d+)GiB", line).group(1))
    roomy = inp.model_copy(update={"cluster": inp.cluster.model_copy(update={"host_ram_bytes_per_node": need * 2**30})})
    assert first_fit(roomy, {}) is not None


def test_pins_that_cannot_fit_get_unpinned_suggestions() -> None:
    inp = inputs("qwen-72b", "8xA100-80G")
    pins = {"rollout_tp": 2, "gpu_memory_utilization": 0.5}  # 72B / TP 2 = 68 GiB of weights: never fits
    failed = search(inp, pins=pins, trials=10).best
    out = suggest(inp, failed, pins)
    assert out and all(s.startswith("without the pinned knobs") for s in out)


def test_nothing_found_says_only_what_was_checked() -> None:
    """72B on one 24 GB L4: more L4s would not fit either (within 64 nodes), and neither do 1-token
    responses; the sentence says exactly those two things, computed."""
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.planner.evaluate import PlanInputs, assess, model_ref
    from grpo_pilot.planner.suggest import suggest
    from grpo_pilot.profiles import resolve_model

    w = Workload(prompts_per_step=64, mini_batch_prompts=64, n=8)
    inputs = PlanInputs(model=model_ref(resolve_model("qwen2.5-72b")), cluster=parse_cluster("1xL4"), workload=w)
    (only,) = suggest(inputs, assess(inputs, Knobs(rollout_tp=1)), {})
    assert "not even 1-token responses fit" in only


def test_a_launch_other_knobs_fit_is_told_so_with_the_frugal_knobs_that_do() -> None:
    """A launch evaluated as written (no pins: `grpo-plan --from-verl`) whose own micro-batch is too big while
    offload plus a micro-batch of 1 fits: neither offloads alone nor more GPUs nor shorter responses are the
    answer, and "nothing found" would be false — the suggestion names the frugal knobs and their peak."""
    inp = inputs("qwen2.5-7b", "8xH100", workload=Workload(response_len_tokens=4096))
    failed = assess(inp, Knobs(micro_batch_size_per_gpu=64, gradient_checkpointing=False))
    assert not failed.fits
    (only,) = suggest(inp, failed, {})
    fit = first_fit(inp, {})
    assert fit is not None and fit.fits
    assert only.startswith("other knobs fit on 8xH100-80G")
    assert f"peak at {fit.memory.peak_gpu_bytes / 2**30:.1f} of" in only
    assert f"micro_batch_size_per_gpu={fit.knobs.micro_batch_size_per_gpu}" in only
