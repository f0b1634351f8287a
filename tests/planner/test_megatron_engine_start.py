"""What verl's Megatron init leaves on a colocated GPU when the rollout engine measures it
(memory/megatron_phases.py `engine_start_held_bytes`, through memory/context.py `engine_start_resident_bytes`):
the reference's TP × PP shard unless `ref.megatron.param_offload` (megatron_workers.py init_model offloads it only
then; ray_trainer.init_workers builds it before the actor and rollout), the optimizer's fp32 main params unless
optimizer_offload (built with the optimizer, offloaded at init only under it), the actor's params and grad buffer
unless param_offload. Each one moves the KV cache of vLLM's 'device' budget by exactly its bytes ('free': by the
utilization's share of them), and none of them moves an engine that measures only its own memory ('instance')."""

from __future__ import annotations

import pytest

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.memory.megatron import megatron_state_bytes, stage_params
from grpo_pilot.planner.memory.megatron_phases import megatron_parallel
from grpo_pilot.planner.memory.shape import shape_of
from tests.planner.conftest import cluster, spec

QWEN7 = spec("qwen2.5-7b")
H100x8 = cluster("8xH100")
BASE = {"strategy": "megatron", "megatron_tp": 4, "megatron_pp": 2, "param_offload": True, "optimizer_offload": True}


def _kv(workload: Workload = Workload(use_kl_loss=True), **knobs: object) -> int:
    report = estimate_memory(QWEN7, H100x8, workload, Knobs(**{**BASE, **knobs}), target="verl")
    return report.phases["rollout"].items["vllm_kv_cache"]


def _first_stage(**knobs: object):
    par = megatron_parallel(Knobs(**{**BASE, **knobs}), 8)
    params = stage_params(shape_of(QWEN7), par, 0)
    return megatron_state_bytes(params, par), megatron_state_bytes(params, par, trainable=False)


@pytest.mark.parametrize("memory", ["device", "free"])
def test_a_resident_reference_shrinks_the_kv_cache_by_its_shard(memory: str) -> None:
    _, ref = _first_stage()
    assert ref.params_bytes > 2**30  # 7B over TP 4 × PP 2 in bf16: about 1.9 GiB
    offloaded = _kv(vllm_memory=memory, ref_param_offload=True)
    resident = _kv(vllm_memory=memory, ref_param_offload=False)
    # 'device' bounds everything on the GPU by utilization × device; 'free' takes utilization × what is free
    share = 1.0 if memory == "device" else Knobs().gpu_memory_utilization
    assert offloaded - resident == pytest.approx(share * ref.params_bytes, abs=1)
    # without a reference model (no KL loss) there is nothing to count, whatever the key
    no_ref = _kv(Workload(use_kl_loss=False), vllm_memory=memory, ref_param_offload=False)
    assert no_ref == offloaded


def test_the_optimizers_main_params_count_unless_offloaded() -> None:
    actor, _ = _first_stage()
    kept = _kv(vllm_memory="device", ref_param_offload=True, optimizer_offload=False)
    moved = _kv(vllm_memory="device", ref_param_offload=True, optimizer_offload=True)
    assert moved - kept == actor.master_bytes  # fp32 main params only: Adam's moments appear at the first step


def test_the_actor_counts_unless_offloaded_at_init_whatever_the_fsdp_era_knob() -> None:
    actor, _ = _first_stage()
    on = _kv(vllm_memory="device", ref_param_offload=True, param_offload=False)
    off = _kv(vllm_memory="device", ref_param_offload=True, param_offload=True)
    assert off - on == actor.params_bytes + actor.grads_bytes
    # actor_offload_at_init dates FSDP's #1118; Megatron's init offloaded the actor since its offload exists (#1162)
    assert _kv(vllm_memory="device", ref_param_offload=True, actor_offload_at_init=False) == off


def test_an_engine_measuring_its_own_memory_counts_none_of_it() -> None:
    everything = {"ref_param_offload": False, "optimizer_offload": False, "param_offload": False}
    assert _kv(vllm_memory="instance", **everything) == _kv(vllm_memory="instance", ref_param_offload=True)
