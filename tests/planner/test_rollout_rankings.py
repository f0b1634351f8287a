"""Rollout TP choices ranked as measured: more, smaller replicas win until KV capacity runs out.

HybridFlow (the verl paper, arXiv 2409.19256 §8.4, as summarised in reference/tuning.md and cited by verl's
docs/perf/perf_tuning.rst@049776086db07d115422ffeb8f3c1c04d4aa02e0, "Use a smaller tensor_parallel_size"):
on 16 A100s, generation with TP 2 for a 7B model and TP 4 for a 13B model took 60% and 36% less time
than TP 8, and a still smaller TP lost again because each GPU must hold more KV cache.

The paper's text was not available to check its setup, so the rollout is evaluated over stated
assumptions, not fitted ones: Llama-2-7B / 13B shapes (their published config.json), 1,024 prompts of
1,024 tokens with 1,024-token responses, the vLLM of its time (the V0 engine; eager mode, verl's
default then; vLLM's default max_num_seqs of 256), and a vLLM budget for weights + KV cache of 40-50 GiB
per A100-80G (the rest of the GPU holds the colocated training states), over which the ranking must
hold. The model's mechanisms: TP 8 runs two replicas of 512 sequences, 256 at a time (two waves), each
replica's V0 engine processing every running sequence's output on one CPU process; TP 1 and TP 2 hold
the weights 8× and 4× over and run fewer sequences at once.
"""

from __future__ import annotations

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import PlanInputs, assess, model_ref
from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token_per_gpu
from grpo_pilot.planner.rollout_time import rollout_time_s
from grpo_pilot.profiles import resolve_model
from grpo_pilot.profiles.spec import spec_from_hf_config
from grpo_pilot.units import GiB

LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}
LLAMA2_13B = dict(
    LLAMA2_7B,
    hidden_size=5120,
    intermediate_size=13824,
    num_hidden_layers=40,
    num_attention_heads=40,
    num_key_value_heads=40,
)
HYBRIDFLOW = Workload(
    prompts_per_step=1024,
    mini_batch_prompts=1024,
    n=1,
    prompt_len_tokens=1024,
    response_len_tokens=1024,
    prompt_len_std_tokens=0,
    response_len_std_tokens=0,
)


def _generation_s(config: dict, tp: int, budget_gib: int) -> float:
    spec = spec_from_hf_config(config, "llama-2")
    kv_tokens = int((budget_gib * GiB - 2 * spec.num_params / tp) // kv_bytes_per_token_per_gpu(spec, tp))
    knobs = Knobs(rollout_tp=tp, max_num_seqs=256, enforce_eager=True, vllm_engine="v0")
    return rollout_time_s(spec, parse_cluster("2x8xA100-80G"), HYBRIDFLOW, knobs, kv_cache_tokens_per_gpu=kv_tokens)


@pytest.mark.parametrize("budget_gib", [40, 45, 50])
def test_hybridflow_7b_generates_fastest_at_tp2(budget_gib: int) -> None:
    t = {tp: _generation_s(LLAMA2_7B, tp, budget_gib) for tp in (1, 2, 4, 8)}
    assert t[2] == min(t.values()), t
    assert t[1] > t[2] and t[8] > t[2]  # KV capacity on one side, two waves and a busier engine on the other
    # measured: TP 8 took 1 / (1 - 0.60) = 2.5x TP 2's time; predicted within 2x of that speed-up
    assert 2.5 / 2 <= t[8] / t[2] <= 2.5 * 2, t


@pytest.mark.parametrize("budget_gib", [40, 45, 50])
def test_hybridflow_13b_generates_fastest_at_tp4(budget_gib: int) -> None:
    t = {tp: _generation_s(LLAMA2_13B, tp, budget_gib) for tp in (1, 2, 4, 8)}
    assert t[4] == min(t.values()), t
    # measured: TP 8 took 1 / (1 - 0.36) = 1.56x TP 4's time
    assert 1.56 / 2 <= t[8] / t[4] <= 1.56 * 2, t


@pytest.mark.parametrize("response_mean", [1000, 2000, 4000])
def test_smaller_tp_wins_where_decode_is_compute_bound(response_mean: int) -> None:
    """On 16 H20s (148 TFLOP/s beside 4 TB/s) a 7B model's decode is compute-bound at these batches: the
    GEMMs cost the same at any TP, while TP adds two all-reduces per layer, the logits all-gather and a
    sampler every rank runs over the replica's whole batch. With ample KV (offloaded trainer,
    gpu_memory_utilization 0.8: the DAPO 7B recipe's settings) TP 1 beats TP 2 beats TP 4."""
    resolved = resolve_model("qwen2.5-math-7b")
    workload = Workload(
        prompts_per_step=512,
        mini_batch_prompts=32,
        n=16,
        prompt_len_tokens=2048,
        response_len_tokens=8192,
        prompt_len_mean_tokens=200,
        response_len_mean_tokens=response_mean,
        use_kl_loss=False,
    )
    inputs = PlanInputs(model=model_ref(resolved), cluster=parse_cluster("2x8xH20"), workload=workload, target="verl")
    times = []
    for tp in (1, 2, 4):
        knobs = Knobs(
            rollout_tp=tp,
            gpu_memory_utilization=0.8,
            param_offload=True,
            optimizer_offload=True,
            ref_param_offload=True,
        )
        times.append(assess(inputs, knobs).time.phases_s["rollout"])
    assert times == sorted(times) and times[0] < times[-1], times
