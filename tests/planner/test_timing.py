"""Roofline time model: hand-worked phases, monotonicity, and the variants each knob selects."""

from __future__ import annotations

import math

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner import timing as T
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.memory.activations import layer_activation_bytes_per_token
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS as COEF
from grpo_pilot.planner.timing import estimate_time
from grpo_pilot.planner.train_side import seqs_per_token_budget
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles import resolve_model

A100_MATMUL = 312e12 * 271.2 / 312  # MAMF of the A100 SXM (time_coefficients.py)
A100_HBM = 2039e9 * COEF.hbm_efficiency

SMALL = Workload(
    prompts_per_step=8, mini_batch_prompts=8, n=2, prompt_len_tokens=64, response_len_tokens=64, use_kl_loss=False
)


def spec(alias: str):
    return resolve_model(alias).spec


def _layer_traffic(s, c: int = 2) -> int:
    """2 × the bytes every layer saves per token (written once, read once)."""
    per_layer = layer_activation_bytes_per_token(
        hidden=s.hidden_size,
        q_dim=s.q_dim,
        kv_dim=s.kv_dim,
        intermediate=s.intermediate_size,
        num_heads=s.num_attention_heads,
        compute_bytes=c,
        qk_norm=s.qk_norm,
        num_kv_heads=s.num_kv_heads,
    )
    return 2 * s.num_layers * per_layer


def test_update_phase_single_gpu_by_hand() -> None:
    """1 GPU, no FSDP traffic: epochs × minis × (micros × tokens × roofline per token + AdamW).
    Per token: 3× the forward's GEMM FLOPs at the A100's MAMF, 3× its attention FLOPs at 0.7 of that
    rate, 3× the layers' elementwise traffic plus the logits' training traffic at 0.6 of HBM."""
    s, c = spec("qwen2.5-0.5b"), parse_cluster("1xA100-80G")
    k = Knobs(micro_batch_size_per_gpu=4, gradient_checkpointing=False)
    seqs = 8 * 2  # mini-batch prompts × n, one data-parallel rank
    micros = seqs // 4
    tokens = 4 * (64 + 64)
    matmul = 3 * 2 * s.num_active_params
    attention = 3 * 4 * s.num_layers * s.q_dim * (128 / 2)  # causal attention, average context 64
    # our engine's unfused training path holds the logits and their gradient (2c) and works one float32
    # chunk (4) per element; each byte written and read
    logits = 2 * (2 * 2 + 4) * s.vocab_size
    memory = 3 * _layer_traffic(s) + logits
    per_token = matmul / A100_MATMUL + attention / (A100_MATMUL * 0.7) + memory / A100_HBM
    adam = s.num_params * T.ADAM_BYTES_PER_PARAM / 2039e9
    dispatch = 3 * s.num_layers * COEF.train_dispatch_s_per_layer_pass  # forward + backward, per micro-batch
    expected = 1 * 1 * (micros * (tokens * per_token + dispatch) + adam)
    assert T.update_time_s(s, c, SMALL, k, executor=traits_for("grpo-pilot")) == pytest.approx(expected, rel=1e-12)


def test_partial_last_micro_batch_is_not_padded() -> None:
    """10 sequences per rank in micro-batches of 4 = 4 + 4 + 2: on one GPU (no FSDP traffic) the
    compute is that of 10 sequences, the same as micro-batches of 1, 2 or 5 (op dispatch off: it is
    a cost per micro-batch, tested below)."""
    s, c = spec("qwen2.5-0.5b"), parse_cluster("1xA100-80G")
    w = SMALL.model_copy(update={"prompts_per_step": 5, "mini_batch_prompts": 5})
    coef = COEF.model_copy(update={"train_dispatch_s_per_layer_pass": 0.0})
    times = {
        m: T.update_time_s(
            s, c, w, Knobs(micro_batch_size_per_gpu=m), executor=traits_for("grpo-pilot"), coefficients=coef
        )
        for m in (1, 2, 4, 5)
    }
    assert times[4] == pytest.approx(times[1], rel=1e-12) == pytest.approx(times[5], rel=1e-12)


