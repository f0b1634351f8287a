"""What verl's init leaves on a colocated GPU when the rollout engine measures it (memory/context.py
`engine_start_resident_bytes`): the actor's parameters under param_offload before verl 0fb0bedb7 (#1118), the
reference never from fefca4172 (#121) on (through the estimate: planner/ref_offload.py), for vLLM's 'device' and
'free' budgets and SGLang alike."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.from_verl import verl_launch
from grpo_pilot.planner.memory.context import engine_start_resident_bytes

GIB = 2**30
OVERHEADS = {"overhead_cuda_context": GIB // 2, "overhead_nccl": GIB // 4}
A = "actor_rollout_ref."


def resident(*, param_offload: bool, ref_bytes: int = 0, **knobs: Any) -> int:
    return engine_start_resident_bytes(
        Knobs(**knobs),
        master_bytes=7 * GIB,
        param_offload=param_offload,
        trainer_overheads=OVERHEADS,
        split=False,
        ref_bytes=ref_bytes,
    )


@pytest.mark.parametrize("memory", ["device", "free"])
def test_the_actor_counts_under_param_offload_only_before_1118(memory: str) -> None:
    base = sum(OVERHEADS.values())
    # today's verl offloads the actor in init_model before _build_rollout, under either budget
    assert resident(param_offload=True, vllm_memory=memory) == base
    # verl before #1118 moved only the gradients at init: the fp32 shard stays whatever param_offload
    assert resident(param_offload=True, vllm_memory=memory, actor_offload_at_init=False) == base + 7 * GIB
    # without param_offload the shard is there in every verl
    assert resident(param_offload=False, vllm_memory=memory) == base + 7 * GIB
    # SGLang measures free memory at its start: the same
    old = resident(param_offload=True, rollout_backend="sglang", actor_offload_at_init=False)
    assert old == base + 7 * GIB


@pytest.mark.parametrize("memory", ["device", "free"])
def test_the_reference_counts_as_its_caller_gives_it(memory: str) -> None:
    """The caller passes the reference's shard only where it is on the GPU (planner/ref_offload.py: verl's FSDP
    reference since #121 never is, whatever ref.param_offload); the #121 dating itself is checked through the
    estimate below and in tests/planner/test_ref_offload.py."""
    base = sum(OVERHEADS.values())
    assert resident(param_offload=True, ref_bytes=3 * GIB, vllm_memory=memory) == base + 3 * GIB
    assert resident(param_offload=True, ref_bytes=0, vllm_memory=memory) == base


def test_an_engine_measuring_its_own_memory_counts_none_of_it() -> None:
    k = {"actor_offload_at_init": False, "ref_forced_cpu_offload": False}
    assert resident(param_offload=False, ref_bytes=3 * GIB, vllm_memory="instance", **k) == 0


def test_the_kv_cache_shrinks_by_the_actor_shard_before_1118(est: Any) -> None:
    """7B on 2 H800 under vllm_memory=device, param_offload: the engine of a verl before #1118 gets the
    actor's fp32 shard (7.6e9 params × 4 bytes / 2 GPUs) less KV cache."""
    knobs = dict(param_offload=True, optimizer_offload=True, vllm_memory="device", gpu_memory_utilization=0.6)
    w = Workload(use_kl_loss=True)
    today = est("qwen2-7b", "2xH800", target="verl", workload=w, **knobs)
    old = est("qwen2-7b", "2xH800", target="verl", workload=w, actor_offload_at_init=False, **knobs)
    shard = old.phases["update"].items["actor_params"]  # loaded back for the update
    assert shard > 14 * GIB  # fp32, sharded over 2
    assert today.kv_cache_bytes_per_gpu - old.kv_cache_bytes_per_gpu == shard
    # ... and a pre-#121 reference (bf16, its param_offload off) takes its shard as well
    older = est("qwen2-7b", "2xH800", target="verl", workload=w, ref_forced_cpu_offload=False, **knobs)
    ref = older.phases["log_prob"].items["ref_params"]
    assert 2 * ref == shard and today.kv_cache_bytes_per_gpu - older.kv_cache_bytes_per_gpu == ref


LAUNCH = {
    "algorithm.adv_estimator": "grpo",
    "data.train_batch_size": "8",
    "data.max_prompt_length": "400",
    "data.max_response_length": "2048",
    A + "model.path": "m",
    A + "actor.ppo_mini_batch_size": "8",
    A + "actor.ppo_micro_batch_size_per_gpu": "4",
    A + "actor.use_kl_loss": "True",
    A + "actor.fsdp_config.param_offload": "True",
    A + "rollout.log_prob_micro_batch_size_per_gpu": "8",
    A + "ref.log_prob_micro_batch_size_per_gpu": "8",
    A + "rollout.n": "4",
    "trainer.n_gpus_per_node": "4",
}


def test_from_verl_dates_the_init_offloads() -> None:
    """The launch's verl sets both knobs: before #121 neither, between #121 and #1118 the reference only."""
    old = verl_launch(LAUNCH, version="0.1")
    assert (old.knobs["actor_offload_at_init"], old.knobs["ref_forced_cpu_offload"]) == (False, False)
    # vendored vLLM worker (vllm_memory=free): both on the GPU when it measures, and said so
    assert old.knobs["vllm_memory"] == "free"
    assert any(n.startswith("actor_offload_at_init = false") for n in old.notes)
    assert any(n.startswith("ref_forced_cpu_offload = false") for n in old.notes)
    mid = verl_launch(LAUNCH, {"VLLM_VERSION": "0.8.3"}, version="0.3.0.post1")
    assert (mid.knobs["actor_offload_at_init"], mid.knobs["ref_forced_cpu_offload"]) == (False, True)
    assert mid.knobs["vllm_memory"] == "device"
    new = verl_launch(LAUNCH, {"VLLM_VERSION": "0.8.3"}, version="0.4.1")
    assert (new.knobs["actor_offload_at_init"], new.knobs["ref_forced_cpu_offload"]) == (True, True)
    assert not any("actor_offload_at_init" in n for n in new.notes)


def test_a_window_across_1118_plans_todays_verl_with_a_note() -> None:
    keys = LAUNCH | {"algorithm.use_kl_in_reward": "False"}  # dates the verl at or after 2025-04-01 only
    launch = verl_launch(keys, {"VLLM_VERSION": "0.8.3"})
    assert launch.knobs["actor_offload_at_init"] is True
    assert any("--pin actor_offload_at_init=false" in n and "#1118" in n for n in launch.notes)
    # an engine that measures only itself: nothing to say
    quiet = verl_launch(keys)
    assert quiet.knobs["vllm_memory"] == "instance"
    assert not any("actor_offload_at_init" in n for n in quiet.notes)
