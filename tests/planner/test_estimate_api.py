"""The public contract of `estimate_memory`: signature, purity, calibratable overheads, speed."""

from __future__ import annotations

import inspect

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads


def test_signature_is_the_agreed_one() -> None:
    sig = inspect.signature(estimate_memory)
    assert list(sig.parameters)[:4] == ["model", "cluster", "workload", "knobs"]
    assert (
        sig.parameters["target"].kind is inspect.Parameter.KEYWORD_ONLY
        and sig.parameters["target"].default == "grpo-pilot"
    )
    assert (
        sig.parameters["overheads"].kind is inspect.Parameter.KEYWORD_ONLY
        and sig.parameters["overheads"].default is DEFAULT_OVERHEADS
    )


def test_pure_same_inputs_same_report(spec_of, cluster_of) -> None:
    args = (spec_of("qwen3-8b"), cluster_of("2x8xH100-80G"), Workload(), Knobs(max_token_len_per_gpu=12000))
    assert estimate_memory(*args, target="verl") == estimate_memory(*args, target="verl")


def test_overheads_are_calibratable(spec_of, cluster_of) -> None:
    args = (spec_of("qwen2.5-7b"), cluster_of("8xA100-80G"), Workload(), Knobs())
    base = estimate_memory(*args)
    custom = Overheads(cuda_context_bytes=1 << 30, nccl_bytes_per_communicator=0, weight_sync_bucket_bytes=1 << 29)
    cal = estimate_memory(*args, overheads=custom)
    upd = cal.phases["update"].items
    assert upd["overhead_cuda_context"] == 1 << 30 and upd["overhead_nccl"] == 0
    assert cal.phases["weight_sync"].items["weight_sync_bucket"] == 1 << 29
    # tensor items do not depend on overheads
    assert cal.phases["update"].tensor_bytes == base.phases["update"].tensor_bytes


def test_the_allocator_reserve_follows_the_allocator_setting(spec_of, cluster_of) -> None:
    """memory/allocator.py: expandable segments hold one partly used page per pool beyond the tensors; the
    default allocator a carved logits block, plus what the phases since the last cache release left."""
    args = (spec_of("qwen2.5-7b"), cluster_of("8xA100-80G"), Workload())
    expandable = estimate_memory(*args, Knobs(allocator="expandable"))
    default = estimate_memory(*args, Knobs(allocator="default", release_cache="each_phase"))
    kept = estimate_memory(*args, Knobs(allocator="default", release_cache="never"))
    assert expandable.phases["update"].items["overhead_allocator_reserve"] == (20 << 20) + (2 << 20)
    assert default.phases["update"].tensor_bytes == expandable.phases["update"].tensor_bytes
    each = default.phases["update"].items["overhead_allocator_reserve"]
    assert each > 20 << 20 and each % (2 << 20) == 0  # one logits segment, rounded to kRoundLarge
    # never released: the log-prob pass's transients are still cached when the update peaks
    assert kept.phases["update"].items["overhead_allocator_reserve"] > each


def test_nxcpu_workers_share_the_host_ram_and_shard_like_fsdp(spec_of) -> None:
    """`Nxcpu`: each of N worker processes gets RAM / N as its device memory, and the states shard N ways."""
    from grpo_pilot.hardware.cluster import Cluster
    from grpo_pilot.hardware.gpus import cpu_spec

    ram = 64 << 30
    one = Cluster(gpu=cpu_spec(), num_nodes=1, gpus_per_node=1, host_ram_bytes_per_node=ram)
    four = Cluster(gpu=cpu_spec(), num_nodes=1, gpus_per_node=4, host_ram_bytes_per_node=ram)
    assert one.device_memory_bytes == ram and four.device_memory_bytes == ram // 4
    spec, w = spec_of("qwen2.5-0.5b"), Workload(prompts_per_step=8, mini_batch_prompts=8, n=4)
    k = Knobs(rollout_backend="hf", rollout_tp=1)
    m1, m4 = estimate_memory(spec, one, w, k), estimate_memory(spec, four, w, k)
    u1, u4 = m1.phases["update"].items, m4.phases["update"].items
    assert u4["actor_params"] == -(-spec.num_params // 4) * 4 and u1["actor_params"] == spec.num_params * 4
    # one process uses parameters in place; four gloo workers gather layers like FSDP in their passes, and each
    # generates on its own fp32 replica of the model (engine/worker.py `_build_rollout`), which gathers nothing
    r1, r4 = m1.phases["rollout"].items, m4.phases["rollout"].items
    assert r1["gathered_layers"] == u1["gathered_layers"] == 0 < u4["gathered_layers"]
    assert "gathered_layers" not in r4 and "hf_replica_weights" not in r1
    assert r4["hf_replica_weights"] == m4.phases["update"].items["hf_replica_weights"] == 4 * spec.num_params
    assert m4.host.items["process_rss"] == 4 * m1.host.items["process_rss"]


def test_vllm_memory_device_counts_the_trainer_against_the_budget(spec_of, cluster_of) -> None:
    """vLLM 0.7-0.8's V1 engine sizes its KV cache from everything on the GPU at profile time (the actor's
    sharded parameters and the process overheads included); >= 0.9 (and V0) from its own memory only."""
    args = (spec_of("qwen2.5-7b"), cluster_of("4xA6000"), Workload(), Knobs(rollout_tp=2, gpu_memory_utilization=0.6))
    inst = estimate_memory(*args, target="verl")
    dev = estimate_memory(*args[:3], args[3].model_copy(update={"vllm_memory": "device"}), target="verl")
    actor = inst.phases["rollout"].items["actor_params"]
    # the allocator's reserve is not there yet when the engine profiles (nothing has been freed)
    rollout = inst.phases["rollout"].items
    trainer_oh = sum(v for k, v in rollout.items() if k.startswith("overhead_") and k != "overhead_allocator_reserve")
    assert inst.kv_cache_bytes_per_gpu - dev.kv_cache_bytes_per_gpu == actor + trainer_oh
    assert dev.phases["rollout"].total_bytes < inst.phases["rollout"].total_bytes
    offloaded = args[3].model_copy(update={"vllm_memory": "device", "param_offload": True})
    assert estimate_memory(*args[:3], offloaded, target="verl").kv_cache_bytes_per_gpu > dev.kv_cache_bytes_per_gpu