def test_op_dispatch_per_micro_batch_adds_on_cpu_and_gpu() -> None:
    """Each micro-batch dispatches forward + backward (3 layer passes) of eager ops: 10 micro-batches cost
    9 dispatches more than one, on the cpu pseudo-device (the host runs the ops) and on a GPU (each
    micro-batch ends in a readback, so the device cannot run ahead: the H200 measurements)."""
    s = spec("qwen2.5-0.5b")
    w = SMALL.model_copy(update={"prompts_per_step": 5, "mini_batch_prompts": 5})  # 10 sequences
    slow = COEF.model_copy(update={"train_dispatch_s_per_layer_pass": 0.01})
    zero = COEF.model_copy(update={"train_dispatch_s_per_layer_pass": 0.0})
    dispatch = 3 * s.num_layers * 0.01
    assert T.train_dispatch_s(s, 3, slow) == pytest.approx(dispatch)
    cpu = parse_cluster("1xcpu")

    def knobs(micro: int) -> Knobs:
        return Knobs(micro_batch_size_per_gpu=micro, gradient_checkpointing=False)

    def cpu_update(micro: int, coef) -> float:
        return T.update_time_s(s, cpu, w, knobs(micro), executor=traits_for("grpo-pilot"), coefficients=coef)

    assert cpu_update(1, slow) - cpu_update(1, zero) == pytest.approx(10 * dispatch)
    assert cpu_update(10, slow) - cpu_update(10, zero) == pytest.approx(dispatch)
    gpu = parse_cluster("1xA100-80G")

    def gpu_update(micro: int, coef) -> float:
        return T.update_time_s(s, gpu, w, knobs(micro), executor=traits_for("grpo-pilot"), coefficients=coef)

    assert gpu_update(1, slow) - gpu_update(1, zero) == pytest.approx(10 * dispatch)
    assert gpu_update(10, slow) - gpu_update(10, zero) == pytest.approx(dispatch)


def test_checkpointing_adds_one_forward() -> None:
    """Full recompute adds one forward of the layers (GEMMs, attention, elementwise traffic), not of the
    logits: the difference is tokens × that forward, however large the rest, plus the recomputed forward's
    op dispatch (one layer pass per micro-batch)."""
    s, c = spec("qwen2.5-0.5b"), parse_cluster("1xA100-80G")
    w = Workload(
        prompts_per_step=64,
        mini_batch_prompts=64,
        n=4,
        prompt_len_tokens=512,
        response_len_tokens=512,
        use_kl_loss=False,
    )
    on = T.update_time_s(s, c, w, Knobs(gradient_checkpointing=True), executor=traits_for("grpo-pilot"))
    off = T.update_time_s(s, c, w, Knobs(gradient_checkpointing=False), executor=traits_for("grpo-pilot"))
    tokens = 64 * 4 * 1024
    forward = (
        2 * s.num_active_params / A100_MATMUL
        + 4 * s.num_layers * s.q_dim * 512 / (A100_MATMUL * 0.7)
        + _layer_traffic(s) / A100_HBM
    )
    micros = 64 * 4 // Knobs().micro_batch_size_per_gpu
    dispatch = micros * s.num_layers * COEF.train_dispatch_s_per_layer_pass
    assert on - off == pytest.approx(tokens * forward + dispatch, rel=1e-9)


def test_weight_sync_colocated_by_hand() -> None:
    """Ring all-gather of 2P bytes over 8 GPUs at link × efficiency, plus the vLLM load at HBM speed."""
    s, c = spec("qwen2.5-7b"), parse_cluster("8xA100-80G")
    k = Knobs(rollout_tp=2)
    weights = 2 * s.num_params
    expected = weights * 7 / 8 / (300e9 * COEF.link_efficiency) + weights / 2 / 2039e9
    assert T.weight_sync_time_s(s, c, k, executor=traits_for("grpo-pilot")) == pytest.approx(expected, rel=1e-12)
    # hf: verl's generates on its own (sharded) module, one unsharded GPU of ours on the policy: nothing to send;
    # ours on 8 GPUs loads a bf16 replica per GPU from the fp32 weights gathered over the ring (memory/hf_rollout.py)
    hf = k.model_copy(update={"rollout_backend": "hf"})
    assert T.weight_sync_time_s(s, c, hf, executor=traits_for("verl")) == 0.0
    assert T.weight_sync_time_s(s, parse_cluster("1xA100-80G"), hf, executor=traits_for("grpo-pilot")) == 0.0
    fp32 = 4 * s.num_params
    replica = fp32 * 7 / 8 / (300e9 * COEF.link_efficiency) + (fp32 + weights) / 2039e9
    assert T.weight_sync_time_s(s, c, hf, executor=traits_for("grpo-pilot")) == pytest.approx(replica, rel=1e-12)


