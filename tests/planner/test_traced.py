"""The traced (fake-tensor FSDP2) update step: closed forms of the sharded states, behaviour of the knobs.

A tiny Qwen2 (2 layers, hidden 256, vocab 4096, untied) whose every dim-0 is divisible by 2, traced on
1 and 2 fake ranks. Every tensor is rounded up to 512 B (the CUDA caching allocator's block).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.profiles.spec import ModelSpec

torch = pytest.importorskip("torch")
from grpo_pilot.verify.traced import CATEGORIES, CUDA_MIN_BLOCK_BYTES, hf_config_from_spec, trace_update_step  # noqa: E402

TINY = ModelSpec(
    name="tiny-qwen2",
    architecture="Qwen2ForCausalLM",
    model_type="qwen2",
    hidden_size=256,
    intermediate_size=512,
    num_layers=2,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=64,
    vocab_size=4096,
    tie_word_embeddings=False,
    qkv_bias=True,
    qk_norm=False,
    max_position_embeddings=2048,
)
SEQS, SEQ_LEN = 2, 128


def _round(nbytes: int) -> int:
    return -(-nbytes // CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES


def _param_shapes(spec: ModelSpec) -> list[tuple[int, ...]]:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_from_spec(spec))
    return [tuple(p.shape) for p in model.parameters()]


def _sharded_param_bytes(shapes: list[tuple[int, ...]], world: int, elem_bytes: int) -> int:
    """Σ over parameters of round512(ceil(dim0 / D) · rest · bytes): FSDP2 shards dim 0, padded."""
    total = 0
    for shape in shapes:
        rest = 1
        for d in shape[1:]:
            rest *= d
        total += _round(-(-shape[0] // world) * rest * elem_bytes)
    return total


@pytest.fixture(scope="module")
def traces() -> dict[tuple[int, bool, str], object]:
    torch.set_num_threads(1)
    out = {}
    for world, ckpt, opt in ((1, False, "adamw"), (2, False, "adamw"), (2, True, "adamw"), (2, False, "adamw_fused")):
        out[(world, ckpt, opt)] = trace_update_step(
            TINY,
            world_size=world,
            micro_batch_seqs=SEQS,
            seq_len_tokens=SEQ_LEN,
            gradient_checkpointing=ckpt,
            optimizer=opt,
        )
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_sharded_states_match_closed_forms(traces, world: int) -> None:
    tr = traces[(world, False, "adamw")]
    shapes = _param_shapes(TINY)
    num_tensors = len(shapes)
    P = TINY.num_params
    assert tr.num_params == P
    # parameters: exactly Σ round512(shard bytes); and 4P/D within 512 B per tensor
    assert tr.optimizer_step_labels["Sharded Param"] == _sharded_param_bytes(shapes, world, 4)
    assert abs(tr.optimizer_step_labels["Sharded Param"] - 4 * P // world) < CUDA_MIN_BLOCK_BYTES * num_tensors
    # gradients (fp32 reduce dtype), all present at the optimizer step: 4P/D within the rounding
    assert abs(tr.optimizer_step_labels["Sharded Grad"] - 4 * P // world) < CUDA_MIN_BLOCK_BYTES * num_tensors
    # Adam m and v: 8P/D within the rounding, plus one 512-B scalar `step` tensor per parameter
    assert tr.optimizer_step_counter_bytes == CUDA_MIN_BLOCK_BYTES * num_tensors
    adam = tr.optimizer_state_bytes - tr.optimizer_step_counter_bytes
    assert abs(adam - 8 * P // world) < 2 * CUDA_MIN_BLOCK_BYTES * num_tensors
    # foreach AdamW holds one more fp32 shard transiently during the step (memory-model.md §2: +4 B/param)
    transient = tr.optimizer_step_labels["OptState"] - tr.optimizer_state_bytes
    assert abs(transient - 4 * P // world) < CUDA_MIN_BLOCK_BYTES * num_tensors
    # gradient accumulation: the second micro-batch's backward starts with every sharded grad resident
    assert tr.micro_batches_per_step == 2
    assert abs(tr.forward_backward_labels["Sharded Grad"] - 4 * P // world) < CUDA_MIN_BLOCK_BYTES * num_tensors


def test_sharding_halves_the_states(traces) -> None:
    one, two = traces[(1, False, "adamw")], traces[(2, False, "adamw")]
    for label in ("Sharded Param", "Sharded Grad", "OptState"):
        a, b = one.optimizer_step_labels[label], two.optimizer_step_labels[label]
        assert abs(a / 2 - b) / b < 0.01, label
    # with D = 2 the root's embeddings and lm_head (bf16) are held gathered through backward
    gathered = two.forward_backward_labels["Unsharded Param"]
    assert gathered >= 2 * (TINY.embedding_params + TINY.lm_head_params)


def test_checkpointing_cuts_activations(traces) -> None:
    full, ckpt = traces[(2, False, "adamw")], traces[(2, True, "adamw")]
    assert ckpt.forward_backward_labels["Activation"] < full.forward_backward_labels["Activation"]
    assert ckpt.forward_backward_peak_bytes < full.forward_backward_peak_bytes
    # the model states do not depend on checkpointing
    assert ckpt.optimizer_step_labels == full.optimizer_step_labels
    # activations scale with tokens: the fp32 log-softmax [T, V] alone is saved for backward
    assert full.forward_backward_labels["Activation"] > 4 * SEQS * SEQ_LEN * TINY.vocab_size


def test_packed_row_adds_the_block_causal_mask() -> None:
    """One-row packing under SDPA makes transformers build a [T, T] mask per layer; [B, S] rows (our
    engine's SDPA layout) have none."""
    torch.set_num_threads(1)
    kw = dict(
        world_size=2,
        micro_batch_seqs=4,
        seq_len_tokens=64,
        gradient_checkpointing=False,
        scored_positions_per_seq=48,
        micro_batches_per_step=1,
        # an entropy gradient keeps the logits moment (every saved activation, masks included, alive) the peak
        entropy="loss",
    )
    rows = trace_update_step(TINY, **kw)
    packed = trace_update_step(TINY, packed=True, **kw)
    tokens = 4 * 64
    extra = packed.forward_backward_labels["Activation"] - rows.forward_backward_labels["Activation"]
    mask_bytes = TINY.num_layers * 2 * tokens * tokens  # one bf16 [T, T] mask kept per layer for backward
    assert 0.9 * mask_bytes <= extra <= mask_bytes


def test_fused_adamw_has_no_step_temporaries(traces) -> None:
    fused, foreach = traces[(2, False, "adamw_fused")], traces[(2, False, "adamw")]
    assert fused.optimizer_step_labels["OptState"] == fused.optimizer_state_bytes
    assert foreach.optimizer_step_peak_bytes > fused.optimizer_step_peak_bytes


def test_peak_is_the_larger_phase_and_categories_sum(traces) -> None:
    for tr in traces.values():
        assert tr.peak_bytes == max(tr.forward_backward_peak_bytes, tr.optimizer_step_peak_bytes)
        assert sum(tr.peak_labels.values()) == tr.peak_bytes
        cats = tr.categories()
        assert set(cats) == set(CATEGORIES) and sum(cats.values()) == tr.peak_bytes
        assert tr.trace_s > 0


def test_adjustments_are_undone_after_a_trace(traces) -> None:
    import torch.distributed as dist
    import torch.distributed._tools.mem_tracker as mem_tracker
    import torch.distributed.tensor._sharding_prop as sharding_prop
    from torch._guards import detect_fake_mode

    assert sharding_prop.detect_fake_mode is detect_fake_mode
    assert mem_tracker._WeakRefInfo._calculate_mem_consumed.__name__ == "_calculate_mem_consumed"
    assert not dist.is_initialized()


def test_spec_the_hf_class_cannot_build_is_an_input_error() -> None:
    no_bias = TINY.model_copy(update={"qkv_bias": False, "name": "qwen2-without-bias"})
    with pytest.raises(InputError, match="transformers built") as info:
        trace_update_step(no_bias, world_size=1, micro_batch_seqs=1, seq_len_tokens=8, gradient_checkpointing=False)
    assert "qkv_bias=False" in info.value.hint
    with pytest.raises(InputError, match="param_dtype"):
        trace_update_step(
            TINY, world_size=1, micro_batch_seqs=1, seq_len_tokens=8, gradient_checkpointing=False, param_dtype="bf16"
        )
    with pytest.raises(InputError, match=">= 1"):
        trace_update_step(TINY, world_size=0, micro_batch_seqs=1, seq_len_tokens=8, gradient_checkpointing=False)


@pytest.mark.parametrize("alias", ["qwen2.5-7b", "qwen3-8b", "llama-3.1-8b", "qwen2.5-0.5b"])
def test_hf_config_from_spec_builds_the_exact_parameter_count(alias: str) -> None:
    from grpo_pilot.profiles.catalog import resolve_model

    spec = resolve_model(alias).spec
    assert sum(math.prod(shape) for shape in _param_shapes(spec)) == spec.num_params


def test_verify_import_does_not_import_torch() -> None:
    code = (
        "import sys, grpo_pilot.verify.traced, grpo_pilot.verify.compare; sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ---- cross-check against the analytic estimator ----------------------------------------------------
# Tolerance ±3% of the traced peak. The analytic update phase models the same moments the trace
# shows (memory/moments.py: logits, layer backward, root reduce-scatter, optimizer step) with per-token
# coefficients fitted to traces of other shapes, so what is left is second-order: small per-layer
# tensors (RMSNorm statistics, rotary tables) and the 512-B rounding of each. Measured on this tiny
# model: -0.3% (checkpointing) and -2.1% (none); full-size Qwen2.5 shapes in
# benchmarks/traced_vs_analytic.py. A larger gap is a modelling error to report, not to absorb here.
MAX_REL_ERROR = 0.03


@pytest.fixture(scope="module")
def comparisons() -> dict[bool, object]:
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.verify.compare import compare_with_analytic

    torch.set_num_threads(1)
    workload = Workload(prompts_per_step=16, mini_batch_prompts=4, n=4, prompt_len_tokens=128, response_len_tokens=384)
    return {
        ckpt: compare_with_analytic(
            TINY, parse_cluster("2xH100"), workload, Knobs(micro_batch_size_per_gpu=2, gradient_checkpointing=ckpt)
        )
        for ckpt in (False, True)
    }


def test_analytic_states_equal_traced_states(comparisons) -> None:
    for comp in comparisons.values():
        rows = {r.row: r for r in comp.rows}
        assert comp.tokens_per_micro_batch == 2 * 512
        assert comp.traced.world_size == 2 and comp.traced.scored_positions_per_seq == 384 and not comp.traced.packed
        for name in ("sharded params", "sharded grads", "Adam states"):
            a, t = rows[name].analytic_bytes, rows[name].traced_bytes
            assert abs(a - t) <= CUDA_MIN_BLOCK_BYTES * 3 * len(_param_shapes(TINY)), name


@pytest.mark.parametrize("ckpt", [False, True])
def test_analytic_update_total_matches_the_traced_peak(comparisons, ckpt: bool) -> None:
    comp = comparisons[ckpt]
    assert comp.traced.entropy == "metric"  # our engine's update always computes the entropy metric
    assert sum(r.traced_bytes for r in comp.rows) == comp.traced_peak_bytes
    assert sum(r.analytic_bytes for r in comp.rows) == comp.analytic_traceable_bytes
    assert abs(comp.relative_error) <= MAX_REL_ERROR, (comp.analytic_traceable_bytes, comp.traced_peak_bytes)
    assert "overhead_cuda_context" in comp.not_traced and "ref_params" in comp.not_traced


def test_comparison_refuses_what_it_cannot_trace() -> None:
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.verify.compare import compare_with_analytic

    with pytest.raises(InputError, match="param_offload=True"):
        compare_with_analytic(TINY, parse_cluster("2xH100"), Workload(), Knobs(param_offload=True))
    with pytest.raises(InputError, match="cpu pseudo-device"):
        compare_with_analytic(TINY, parse_cluster("1xcpu"), Workload(), Knobs())
