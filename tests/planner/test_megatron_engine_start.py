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
from grpo_pilot.planner.memory.context import memory_context
from grpo_pilot.planner.memory.megatron import megatron_state_bytes, stage_params
from grpo_pilot.planner.memory.megatron_phases import (
    _engine_budget,
    _stages,
    engine_start_held_bytes,
    megatron_engine_budget,
    megatron_parallel,
)
from grpo_pilot.planner.memory.shape import shape_of
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
from grpo_pilot.planner.traits import traits_for
from tests.planner.conftest import cluster, spec

QWEN7 = spec("qwen2.5-7b")
H100x8 = cluster("8xH100")
BASE = {"strategy": "megatron", "megatron_tp": 4, "megatron_pp": 2, "param_offload": True, "optimizer_offload": True}


def _kv(workload: Workload = Workload(use_kl_loss=True), **knobs: object) -> int:
    report = estimate_memory(QWEN7, H100x8, workload, Knobs(**{**BASE, **knobs}), target="verl")
    return report.kv_cache_bytes_per_gpu  # the cache that bounds the rollout (the heaviest stage's)


def _heaviest_stage(**knobs: object):
    """The stage whose held bytes bound the engine (megatron_phases `_tightest`): here the last, whose final norm
    comes beside an output layer the size of the first stage's embedding (Qwen2.5-7B is untied)."""
    par = megatron_parallel(Knobs(**{**BASE, **knobs}), 8)
    first, last = (stage_params(shape_of(QWEN7), par, s) for s in (0, par.pp - 1))
    assert last > first
    return megatron_state_bytes(last, par), megatron_state_bytes(last, par, trainable=False)


@pytest.mark.parametrize("memory", ["device", "free"])
def test_a_resident_reference_shrinks_the_kv_cache_by_its_shard(memory: str) -> None:
    _, ref = _heaviest_stage()
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
    actor, _ = _heaviest_stage()
    kept = _kv(vllm_memory="device", ref_param_offload=True, optimizer_offload=False)
    moved = _kv(vllm_memory="device", ref_param_offload=True, optimizer_offload=True)
    assert moved - kept == actor.master_bytes  # fp32 main params only: Adam's moments appear at the first step


def test_the_actor_counts_unless_offloaded_at_init_whatever_the_fsdp_era_knob() -> None:
    actor, _ = _heaviest_stage()
    on = _kv(vllm_memory="device", ref_param_offload=True, param_offload=False)
    off = _kv(vllm_memory="device", ref_param_offload=True, param_offload=True)
    assert off - on == actor.params_bytes + actor.grads_bytes
    # actor_offload_at_init dates FSDP's #1118; Megatron's init offloaded the actor since its offload exists (#1162)
    assert _kv(vllm_memory="device", ref_param_offload=True, actor_offload_at_init=False) == off


def test_the_stage_holding_the_most_bounds_the_cache_and_each_stage_peaks_with_its_own() -> None:
    knobs = Knobs(**{**BASE, "vllm_memory": "device", "param_offload": False, "optimizer_offload": False})
    ctx = memory_context(QWEN7, H100x8, Workload(), knobs, executor=traits_for("verl"), overheads=DEFAULT_OVERHEADS)
    stages = _stages(ctx, shape_of(QWEN7), megatron_parallel(knobs, 8))
    first, last = (_engine_budget(ctx, s) for s in stages)
    held = [engine_start_held_bytes(ctx, s) for s in stages]
    # 'device': what a stage holds at the engine's start comes off its cache byte for byte
    assert held[1] > held[0]
    assert first.kv_signed_bytes - last.kv_signed_bytes == held[1] - held[0]
    # the planned cache (KV tokens, concurrency, the constraints) is the smaller one, whichever stage comes first
    assert megatron_engine_budget(ctx) == last
    report = estimate_memory(QWEN7, H100x8, Workload(), knobs, target="verl")
    assert report.kv_cache_bytes_per_gpu == last.kv_cache_bytes
    # the rollout phase's peak pairs a stage with its own engine: either stage's, never the smaller cache
    # beside the lighter stage's residents
    assert report.phases["rollout"].items["vllm_kv_cache"] in (first.kv_cache_bytes, last.kv_cache_bytes)


def test_an_engine_measuring_its_own_memory_counts_none_of_it() -> None:
    everything = {"ref_param_offload": False, "optimizer_offload": False, "param_offload": False}
    assert _kv(vllm_memory="instance", **everything) == _kv(vllm_memory="instance", ref_param_offload=True)