def test_decode_is_bounded_below_by_the_longest_response() -> None:
    """Even one sequence needs response_len decode steps, each reading all weights once (and paying the
    engine's per-step time)."""
    s, c = spec("qwen2.5-7b"), parse_cluster("1xH100")
    w = Workload(prompts_per_step=1, mini_batch_prompts=1, n=1, prompt_len_tokens=16, response_len_tokens=2048)
    k = Knobs(rollout_tp=1)
    floor = 2048 * (2 * s.num_params / (3350e9 * COEF.hbm_efficiency) + COEF.vllm_v1_step_overhead_s)
    t = T.rollout_time_s(s, c, w, k, kv_cache_tokens_per_gpu=10**7)
    assert floor < t < 1.2 * floor


def test_decode_steps_follow_the_tail_or_the_kv_capacity() -> None:
    """Continuous batching: max(longest response, generated tokens / concurrency) steps, where the
    concurrency is the KV capacity at the expected sequence length, capped by max_num_seqs."""
    s, c = spec("qwen2.5-7b"), parse_cluster("8xA100-80G")
    w = Workload(prompt_len_mean_tokens=100, response_len_mean_tokens=200)  # 1024 × 5 responses, max 512 + 1024
    k = Knobs(rollout_tp=2)  # 4 replicas of 1280 sequences
    roomy = T.rollout_breakdown(s, c, w, k, kv_cache_tokens_per_gpu=10**9)
    assert roomy.seqs_per_replica == 1280 and roomy.concurrency == 1024  # max_num_seqs caps
    assert roomy.decode_steps == 1024  # the tail: some response reaches the cap
    tight = T.rollout_breakdown(s, c, w, k, kv_cache_tokens_per_gpu=300 * 64)  # 64 sequences of 300 tokens
    assert tight.concurrency == 64 and tight.decode_steps == 1280 * 200 // 64
    assert T.rollout_time_s(s, c, w, k, kv_cache_tokens_per_gpu=300 * 64) > 1.5 * T.rollout_time_s(
        s, c, w, k, kv_cache_tokens_per_gpu=10**9
    )
    short_tail = w.model_copy(update={"response_tail_tokens": 600})
    assert T.rollout_breakdown(s, c, short_tail, k, kv_cache_tokens_per_gpu=10**9).decode_steps == 600


def test_expected_lengths_cost_less_than_the_maximum() -> None:
    s, c, k = spec("qwen2.5-7b"), parse_cluster("8xA100-80G"), Knobs()
    at_max = Workload()
    gsm8k = Workload(prompt_len_mean_tokens=94, response_len_mean_tokens=198)
    a, b = estimate_time(s, c, at_max, k), estimate_time(s, c, gsm8k, k)
    for phase in ("rollout", "log_prob", "update"):
        assert b.phases_s[phase] < a.phases_s[phase]
    assert b.tokens_per_s == pytest.approx(gsm8k.responses_per_step * (94 + 198) / b.step_s)


def test_v0_engine_pays_per_step_and_per_running_sequence() -> None:
    """V0: 9 ms per decode step + 0.106 ms per running sequence per step (every generated token)."""
    s, c = spec("qwen2.5-0.5b"), parse_cluster("8xA100-80G")
    w = Workload(
        prompts_per_step=256,
        mini_batch_prompts=64,
        n=2,
        prompt_len_tokens=512,
        response_len_tokens=192,
        prompt_len_mean_tokens=104,
        response_len_mean_tokens=145,
    )
    v1 = T.rollout_breakdown(s, c, w, Knobs(rollout_tp=1), kv_cache_tokens_per_gpu=10**9)
    v0 = T.rollout_breakdown(s, c, w, Knobs(rollout_tp=1, vllm_engine="v0"), kv_cache_tokens_per_gpu=10**9)
    generated = v1.seqs_per_replica * 145
    extra = (
        v1.decode_steps * (COEF.vllm_v0_step_overhead_s - COEF.vllm_v1_step_overhead_s)
        + generated * COEF.vllm_v0_seq_step_overhead_s
    )
    assert v0.decode_overhead_s - v1.decode_overhead_s == pytest.approx(extra, rel=1e-9)
    assert v0.decode_roofline_s == v1.decode_roofline_s


