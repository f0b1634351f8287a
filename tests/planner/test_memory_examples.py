"""Hand-worked examples: the arithmetic is written out here, the estimator must reproduce it to the byte."""

from __future__ import annotations

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory, rollout_kv_budget_bytes
from grpo_pilot.planner.memory.activations import (
    attention_mask_bytes,
    forward_activation_bytes,
    layer_activation_bytes_per_token,
    recompute_activation_bytes,
    saved_activation_bytes,
)
from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token
from grpo_pilot.planner.memory.logits import logprob_logits_bytes
from grpo_pilot.planner.memory.moments import log_prob_peak_items
from grpo_pilot.planner.memory.vllm_budget import capture_sizes

GiB = 1 << 30
MiB = 1 << 20
P_QWEN25_7B = 7_615_616_512  # exact count from config.json (published "7.61B")
V_QWEN25 = 152_064


def test_qwen25_7b_on_8xa100_model_states_are_16p_over_d(est) -> None:
    report = est("qwen2.5-7b", "8xA100-80G")
    update = report.phases["update"].items
    # fp32 master 4P/8 + fp32 grads 4P/8 + Adam m, v 8P/8 = 16 × 7,615,616,512 / 8 = 15,231,233,024 bytes
    assert (
        update["actor_params"] + update["actor_grads"] + update["optimizer_states"]
        == 16 * P_QWEN25_7B // 8
        == 15_231_233_024
    )
    assert update["actor_params"] == 3_807_808_256
    # reference in bf16, sharded 8 ways: 2 × P / 8
    assert update["ref_params"] == 1_903_904_128
    # root-held embeddings + untied lm_head in bf16: 2 × 2 × 152064 × 3584 = 2,179,989,504 bytes (2.03 GiB)
    assert update["root_embed_lm_head"] == 2_179_989_504
    assert round(update["root_embed_lm_head"] / GiB, 2) == 2.03


def test_logits_bytes_for_16k_tokens() -> None:
    T, V, h = 16_384, V_QWEN25, 3584
    # our engine, unfused, training (engine/algos/logprobs.py): the bf16 logits and their bf16 gradient,
    # 2 + 2 = 4 bytes per element, plus one float32 chunk of 2^24 // V = 110 rows worked in place (4 bytes
    # per element), plus the hidden-state gradient 2·T·h; the entropy metric (a forward moment of
    # 2·T·V + 8 bytes per chunk element) stays below that; an entropy gradient adds a second bf16 gradient
    chunk = 110 * V
    bare = logprob_logits_bytes(T, V, h, 2, kernel="ours", training=True, fused=False, entropy="none")
    assert bare == 4 * T * V + 4 * chunk + 2 * T * h == 9_965_666_304 + 66_908_160 + 117_440_512
    metric = logprob_logits_bytes(T, V, h, 2, kernel="ours", training=True, fused=False, entropy="metric")
    assert metric == bare
    assert (
        logprob_logits_bytes(T, V, h, 2, kernel="ours", training=True, fused=False, entropy="grad")
        == 6 * T * V + 4 * chunk + 2 * T * h
    )
    # verl (flash-attn cross entropy, in-place backward: the gradient overwrites the logits): c = 2 bytes per
    # element; its compiled entropy adds no logits-sized tensor, an entropy gradient two (3c)
    assert logprob_logits_bytes(T, V, h, 2, kernel="verl", training=True, fused=False) == 2 * T * V + 2 * T * h
    assert logprob_logits_bytes(T, V, h, 2, kernel="verl", training=False, fused=False, entropy="metric") == 2 * T * V
    grad = logprob_logits_bytes(T, V, h, 2, kernel="verl", training=True, fused=False, entropy="grad")
    assert grad == 6 * T * V + 2 * T * h
    # forward-only (log-prob pass): the logits (2 bytes bf16, 4 fp32) and one float32 chunk, no hidden gradient
    assert logprob_logits_bytes(T, V, h, 2, kernel="ours", training=False, fused=False) == 2 * T * V + 4 * chunk
    assert logprob_logits_bytes(T, V, h, 4, kernel="ours", training=False, fused=False) == 4 * T * V + 4 * chunk
    # fused, chunks of 1024 tokens: forward 12 bytes per chunk element; training backward c + 12 = 14,
    # plus the fp32 weight-gradient accumulator 4·V·h and the hidden gradient; its bf16 cast 2·V·h comes after
    # the chunk loop, when the chunk buffers (larger here) are freed
    assert logprob_logits_bytes(T, V, h, 2, kernel="ours", training=False, fused=True) == 12 * 1024 * V
    assert (
        logprob_logits_bytes(T, V, h, 2, kernel="ours", training=True, fused=True, entropy="metric")
        == 14 * 1024 * V + 4 * V * h + 2 * T * h
    )
    # TRL's fused head: one [4096, 32768] bf16 tile + 7 fp32 statistics per token
    assert logprob_logits_bytes(T, V, h, 2, kernel="trl", training=False, fused=False) == 2 * 4096 * 32768 + 28 * T


