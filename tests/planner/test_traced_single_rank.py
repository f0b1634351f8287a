"""The traced method on one unsharded training rank (verify/single_rank.py): the engine's actor with its fp32
weights in place under CUDA's autocast policy (verify/cuda_autocast.py), set beside the analytic model.

A tiny Qwen2 (hidden 256, vocab 4096, untied, GQA 4:2) on fake cpu tensors; GRPO groups of 4, so the
unsharded actor's shared-prompt forward runs. Every tensor is rounded up to 512 B (the CUDA block).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from test_traced import TINY  # noqa: E402  (the same tiny Qwen2 as the sharded traces)

from grpo_pilot.verify.fake_trace import CUDA_MIN_BLOCK_BYTES, hf_config_from_spec  # noqa: E402

# the static decode loop's tensor items in the rollout phase (planner/memory/hf_generate.py)
STATIC_TENSOR_ITEMS = (
    "hf_decode_weight_copy",
    "hf_kv_cache",
    "hf_prefill_activations",
    "hf_sampling_logits",
    "autocast_weight_cache",
)
PROMPT, RESPONSE = 64, 192  # rows of 256 tokens: a 1024-token log-prob budget holds 4 whole rows


def _round(nbytes: int) -> int:
    return -(-nbytes // CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES


@pytest.fixture(scope="module")
def report():
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.verify.compare import compare_with_analytic

    torch.set_num_threads(1)
    # 4 prompts per step, 2 per mini-batch: an old-policy pass; KL loss: a bf16 reference and its pass
    workload = Workload(
        prompts_per_step=4,
        mini_batch_prompts=2,
        n=4,
        prompt_len_tokens=PROMPT,
        response_len_tokens=RESPONSE,
        use_kl_loss=True,
    )
    knobs = Knobs(micro_batch_size_per_gpu=4, log_prob_max_token_len_per_gpu=1024, ref_param_offload=False)
    return compare_with_analytic(TINY, parse_cluster("1xH100"), workload, knobs)


def _trace(layers: int, share: bool, rows: int = 4):
    from grpo_pilot.engine.actor import LossSettings
    from grpo_pilot.engine.settings import ActorSettings
    from grpo_pilot.verify.traced import trace_actor_step

    settings = ActorSettings(
        micro_batch_size=rows, gradient_checkpointing=False, share_prompts=share, log_prob_max_token_len=4096
    )
    return trace_actor_step(
        TINY.model_copy(update={"num_layers": layers}),
        world_size=1,
        settings=settings,
        loss=LossSettings(),
        prompt_len_tokens=PROMPT,
        response_len_tokens=RESPONSE,
        update_seqs=2 * rows,
        log_prob_seqs=rows,
        old_pass=True,
        group_size=4,
    )


def test_one_rank_is_traced_unsharded_beside_the_analytic_model(report) -> None:
    tr = report.trace
    assert tr.world_size == 1 and tr.numerics == "cuda" and tr.group_size == 4
    assert tr.shared_forwards > 0  # grouped micro-batches ran the shared-prompt forward, as the engine's would
    P = TINY.num_params
    assert abs(tr.policy_shard_bytes - 4 * P) < CUDA_MIN_BLOCK_BYTES * 40  # fp32 weights in place, not sharded
    assert abs(tr.ref_shard_bytes - 2 * P) < CUDA_MIN_BLOCK_BYTES * 40  # bf16 reference copy
    for phase in (report.update, report.log_prob):
        assert abs(phase.total_error) < 0.03, (phase.phase, phase.relative_error)
        for row in ("sharded params", "Adam states", "reference shard"):
            assert abs(phase.relative_error[row]) < 0.01, row
    assert report.update.traced.items["sharded grads"] == pytest.approx(4 * P, rel=0.01)


def test_autocast_casts_every_projection_and_the_head_once(report) -> None:
    """A log-prob pass (no grad, but the weights require grad) caches a bf16 copy of every projection weight
    and bias and of the LM head, and of nothing else (not the embedding lookup, not the RMSNorm weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_from_spec(TINY))
    linear = [p for name, p in model.named_parameters() if "proj" in name or "lm_head" in name]
    expected = sum(_round(2 * p.numel()) for p in linear)
    assert report.trace.old_log_prob.labels["Autocast Cast"] == expected
    assert report.trace.ref_log_prob.labels["Autocast Cast"] == 0  # the bf16 reference needs no cast
    assert report.log_prob.analytic.items["autocast weight casts"] == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("share", [False, True])