def test_tp_collectives_cost_two_all_reduces_per_layer_and_a_logits_gather_per_step() -> None:
    s, c = spec("qwen2.5-7b"), parse_cluster("8xH100")
    w = Workload(prompt_len_mean_tokens=100, response_len_mean_tokens=200)
    tp1 = T.rollout_breakdown(s, c, w, Knobs(rollout_tp=1), kv_cache_tokens_per_gpu=10**9)
    tp4 = T.rollout_breakdown(s, c, w, Knobs(rollout_tp=4), kv_cache_tokens_per_gpu=10**9)
    assert tp1.decode_tp_comm_s == 0.0  # no TP
    # V1 with CUDA graphs: only the engine's per-step scheduling time
    assert tp1.decode_overhead_s == pytest.approx(tp1.decode_steps * COEF.vllm_v1_step_overhead_s, rel=1e-9)
    batch = tp4.seqs_per_replica * 200 / tp4.decode_steps
    link = 450e9 * COEF.link_efficiency
    all_reduces = 2 * s.num_layers * T.allreduce_s(batch * s.hidden_size * 2, 4, link, COEF.allreduce_latency_s)
    gather = COEF.allreduce_latency_s + batch * s.vocab_size * 2 * 3 / 4 / link
    assert tp4.decode_tp_comm_s == pytest.approx(tp4.decode_steps * (all_reduces + gather), rel=1e-9)


def test_every_tp_rank_samples_the_whole_replica_batch() -> None:
    """vLLM V1 all-gathers the logits and every rank runs the sampler: per GPU, a TP-4 replica samples
    4× the sequences a TP-1 replica does (same GPUs, same responses)."""
    s, c = spec("qwen2.5-7b"), parse_cluster("8xH100")
    w = Workload(prompt_len_mean_tokens=100, response_len_mean_tokens=200)
    tp1 = T.rollout_breakdown(s, c, w, Knobs(rollout_tp=1), kv_cache_tokens_per_gpu=10**9)
    tp4 = T.rollout_breakdown(s, c, w, Knobs(rollout_tp=4), kv_cache_tokens_per_gpu=10**9)
    assert tp4.seqs_per_replica == 4 * tp1.seqs_per_replica
    assert tp4.decode_sampler_s == pytest.approx(4 * tp1.decode_sampler_s, rel=1e-12)
    per_token = 2 * 20 * s.vocab_size / (3350e9 * COEF.hbm_efficiency)  # Overheads: 20 B per vocab entry
    assert tp1.decode_sampler_s == pytest.approx(tp1.seqs_per_replica * 200 * per_token, rel=1e-12)


def test_step_time_monotone_in_workload() -> None:
    s, c, k = spec("qwen3-8b"), parse_cluster("8xH100"), Knobs()
    base = estimate_time(s, c, Workload(), k).step_s
    assert estimate_time(s, c, Workload(response_len_tokens=2048), k).step_s > base
    assert estimate_time(s, c, Workload(n=8), k).step_s > base
    assert estimate_time(s, c, Workload(ppo_epochs=2), k).step_s > base
    assert estimate_time(s, c, Workload(use_kl_loss=False), k).step_s < base


def test_report_consistency() -> None:
    s, c, w = spec("qwen3-8b"), parse_cluster("8xH100"), Workload()
    r = estimate_time(s, c, w, Knobs())
    assert r.step_s == pytest.approx(sum(r.phases_s.values()))
    assert r.tokens_per_s == pytest.approx(w.responses_per_step * w.seq_len_tokens / r.step_s)
    assert 0.0 < r.mfu < 1.0
    flops = T.model_flops_per_step(s, w, traits_for("grpo-pilot"))
    assert r.mfu == pytest.approx(flops / (989e12 * 8 * r.step_s))


def test_offload_costs_time_and_verl_loads_once_per_phase() -> None:
    s, c = spec("qwen3-8b"), parse_cluster("8xH100")
    w = Workload()
    plain = T.update_time_s(s, c, w, Knobs(), executor=traits_for("verl"))
    verl_off = T.update_time_s(s, c, w, Knobs(param_offload=True, optimizer_offload=True), executor=traits_for("verl"))
    shard = s.num_params / 8
    host = 64e9 * COEF.host_link_efficiency  # H100: PCIe 5.0 x16
    # verl: params (fp32) and Adam m+v (2 × fp32) each cross PCIe twice, once per update phase.
    assert verl_off - plain == pytest.approx((2 * 4 + 2 * 8) * shard / host, rel=1e-9)
    ours_off = T.update_time_s(
        s, c, w, Knobs(param_offload=True, optimizer_offload=True), executor=traits_for("grpo-pilot")
    )
    assert ours_off > T.update_time_s(s, c, w, Knobs(), executor=traits_for("grpo-pilot"))