def test_update_logits_scored_positions_in_the_estimate(est) -> None:
    # dynamic batching, 16384-token budget, prompt 512 + response 1024: the mini-batch holds
    # 256 × 5 / 8 = 160 sequences × 1536 = 245,760 tokens, so a micro-batch packs the full 16,384.
    from grpo_pilot.planner.memory.logits import logprob_logits_bytes as logits_bytes

    # verl scores every packed position, but its cross-entropy overwrites the logits with their gradient:
    # 2 bytes per element (5.0 GB) + the hidden gradient
    verl_logits = logits_bytes(16_384, V_QWEN25, 3584, 2, kernel="verl", training=True, fused=False)
    assert verl_logits == 2 * 16_384 * V_QWEN25 + 2 * 16_384 * 3584
    # our engine keeps logits for response positions only: ceil(16384 × 1024 / 1536) = 10,923 of them, at
    # 4 bytes per element (bf16 logits + their gradient) + one float32 chunk + the hidden gradient: 6.9 GB
    lean = logits_bytes(10_923, V_QWEN25, 3584, 2, kernel="ours", training=True, fused=False, entropy="metric")
    assert lean == 4 * 10_923 * V_QWEN25 + 4 * 110 * V_QWEN25 + 2 * 10_923 * 3584
    # with checkpointing neither is the update's peak moment: a layer's backward (the layer recomputed, its
    # backward temporaries, two gathered layers) outweighs both
    for target in ("verl", "grpo-pilot"):
        items = est("qwen2.5-7b", "8xA100-80G", target=target, max_token_len_per_gpu=16_384).phases["update"].items
        assert items["logits"] == 0 and items["recompute_activations"] > 0
        assert items["gathered_layers"] == 2 * 2 * 233_057_792


def test_kv_bytes_per_token_qwen25_7b() -> None:
    # 28 layers, 4 kv heads, head_dim 128, bf16. t = 2: 2 heads per GPU → 2 × 28 × 2 × 128 × 2 = 28,672 bytes
    assert kv_bytes_per_token(num_layers=28, num_kv_heads=4, head_dim=128, tensor_parallel=2, kv_bytes=2) == 28_672
    # t = 8 > 4 kv heads: one replicated head per GPU → 14,336 bytes
    assert kv_bytes_per_token(num_layers=28, num_kv_heads=4, head_dim=128, tensor_parallel=8, kv_bytes=2) == 14_336
    assert kv_bytes_per_token(num_layers=28, num_kv_heads=4, head_dim=128, tensor_parallel=1, kv_bytes=2) == 57_344