def test_layer_activations_under_autocast_match_the_formula(share: bool) -> None:
    """One more decoder layer adds exactly the analytic per-layer bytes to the update's peak (plain rows:
    per token × tokens; shared prompts: per token × positions + the layout's per-layer extras)."""
    from grpo_pilot.planner.memory.activations import layer_activation_bytes_per_token
    from grpo_pilot.planner.memory.shared_prompts import shared_layout

    two, three = _trace(2, share), _trace(3, share)
    assert (two.shared_forwards > 0) == share
    grown = three.update.forward_backward_labels["Activation"] - two.update.forward_backward_labels["Activation"]
    per_token = layer_activation_bytes_per_token(
        hidden=TINY.hidden_size,
        q_dim=TINY.q_dim,
        kv_dim=TINY.kv_dim,
        intermediate=TINY.intermediate_size,
        num_heads=TINY.num_attention_heads,
        compute_bytes=2,
        autocast=True,
    )
    rows = 4
    if share:
        lay = shared_layout(
            rows=rows,
            prompt_tokens=PROMPT,
            response_tokens=RESPONSE,
            group_size=4,
            q_dim=TINY.q_dim,
            kv_dim=TINY.kv_dim,
            head_dim=TINY.head_dim,
            compute_bytes=2,
            autocast=True,
        )
        expected = per_token * lay.positions + lay.layer_extra_bytes
    else:
        expected = per_token * rows * (PROMPT + RESPONSE - 1)
    assert abs(grown - expected) <= 16 * CUDA_MIN_BLOCK_BYTES, (grown, expected)


def test_cuda_cast_policy_on_cpu_tensors() -> None:
    """Inside the emulation cpu autocast follows CUDA's lists (fp32 softmax, log_softmax, sum, exp, pow;
    bf16 einsum), keeps cpu's own weight-cast cache for linear (cached under no_grad, not under inference
    mode), and is undone on exit."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from grpo_pilot.verify.cuda_autocast import _registered, cuda_autocast_policy, cuda_policy_ops

    assert cuda_policy_ops() == _registered("AutocastCUDA")  # the tables are torch's own
    x, w = torch.ones(4, 8, dtype=torch.bfloat16), torch.nn.Parameter(torch.ones(8, 8))

    class Copies(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype) and args[0] is w:
                Copies.count += 1
            return func(*args, **(kwargs or {}))

    def casts_of_w(grad_mode) -> int:
        Copies.count = 0
        with grad_mode(), torch.autocast("cpu", dtype=torch.bfloat16), Copies():
            F.linear(x.float(), w)
            F.linear(x.float(), w)
        return Copies.count

    with cuda_autocast_policy():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fp32 = (torch.softmax(x, -1), F.log_softmax(x, -1), x.sum(), x.exp(), x.pow(2), torch.logsumexp(x, -1))
            assert all(t.dtype == torch.float32 for t in fp32)
            assert torch.einsum("ij,kj->ik", x.float(), x.float()).dtype == torch.bfloat16
            assert F.linear(x.float(), w).dtype == torch.bfloat16
        assert casts_of_w(torch.no_grad) == 1
        assert casts_of_w(torch.inference_mode) == 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.softmax(x, -1).dtype == torch.bfloat16  # cpu's own policy again


def test_fake_tensors_get_the_gpus_mask_free_gqa_attention() -> None:
    """On fake tensors transformers would build a causal mask (it cannot read the position ids), which turns
    SDPA's native GQA off; `gpu_attention_masks` gives the trace what a GPU run gets: no mask, k/v at kv heads."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from grpo_pilot.verify.fake_trace import gpu_attention_masks, host_sync_fake_mode

    seen = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((attn_mask is None, k.shape[1], kw.get("enable_gqa", False)))
        return original(q, k, v, attn_mask=attn_mask, **kw)

    F.scaled_dot_product_attention = spy
    try:
        with gpu_attention_masks(), host_sync_fake_mode():
            model = AutoModelForCausalLM.from_config(hf_config_from_spec(TINY), attn_implementation="sdpa")
            model.get_decoder()(input_ids=torch.zeros((2, 8), dtype=torch.long), use_cache=False)
    finally:
        F.scaled_dot_product_attention = original
    assert seen and all(no_mask and heads == TINY.num_kv_heads and gqa for no_mask, heads, gqa in seen)