def test_trl_skips_old_logprob_only_for_one_on_policy_update() -> None:
    s, c = spec("qwen2.5-1.5b"), parse_cluster("8xH100")
    one_update = Workload(prompts_per_step=256, mini_batch_prompts=256, use_kl_loss=False)
    assert T.log_prob_time_s(s, c, one_update, Knobs(), executor=traits_for("trl")) == 0.0
    assert T.log_prob_time_s(s, c, one_update, Knobs(), executor=traits_for("verl")) > 0.0
    two_updates = Workload(prompts_per_step=256, mini_batch_prompts=128, use_kl_loss=False)
    assert T.log_prob_time_s(s, c, two_updates, Knobs(), executor=traits_for("trl")) > 0.0
    with_ref = one_update.model_copy(update={"use_kl_loss": True})
    assert T.log_prob_time_s(s, c, with_ref, Knobs(), executor=traits_for("trl")) > 0.0


def test_eager_and_hf_rollout_are_slower() -> None:
    s, c, w = spec("qwen2.5-7b"), parse_cluster("8xA100-80G"), Workload()
    graphs = T.rollout_time_s(s, c, w, Knobs(), kv_cache_tokens_per_gpu=256 * 1536)
    eager = T.rollout_time_s(s, c, w, Knobs(enforce_eager=True), kv_cache_tokens_per_gpu=256 * 1536)
    hf = T.rollout_time_s(s, c, w, Knobs(rollout_backend="hf", max_num_seqs=256), kv_cache_tokens_per_gpu=256 * 1536)
    assert graphs < eager < hf


def test_split_placement_halves_each_pool() -> None:
    c = parse_cluster("2x8xH100")
    assert T.pools(c, Knobs()) == (16, 16)
    assert T.pools(c, Knobs(placement="split")) == (8, 8)
    assert T.pools(c, Knobs(placement="split", split_rollout_gpus_per_node=2)) == (4, 12)


def test_token_budget_semantics_follow_the_target() -> None:
    """verl multiplies the per-GPU budget by SP; our engine does not: fewer sequences per micro-batch."""
    assert seqs_per_token_budget(4096, 2, 1024, traits_for("verl")) == 8
    assert seqs_per_token_budget(4096, 2, 1024, traits_for("grpo-pilot")) == 4
    assert seqs_per_token_budget(100, 1, 1024, traits_for("grpo-pilot")) == 1  # at least one whole sequence


def test_kv_heads_replicate_beyond_tp() -> None:
    s = spec("qwen2.5-7b")  # 4 kv heads
    assert (
        T.kv_bytes_per_token_per_gpu(s, 8)
        == T.kv_bytes_per_token_per_gpu(s, 4)
        == 2 * s.num_layers * 1 * s.head_dim * 2
    )
    assert T.kv_bytes_per_token_per_gpu(s, 1) == 2 * s.num_layers * 4 * s.head_dim * 2


def test_multi_node_collectives_run_at_the_nodes_nic_speed() -> None:
    """Across nodes a collective runs over every NIC of the node (NCCL: a channel per NIC): H100 nodes have
    one 400 Gb/s NIC per GPU (8 × 50 GB/s at 0.5: the ~200 GB/s of NVIDIA/nccl#1218), A100 nodes 200 Gb/s;
    within a node, NVLink."""
    h100 = parse_cluster("8xH100").gpu
    assert T.collective_bytes_per_s(h100, True, COEF, gpus_per_node=8) == pytest.approx(8 * 50e9 * 0.5)
    assert T.collective_bytes_per_s(h100, False, COEF) == pytest.approx(450e9 * COEF.link_efficiency)
    a100 = parse_cluster("8xA100-80G").gpu
    assert T.collective_bytes_per_s(a100, True, COEF, gpus_per_node=8) == pytest.approx(8 * 25e9 * 0.5)
    # fewer GPUs per node, fewer NICs
    assert T.collective_bytes_per_s(h100, True, COEF, gpus_per_node=2) == pytest.approx(2 * 50e9 * 0.5)
    a100 = parse_cluster("8xA100-80G").gpu
    assert math.isclose(T.host_link_bytes_per_s(a100, COEF), 32e9 * COEF.host_link_efficiency)
