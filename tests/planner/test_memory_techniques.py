"""Each technique moves or removes the bytes it should: offload, fused log-prob, checkpointing, backends."""

from __future__ import annotations

import pytest

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.profiles.catalog import resolve_model

TARGETS = ("grpo-pilot", "verl", "trl")
P7 = 7_615_616_512


@pytest.mark.parametrize("target", TARGETS)
def test_offload_moves_rollout_bytes_from_gpu_to_host(target: str, est) -> None:
    base = est("qwen2.5-7b", "8xA100-80G", target=target)
    off = est(
        "qwen2.5-7b", "8xA100-80G", target=target, param_offload=True, optimizer_offload=True, ref_param_offload=True
    )
    b, o = base.phases["rollout"], off.phases["rollout"]
    moved = b.items["actor_params"] + b.items["optimizer_states"] + b.items["ref_params"]
    assert moved > 0 and o.items["actor_params"] == o.items["optimizer_states"] == o.items["ref_params"] == 0
    assert b.tensor_bytes - o.tensor_bytes == moved  # GPU tensors drop by exactly the moved states
    assert o.total_bytes < b.total_bytes
    host_rise = off.host.total_bytes - base.host.total_bytes
    grads = off.host.items["actor_grads_offloaded"]  # FSDP2 / ZeRO-3 CPU offload keeps grads on the host too
    assert host_rise == 8 * moved + grads  # every one of the 8 ranks on the node
    assert grads == (0 if target == "verl" else 8 * 4 * P7 // 8)


def test_offload_in_update_our_engine_keeps_states_off_the_gpu(est) -> None:
    base = est("qwen2.5-7b", "8xA100-80G")
    off = est("qwen2.5-7b", "8xA100-80G", param_offload=True, optimizer_offload=True, ref_param_offload=True)
    b, o = base.phases["update"].items, off.phases["update"].items
    for name in ("actor_params", "actor_grads", "optimizer_states", "ref_params"):
        assert b[name] > 0 and o[name] == 0
    moved = sum(b[n] for n in ("actor_params", "actor_grads", "optimizer_states", "ref_params"))
    host = off.host.items
    assert (
        host["actor_params_offloaded"]
        + host["actor_grads_offloaded"]
        + host["optimizer_states_offloaded"]
        + host["ref_params_offloaded"]
        == 8 * moved
    )


def test_verl_offload_loads_states_back_for_the_update(est) -> None:
    off = est(
        "qwen2.5-7b", "8xA100-80G", target="verl", param_offload=True, optimizer_offload=True, ref_param_offload=True
    )
    upd = off.phases["update"].items
    assert (
        upd["actor_params"] == 4 * P7 // 8
        and upd["optimizer_states"] == 8 * P7 // 8
        and upd["actor_grads"] == 4 * P7 // 8
    )
    assert upd["ref_params"] == 0
    # the log-prob phase peaks in one of its two passes: actor loaded for the old pass, ref for its own
    lp = off.phases["log_prob"].items
    assert (lp["actor_params"] == 0) != (lp["ref_params"] == 0)


@pytest.mark.parametrize(("target", "budget"), (("grpo-pilot", 65536), ("verl", 16384)))
def test_fused_logprob_lowers_update_and_log_prob_peaks(target: str, budget: int, est) -> None:
    # without checkpointing the logits moment is the update's peak; verl's in-place cross-entropy (2 bytes per
    # element) and our unfused path (logits + their gradient) both exceed the fused kernels' chunks
    kw = dict(target=target, max_token_len_per_gpu=budget, gradient_checkpointing=False)
    plain = est("qwen2.5-7b", "8xA100-80G", **kw)
    fused = est("qwen2.5-7b", "8xA100-80G", fused_logprob=True, **kw)
    for phase in ("update", "log_prob"):
        assert fused.phases[phase].items["logits"] < plain.phases[phase].items["logits"]
        assert fused.phases[phase].total_bytes < plain.phases[phase].total_bytes


def test_fused_logprob_changes_nothing_for_trl_which_always_fuses(est) -> None:
    plain = est("qwen2.5-7b", "8xA100-80G", target="trl")
    fused = est("qwen2.5-7b", "8xA100-80G", target="trl", fused_logprob=True)
    assert plain.phases["update"].items == fused.phases["update"].items


@pytest.mark.parametrize("target", TARGETS)
def test_gradient_checkpointing_lowers_update_activations(target: str, est) -> None:
    ckpt = est("qwen3-8b", "8xH100-80G", target=target, micro_batch_size_per_gpu=4)
    full = est("qwen3-8b", "8xH100-80G", target=target, micro_batch_size_per_gpu=4, gradient_checkpointing=False)
    a_ck, a_full = ckpt.phases["update"].items["activations"], full.phases["update"].items["activations"]
    assert a_ck < a_full / 5  # 36 layers: keeping only layer inputs is far smaller
    assert ckpt.phases["update"].total_bytes < full.phases["update"].total_bytes


@pytest.mark.parametrize("target", ("grpo-pilot", "verl"))
def test_entropy_bonus_adds_logits_memory(target: str, est) -> None:
    # a token budget long enough for the logits to be the update's peak moment in both executors
    w0, w1 = Workload(), Workload(entropy_coeff=0.01)
    kw = dict(target=target, max_token_len_per_gpu=65536, gradient_checkpointing=False)
    a = est("qwen2.5-7b", "8xA100-80G", workload=w0, **kw)
    b = est("qwen2.5-7b", "8xA100-80G", workload=w1, **kw)
    assert b.phases["update"].items["logits"] > a.phases["update"].items["logits"] > 0


def test_ulysses_splits_tokens_and_adds_all_to_all_buffers(est) -> None:
    # verl (flash-attention varlen: no mask, so activations are linear in the tokens per rank)
    one = est("qwen2.5-7b", "8xA100-80G", target="verl", micro_batch_size_per_gpu=8)
    two = est("qwen2.5-7b", "8xA100-80G", target="verl", micro_batch_size_per_gpu=8, ulysses_sp=2)
    assert one.phases["update"].items["ulysses_all_to_all"] == 0
    assert two.phases["update"].items["ulysses_all_to_all"] > 0
    # the tokens per rank halve, and with them the saved activations (the peak moment may change: with
    # fewer tokens the last layer's backward, which frees the head side, can outweigh the logits)
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.memory.context import memory_context
    from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
    from grpo_pilot.planner.traits import traits_for
    from grpo_pilot.profiles.catalog import resolve_model

    spec, cluster = resolve_model("qwen2.5-7b").spec, parse_cluster("8xA100-80G")
    ctx = [
        memory_context(
            spec,
            cluster,
            Workload(),
            Knobs(micro_batch_size_per_gpu=8, ulysses_sp=sp),
            executor=traits_for("verl"),
            overheads=DEFAULT_OVERHEADS,
        )
        for sp in (1, 2)
    ]
    assert ctx[1].update_tokens * 2 == ctx[0].update_tokens
    assert two.phases["update"].items["activations"] < one.phases["update"].items["activations"]
    assert two.phases["update"].items["overhead_nccl"] == one.phases["update"].items["overhead_nccl"] * 2


def test_enforce_eager_removes_cuda_graphs_and_grows_the_kv_cache(est) -> None:
    graphs = est("qwen2.5-7b", "8xA100-80G")
    eager = est("qwen2.5-7b", "8xA100-80G", enforce_eager=True)
    assert graphs.phases["rollout"].items["vllm_cuda_graphs"] > 0 == eager.phases["rollout"].items["vllm_cuda_graphs"]
    assert (
        eager.kv_cache_bytes_per_gpu - graphs.kv_cache_bytes_per_gpu
        == graphs.phases["rollout"].items["vllm_cuda_graphs"]
    )
    # graphs stay resident through the update (verl: "cudagraph memory stays resident during update_actor")
    assert graphs.phases["update"].total_bytes > eager.phases["update"].total_bytes


def test_trl_colocate_keeps_the_whole_engine_awake_verl_frees_weights_and_kv(est) -> None:
    trl = est("qwen2.5-7b", "8xA100-80G", target="trl").phases["update"].items
    verl = est("qwen2.5-7b", "8xA100-80G", target="verl").phases["update"].items
    assert trl["vllm_kv_cache"] > 0 and trl["vllm_weights"] > 0
    assert "vllm_kv_cache" not in verl and "vllm_weights" not in verl and verl["vllm_cuda_graphs"] > 0


def test_hf_backend_has_no_vllm_budget_and_no_weight_sync_transfer(est) -> None:
    r = est("qwen2.5-0.5b", "1xA100-80G", rollout_backend="hf", max_num_seqs=32, hf_decode="eager")
    rollout = r.phases["rollout"].items
    assert not any(k.startswith("vllm_") for k in rollout)
    # 32 sequences × 1536 tokens × (2 × 24 layers × 128 kv_dim × 4 bytes): the fp32 policy decodes under
    # autocast into a float32 cache (memory/hf_generate.py)
    assert rollout["hf_kv_cache"] == r.kv_cache_bytes_per_gpu == 32 * 1536 * 2 * 24 * 128 * 4
    # the LM head's cast (no autocast cache under inference mode) and the step's and the last step's logits
    assert rollout["autocast_weight_cache"] == 2 * 151_936 * 896
    # plus the call's sampling tables: 32 rows' uniforms for every response token (fp32) and the EOS lookup
    assert rollout["hf_sampling_logits"] == 2 * 2 * 32 * 151_936 + 4 * 32 * 1024 + 151_936 + 1  # 512 + 1024 tokens
    assert r.kv_cache_tokens_per_gpu == 32 * 1536 and r.max_concurrent_seqs == 32
    assert "weight_sync_bucket" not in r.phases["weight_sync"].items


def test_cpu_pseudo_device_is_all_fp32_without_gpu_overheads(est) -> None:
    r = est("qwen2.5-0.5b", "1xcpu", rollout_tp=1)
    p = 494_032_768
    upd = r.phases["update"].items
    assert upd["actor_params"] == 4 * p and upd["actor_grads"] == 4 * p and upd["optimizer_states"] == 8 * p
    assert upd["ref_params"] == 4 * p  # no bf16 copies on cpu
    assert (
        upd["gathered_layers"] == upd["root_embed_lm_head"] == upd["unsharded_grads"] == upd["root_reduce_scatter"] == 0
    )
    assert r.phases["rollout"].items["vllm_weights"] == 4 * p
    assert r.phases["rollout"].items["vllm_cuda_graphs"] == r.phases["rollout"].items["vllm_non_torch"] == 0
    for phase in r.phases.values():
        assert not any(
            k in phase.items for k in ("overhead_cuda_context", "overhead_nccl", "overhead_allocator_reserve")
        )
        assert phase.items["overhead_process_rss"] > 0
    # offload is meaningless when host RAM is the device: nothing moves
    assert est("qwen2.5-0.5b", "1xcpu", rollout_tp=1, param_offload=True).phases == r.phases


def test_split_weight_sync_reports_the_larger_side(est) -> None:
    r = est("qwen2.5-7b", "8xA100-80G", placement="split", rollout_tp=1)
    sync = r.phases["weight_sync"].items
    # the rollout GPU (vLLM awake with its KV cache + receive bucket) outweighs a trainer GPU here
    assert "vllm_kv_cache" in sync and sync["weight_sync_bucket"] == 2 << 30


def test_zero3_generation_gathers_the_whole_model(est) -> None:
    """TRL / ms-swift without vLLM under ZeRO-3 (ds3_gather_for_generation, their default) gather every
    parameter for the whole generate call: c·P beside the shards, where FSDP gathers a layer at a time."""
    kw = dict(target="trl", rollout_backend="hf", rollout_tp=1)
    layer = est("qwen2.5-32b", "8xH20", **kw).phases["rollout"].items
    model = est("qwen2.5-32b", "8xH20", hf_generation_weights="model", **kw).phases["rollout"].items
    spec = resolve_model("qwen2.5-32b").spec
    assert model["generation_gathered_model"] == 2 * spec.num_params
    assert model["gathered_layers"] == 0 and layer["gathered_layers"] > 0
    assert layer["generation_gathered_model"] == 0


def test_trl_reader_sets_whole_model_generation_under_zero3() -> None:
    from grpo_pilot.planner.from_trl import read_trl

    text = "model_name_or_path: Qwen/Qwen2.5-7B\nuse_vllm: false\ndeepspeed: zero3\nnum_generations: 8\n"
    assert read_trl(text, 8, []).knobs["hf_generation_weights"] == "model"
    off = read_trl(text + "ds3_gather_for_generation: false\n", 8, []).knobs
    assert off.get("hf_generation_weights", "layer") == "layer"
    fsdp = read_trl(text.replace("deepspeed: zero3", "fsdp: full_shard auto_wrap"), 8, []).knobs
    assert fsdp.get("hf_generation_weights", "layer") == "layer"