def test_vllm_budget_qwen25_7b_util_half_on_a100(spec_of, cluster_of) -> None:
    report = estimate_memory(spec_of("qwen2.5-7b"), cluster_of("8xA100-80G"), Workload(), Knobs())
    rollout = report.phases["rollout"].items
    budget = int(0.5 * 81920 * MiB)  # 42,949,672,960
    weights = P_QWEN25_7B // 2 * 2  # bf16, t = 2: 7,615,616,512
    sampler = 1024 * V_QWEN25 * 20  # 3,114,270,720 > 8192 tokens × 79,360 bytes forward
    per_token = 2 * (2 * 3584 + (2 * 3584 + 2 * 512) // 2 + 3 * 18944 // 2)
    assert per_token == 79_360
    non_torch = int(0.15 * GiB) + int(0.16 * GiB)
    assert capture_sizes(1024, 8192) == (51, 512)  # [1, 2, 4] + 8..248 (31) + 256..512 step 16 (17)
    graphs = 2 * 51 * 4 * MiB + 512 * per_token
    kv = budget - weights - sampler - non_torch - graphs
    assert kv == 31_418_474_436
    assert rollout["vllm_weights"] == weights and rollout["vllm_activation_peak"] == sampler
    assert rollout["vllm_non_torch"] == non_torch and rollout["vllm_cuda_graphs"] == graphs
    assert rollout["vllm_kv_cache"] == report.kv_cache_bytes_per_gpu == kv
    assert report.kv_cache_tokens_per_gpu == kv // 28_672 == 1_095_789
    assert report.max_concurrent_seqs == 1_095_789 // 1536 == 713
    assert sum(v for k, v in rollout.items() if k.startswith("vllm_")) == budget


def test_vllm_v0_profiles_its_top_k_top_p_sampler_at_32_bytes_per_entry(spec_of, cluster_of) -> None:
    """V0's profile run samples max_num_seqs prompts through `_apply_top_k_top_p` (Overheads
    vllm_v0_sampler_bytes_per_vocab_entry); V1's dummy sampler run keeps its 20 bytes."""
    args = (spec_of("qwen2.5-7b"), cluster_of("8xA100-80G"), Workload())
    knobs = Knobs(max_num_seqs=256, max_num_batched_tokens=1536, enforce_eager=True)
    v1 = estimate_memory(*args, knobs).phases["rollout"].items
    v0 = estimate_memory(*args, knobs.model_copy(update={"vllm_engine": "v0"})).phases["rollout"].items
    assert v1["vllm_activation_peak"] == 256 * V_QWEN25 * 20 == 778_567_680
    assert v0["vllm_activation_peak"] == 256 * V_QWEN25 * 32 == 1_245_708_288
    assert v1["vllm_kv_cache"] - v0["vllm_kv_cache"] == 256 * V_QWEN25 * 12


def test_activation_bytes_per_token_per_layer(spec_of) -> None:
    s = spec_of("qwen2.5-7b")
    # 16h + 4·q_dim + 4·kv_dim + 8I + 4a + 8 = 57,344 + 14,336 + 2,048 + 151,552 + 112 + 8: k and v at the
    # kv heads (SDPA's native GQA, no mask on a GPU)
    assert (
        layer_activation_bytes_per_token(
            hidden=s.hidden_size,
            q_dim=s.q_dim,
            kv_dim=s.kv_dim,
            intermediate=s.intermediate_size,
            num_heads=s.num_attention_heads,
            compute_bytes=2,
        )
        == 225_400
    )
    small = spec_of("qwen2.5-1.5b")  # traced exactly (FSDP2, 2 ranks): 103,480 bytes per token per layer
    args = dict(
        hidden=small.hidden_size,
        q_dim=small.q_dim,
        kv_dim=small.kv_dim,
        intermediate=small.intermediate_size,
        num_heads=small.num_attention_heads,
        compute_bytes=2,
    )
    assert layer_activation_bytes_per_token(**args) == 103_480
    # one unsharded rank under autocast (traced exactly): +10h, the fp32 residual stream and per-projection casts
    assert layer_activation_bytes_per_token(**args, autocast=True) == 103_480 + 10 * 1536 == 118_840
    q3 = spec_of("qwen3-1.7b")  # + q/k RMSNorm: 6·(q_dim + kv_dim) + 4·(a + kv heads)
    got = layer_activation_bytes_per_token(
        hidden=q3.hidden_size,
        q_dim=q3.q_dim,
        kv_dim=q3.kv_dim,
        intermediate=q3.intermediate_size,
        num_heads=q3.num_attention_heads,
        compute_bytes=2,
        qk_norm=True,
        num_kv_heads=q3.num_kv_heads,
    )
    assert got == 16 * 2048 + 4 * 2048 + 4 * 1024 + 8 * 6144 + 4 * 16 + 8 + 6 * (2048 + 1024) + 4 * (16 + 8) == 112_808
    # a packed row of T tokens keeps a T × T bf16 mask per layer
    T = 4096
    assert attention_mask_bytes(T, T, 2) == 2 * T * T
    # checkpointed: T × (L·2h + (2·2h + 4h) head side: final hidden, its normalised copy, RMSNorm's fp32
    # upcast) + the T × T boolean mask saved; one full layer (+ its bf16 mask) recomputed
    assert (
        saved_activation_bytes(
            tokens=T,
            num_layers=28,
            per_layer_per_token=237_688,
            mask_per_layer=2 * T * T,
            bool_mask=T * T,
            hidden=3584,
            compute_bytes=2,
            checkpointing=True,
        )
        == T * (28 * 2 * 3584 + 8 * 3584) + T * T
    )
    assert recompute_activation_bytes(T, 237_688, 2 * T * T, True) == T * 237_688 + 2 * T * T
    # full: every layer keeps its activations and its mask
    assert (
        saved_activation_bytes(
            tokens=T,
            num_layers=28,
            per_layer_per_token=237_688,
            mask_per_layer=2 * T * T,
            bool_mask=T * T,
            hidden=3584,
            compute_bytes=2,
            checkpointing=False,
        )
        == 28 * (T * 237_688 + 2 * T * T) + T * 8 * 3584 + T * T
    )
    assert recompute_activation_bytes(T, 237_688, 2 * T * T, False) == 0


def test_negative_kv_budget_is_reported_as_zero_and_exposed_signed(spec_of, cluster_of) -> None:
    s, c, w = spec_of("qwen2.5-7b"), cluster_of("1xA100-80G"), Workload()
    knobs = Knobs(rollout_tp=1, gpu_memory_utilization=0.1)  # 8 GiB budget < 14.2 GiB of bf16 weights
    report = estimate_memory(s, c, w, knobs)
    signed = rollout_kv_budget_bytes(s, c, w, knobs)
    assert signed < 0
    assert report.kv_cache_bytes_per_gpu == report.kv_cache_tokens_per_gpu == report.max_concurrent_seqs == 0
    items = report.phases["rollout"].items
    over = items["vllm_weights"] + items["vllm_activation_peak"] + items["vllm_non_torch"] + items["vllm_cuda_graphs"]
    assert signed == int(0.1 * c.gpu.memory_bytes) - over


def test_log_prob_phase_qwen25_7b_peaks_at_the_logits(est) -> None:
    report = est("qwen2.5-7b", "8xA100-80G")
    lp = report.phases["log_prob"].items
    # 16384-token budget, response share ceil(16384 × 1024 / 1536) = 10,923 scored positions, forward
    # only in bf16: the logits (2 bytes per element) and one float32 chunk of 110 rows (4 bytes per element)
    assert lp["logits"] == 2 * 10_923 * V_QWEN25 + 4 * 110 * V_QWEN25
    assert lp["activations"] == 2 * 2 * 3584 * 16_384  # final hidden + normed copy of the 16,384 tokens
    assert lp["gathered_layers"] == 0  # no decoder layer is gathered at the logits
    # resident: fp32 actor shard, Adam shard, bf16 reference shard — no gradients outside the update
    assert lp["actor_params"] == 4 * P_QWEN25_7B // 8 and lp["optimizer_states"] == 8 * P_QWEN25_7B // 8
    assert lp["ref_params"] == 2 * P_QWEN25_7B // 8 and lp["actor_grads"] == 0
    # the rollout engine's CUDA graphs and non-torch buffers stay through the phase, its KV cache does not
    assert lp["vllm_cuda_graphs"] > 0 and lp["vllm_non_torch"] > 0 and "vllm_kv_cache" not in lp


def test_short_sequences_peak_at_the_root_reduce_scatter(est) -> None:
    # Qwen2.5-7B, 8 ranks, one 512-token sequence per micro-batch: the largest update moment is the root's
    # post-backward reduce-scatter of embeddings + lm_head (the traced method finds the same peak,
    # 20,763 MiB of trainer tensors, to the MiB).
    w = Workload(prompt_len_tokens=256, response_len_tokens=256)
    upd = est("qwen2.5-7b", "8xA100-80G", micro_batch_size_per_gpu=1, workload=w).phases["update"].items
    e_plus_h = 2 * 544_997_376
    assert upd["unsharded_grads"] == 2 * e_plus_h == 2_179_989_504  # bf16 grads of embed + lm_head
    assert upd["root_reduce_scatter"] == 4 * e_plus_h == 4_359_979_008  # their fp32 reduce-scatter input
    assert upd["root_embed_lm_head"] == 0  # untied root params are resharded by then
    assert upd["activations"] == upd["logits"] == upd["gathered_layers"] == 0
    states = upd["actor_params"] + upd["actor_grads"] + upd["optimizer_states"]
    assert round((states + upd["unsharded_grads"] + upd["root_reduce_scatter"]) / MiB) == 20_763


def test_forward_only_layer_peak_matches_the_traced_qwen25_7b_pass() -> None:
    # grpo-plan --model qwen2.5-7b --gpus 8xH100-80G --verify, old-policy pass: 32 rows × 1535 fed tokens,
    # no grad. The tracker's Activation peak (inside layers 1..27's SwiGLU) was 7,068,135,936 bytes: the
    # SwiGLU's act, up and product (3·2·I) and four hidden-sized bf16 tensors (embedding output, layer input,
    # post-attention residual, MLP input: 4·2·h) per token, beside a 32·1535² boolean mask (75,399,680
    # bytes after 512-byte rounding) and three int64 id tensors (393,216 each) plus 12,288 bytes
    T, h, inter = 32 * 1535, 3584, 18944
    layer = forward_activation_bytes(
        tokens=T, hidden=h, intermediate=inter, compute_bytes=2, mask_per_layer=0, bool_mask=0
    )
    assert layer == 2 * (3 * inter + 4 * h) * T == 6_991_544_320
    assert layer + 75_399_680 + 3 * 393_216 + 12_288 == 7_068_135_936
    # the single-residual formula this replaced, 2·(3I + h)·T, was 1.06 GiB short of the trace
    assert 7_068_135_936 - 2 * (3 * inter + h) * T == 1_132_868_096


def test_short_log_prob_pass_peaks_at_the_first_layer_unshard(est) -> None:
    # Qwen2.5-7B on 8 ranks, log-prob budget 3072 tokens (2 rows of 512 + 1024), fused head: the traced
    # peak sat in layers.0's pre-forward (FSDP2 keeps the root's all-gather output until the next group's
    # wait_for_unshard): the root unsharded and its all-gather output (2 × 2,179,989,504 bytes of embed +
    # lm_head), layer 0's all-gather output and its unsharded copy (2 × 466,115,584) and the embedding
    # output 2·h·T
    w = Workload(prompts_per_step=256, mini_batch_prompts=64, n=8, prompt_len_tokens=512, response_len_tokens=1024)
    lp = (
        est(
            "qwen2.5-7b",
            "8xH100-80G",
            workload=w,
            log_prob_max_token_len_per_gpu=3072,
            fused_logprob=True,
            ref_param_offload=False,
        )
        .phases["log_prob"]
        .items
    )
    assert lp["root_embed_lm_head"] == 2 * 2_179_989_504
    assert lp["gathered_layers"] == 2 * 466_115_584
    assert lp["activations"] == 2 * 3584 * 3072 and lp["logits"] == 0


def test_log_prob_moments_pick_the_largest() -> None:
    kw = {"root_gathered": 100, "gathered_layers": 20, "head_side": 5, "all_to_all": 0, "embedding_output": 3}
    # a long pass: the layer moment (root + layers + the layer's forward activations)
    assert log_prob_peak_items(layer_forward=500, logits=50, **kw)["activations"] == 500
    # a big logits buffer: the logits moment (no decoder layer gathered)
    at_logits = log_prob_peak_items(layer_forward=10, logits=400, **kw)
    assert at_logits["logits"] == 400 and at_logits["gathered_layers"] == 0
    # few tokens: the first layer's unshard, where the root is held twice
    at_unshard = log_prob_peak_items(layer_forward=10, logits=10, **kw)
    assert at_unshard == {
        "autocast_weight_cache": 0,
        "root_embed_lm_head": 200,
        "gathered_layers": 20,
        "activations": 3,
        "logits": 0,
        "ulysses_all_to_all": 0,
    }