def test_hf_decode_loop_trace_matches_the_rollout_model() -> None:
    """The engine's decode loop (prefill + 4 steps, inference mode, CUDA autocast) on fake tensors: only the
    LM head's cast is live (no autocast cache under inference mode), the KV cache is float32, and the
    planner's rollout leaf gives the traced peak above the weights."""
    from grpo_pilot.planner.memory.hf_generate import hf_generate_memory
    from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token
    from grpo_pilot.planner.memory.vllm_budget import forward_bytes_per_token
    from grpo_pilot.verify.rollout_trace import trace_hf_decode

    rows, prompt, new = 8, 16, 4
    tr = trace_hf_decode(TINY, batch_seqs=rows, group_size=4, prompt_len_tokens=prompt, new_tokens=new)
    head = 2 * TINY.vocab_size * TINY.hidden_size
    assert tr.labels["Autocast Cast"] == head
    kv32 = kv_bytes_per_token(
        num_layers=TINY.num_layers,
        num_kv_heads=TINY.num_kv_heads,
        head_dim=TINY.head_dim,
        tensor_parallel=1,
        kv_bytes=4,
    )
    gen = hf_generate_memory(
        batch_seqs=rows,
        prompt_seqs=2,
        prompt_tokens=prompt,
        response_tokens=new,
        kv_bytes_per_token=kv32,
        prefill_bytes_per_token=forward_bytes_per_token(
            hidden=TINY.hidden_size,
            q_dim=TINY.q_dim,
            kv_dim=TINY.kv_dim,
            intermediate=TINY.intermediate_size,
            tensor_parallel=1,
            compute_bytes=2,
        ),
        vocab=TINY.vocab_size,
        compute_bytes=2,
        head_cast_bytes=head,
    )
    assert gen.items["hf_kv_cache"] == rows * (prompt + new) * kv32  # the decode moment won
    traced = tr.labels["Activation"] + tr.labels["Autocast Cast"]
    assert sum(gen.items.values()) == pytest.approx(traced, rel=0.03)
    assert tr.labels["Activation"] > rows * (prompt + new) * kv32  # a bf16 cache would be half of this


@pytest.mark.parametrize(
    ("rows", "group", "prompt", "new", "moment"),
    [
        (8, 4, 16, 4, "prefill_head"),  # the prefill's LM head cast under autocast
        (32, 8, 32, 7, "decode"),  # a step's sampling over 32 rows
        (16, 16, 512, 6, "load_prefill"),  # the buffers beside the prefill's fp32 cache
    ],
)
def test_static_loop_trace_matches_the_plan(rows: int, group: int, prompt: int, new: int, moment: str) -> None:
    """The engine's static loop traced with CUDA numerics (bf16 weight copy, bf16 buffers; verify/rollout_trace.py)
    against the plan's rollout items for the same batch: within 2 %, at three different peak moments."""
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.planner.estimate import estimate_memory
    from grpo_pilot.verify.rollout_trace import trace_hf_decode

    w = Workload(
        prompts_per_step=rows // group, mini_batch_prompts=rows // group, n=group, prompt_len_tokens=prompt,
        response_len_tokens=new,
    )  # fmt: skip
    knobs = Knobs(rollout_backend="hf", rollout_tp=1, max_num_seqs=rows, hf_decode="static")
    items = estimate_memory(TINY, parse_cluster("1xH100"), w.worst_case(), knobs).phases["rollout"].items
    tr = trace_hf_decode(TINY, batch_seqs=rows, group_size=group, prompt_len_tokens=prompt, new_tokens=new,
                         decode="static")  # fmt: skip
    assert items["hf_decode_weight_copy"] == tr.labels["Parameter"] // 2 == 2 * TINY.num_params
    winner = {
        "prefill_head": items.get("autocast_weight_cache", 0) > 0,
        "decode": items["hf_sampling_logits"] > TINY.vocab_size * rows * (2 + 8),
        "load_prefill": items["hf_kv_cache"] > rows * (prompt + new) * 1024,  # more than the bf16 buffers
    }
    assert [m for m, hit in winner.items() if hit] == [moment]
    planned = sum(items.get(k, 0) for k in STATIC_TENSOR_ITEMS)
    traced = tr.labels["Activation"] + tr.labels["Autocast Cast"]
    assert planned == pytest.approx(traced, rel=0.02)


@pytest.mark.parametrize(("prompt", "response", "moment"), [(2048, 16, "head"), (64, 48, "embedding")])
def test_tied_head_gradient_moments(prompt: int, response: int, moment: str) -> None:
    """Tied embeddings, a 32k vocabulary, one row per micro-batch and few scored tokens (< h/3, so not the
    logits): a long prompt peaks right after the LM head's backward (its bf16 weight gradient and that
    gradient's fp32 copy in flight, 6·V·h, every activation still saved: the H200 Qwen2.5-3B run's peak); a
    short one at the end of backward (the embedding's dense fp32 gradient, the head's pending one and their
    sum, 12·V·h). The analytic moments against the trace."""
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.planner.estimate import estimate_memory
    from grpo_pilot.planner.memory.autocast import tied_embedding_grad_bytes, unsharded_head_grad_bytes
    from grpo_pilot.verify.compare import compare_with_analytic

    tied = TINY.model_copy(update={"tie_word_embeddings": True, "vocab_size": 32768, "name": "tiny-qwen2-tied"})
    workload = Workload(
        prompts_per_step=2, mini_batch_prompts=2, n=4, prompt_len_tokens=prompt, response_len_tokens=response
    )
    knobs = Knobs(micro_batch_size_per_gpu=1, log_prob_max_token_len_per_gpu=4096, gradient_checkpointing=False)
    cluster = parse_cluster("1xH100")
    items = estimate_memory(tied, cluster, workload.worst_case(), knobs).phases["update"].items
    expected = {
        "head": unsharded_head_grad_bytes(tied, 2, cast=True),
        "embedding": tied_embedding_grad_bytes(tied, sharded=False),
    }
    assert expected == {"head": 6 * 32768 * 256, "embedding": 12 * 32768 * 256}
    assert items["layer_backward_temporaries"] == expected[moment]
    assert items["logits"] == 0 and items["optimizer_step_temporaries"] == 0  # neither the logits nor the step
    rep = compare_with_analytic(tied, cluster, workload, knobs)
    assert rep.trace.update.peak_at == "forward_backward"
    assert abs(rep.update.total_error) < 0.02, rep.update.relative_error


@pytest.mark.parametrize(
    ("rows", "group", "prompt", "new"),
    [(8, 4, 16, 4), (32, 8, 32, 40), (16, 16, 512, 6), (64, 4, 128, 4)],  # sampling / decode / load / prefill
)
def test_static_loop_on_the_cpu_measured_by_the_engine_tracker(rows: int, group: int, prompt: int, new: int) -> None:
    """The static loop run for real on the cpu device (fp32 weights decoded in place: no copy, fp32 buffers), its
    peak above the weights read by the engine's CPU tensor tracker (engine/profiling.py, cpu_memory="tensors"),
    against the plan's rollout items for a 1xcpu plan with hf_decode=static: within 2 %. No row ends (the EOS id
    is past the vocabulary), so every step runs at the full batch."""
    import gc

    from transformers import AutoModelForCausalLM

    from grpo_pilot.engine.profiling import PhaseProfiler
    from grpo_pilot.engine.rollout.static_decode import decode_static
    from grpo_pilot.engine.rollout.static_step import DecodeWeights
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.planner.estimate import estimate_memory

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config_from_spec(TINY), attn_implementation="sdpa").eval()
    prompts = [[(r // group * prompt + j) % (TINY.vocab_size - 1) + 1 for j in range(prompt)] for r in range(rows)]
    gc.collect()  # tensors other tests left unreachable would be freed during the phase, lowering its peak
    profiler = PhaseProfiler("cpu", cpu_memory="tensors")
    profiler.start()
    try:
        weights_bytes = profiler._tracker.live_bytes
        profiler.begin_step()
        with profiler.phase("rollout"), torch.inference_mode():
            decode_static(
                model, DecodeWeights(model, torch.float32), prompts, max_new_tokens=new,
                eos_ids=[TINY.vocab_size + 3], pad_id=0, temperature=1.0, top_p=1.0,
                generator=torch.Generator().manual_seed(0),
            )  # fmt: skip
        measured = profiler.end_step()["rollout"].peak_bytes - weights_bytes
    finally:
        profiler.close()
    w = Workload(
        prompts_per_step=rows // group, mini_batch_prompts=rows // group, n=group, prompt_len_tokens=prompt,
        response_len_tokens=new,
    )  # fmt: skip
    knobs = Knobs(rollout_backend="hf", rollout_tp=1, max_num_seqs=rows, hf_decode="static")
    items = estimate_memory(TINY, parse_cluster("1xcpu"), w.worst_case(), knobs).phases["rollout"].items
    assert items.get("hf_decode_weight_copy", 0) == 0 and "overhead_hf_cuda_graph_pool" not in items
    # the tracker starts from every tensor alive (the fp32 weights among them): the peak above that start
    assert weights_bytes >= items["actor_params"]
    planned = sum(items.get(k, 0) for k in STATIC_TENSOR_ITEMS)
    assert planned == pytest.approx(measured, rel=0.02)
