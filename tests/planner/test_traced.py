"""The traced method through the engine's own actor: closed forms of the sharded states, what the
knobs change, the engine's FSDP2 roots resharded after no-grad passes, and the row-by-row comparison.

A tiny Qwen2 (2 layers, hidden 256, vocab 4096, untied) whose every dim-0 is divisible by 2, traced on
2 fake ranks under CUDA numerics. Every tensor is rounded up to 512 B (the CUDA caching allocator's block).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.profiles.spec import ModelSpec

torch = pytest.importorskip("torch")
from grpo_pilot.verify.fake_trace import CUDA_MIN_BLOCK_BYTES, hf_config_from_spec  # noqa: E402

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
PROMPT, RESPONSE = 64, 192


def _round(nbytes: int) -> int:
    return -(-nbytes // CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES


def _param_shapes(spec: ModelSpec) -> list[tuple[int, ...]]:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config_from_spec(spec))
    return [tuple(p.shape) for p in model.parameters()]


def _sharded_bytes(shapes: list[tuple[int, ...]], world: int, elem_bytes: int) -> int:
    """Σ over parameters of round512(ceil(dim0 / D) · rest · bytes): FSDP2 shards dim 0, padded."""
    return sum(_round(-(-shape[0] // world) * math.prod(shape[1:]) * elem_bytes) for shape in shapes)


def _workload(**kw):
    from grpo_pilot.planner.config import Workload

    # 4 prompts per step, 2 per mini-batch: an old-policy pass; KL loss: a reference pass
    base = dict(prompts_per_step=4, mini_batch_prompts=2, n=4, prompt_len_tokens=PROMPT, response_len_tokens=RESPONSE)
    return Workload(**{**base, **kw})


def _compare(cluster: str = "2xH100", workload=None, **knobs):
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs
    from grpo_pilot.verify.compare import compare_with_analytic

    torch.set_num_threads(1)
    base = dict(micro_batch_size_per_gpu=2, log_prob_max_token_len_per_gpu=1024, ref_param_offload=False)
    return compare_with_analytic(TINY, parse_cluster(cluster), workload or _workload(), Knobs(**{**base, **knobs}))


@pytest.fixture(scope="module")
def reports() -> dict[tuple[bool, bool], object]:
    return {
        (ckpt, fused): _compare(gradient_checkpointing=ckpt, fused_logprob=fused)
        for ckpt, fused in ((False, False), (True, False), (False, True))
    }


def test_sharded_states_match_closed_forms(reports) -> None:
    tr = reports[(False, False)].trace
    shapes = _param_shapes(TINY)
    P, n = TINY.num_params, len(shapes)
    assert tr.num_params == P and tr.world_size == 2 and tr.numerics == "cuda"
    assert tr.policy_shard_bytes == _sharded_bytes(shapes, 2, 4)  # fp32 master shard
    assert tr.ref_shard_bytes == _sharded_bytes(shapes, 2, 2)  # bf16 reference copy under CUDA numerics
    labels = tr.update.optimizer_step_labels
    assert labels["Sharded Param"] == tr.policy_shard_bytes + tr.ref_shard_bytes
    assert abs(labels["Sharded Grad"] - 4 * P // 2) < CUDA_MIN_BLOCK_BYTES * n
    # Adam m and v (8P/D) plus one 512-B `step` scalar per parameter tensor
    assert abs(tr.optimizer_state_bytes - 8 * P // 2 - CUDA_MIN_BLOCK_BYTES * n) < 2 * CUDA_MIN_BLOCK_BYTES * n
    # foreach AdamW (the actor's CUDA kernel) holds one more fp32 shard during the step (+4 B/param)
    transient = labels["OptState"] - tr.optimizer_state_bytes
    assert abs(transient - 4 * P // 2) < CUDA_MIN_BLOCK_BYTES * n


def test_actor_ran_its_own_micro_batching_and_passes(reports) -> None:
    tr = reports[(False, False)].trace
    # 2 prompts x 4 completions per mini-batch over 2 ranks = 4 sequences per rank, micro-batch 2
    assert tr.update_seqs == 4 and tr.update_micro_batches == 2
    assert tr.update_tokens_per_micro_batch == 2 * (PROMPT + RESPONSE - 1)
    # several mini-batches: an old-policy pass; KL: a reference pass; 1024 tokens hold 4 sequences of 256
    assert tr.old_log_prob is not None and tr.ref_log_prob is not None and tr.log_prob_seqs == 4
    assert tr.with_ref and not tr.entropy_grad


def test_no_grad_passes_leave_no_root_gathered(reports) -> None:
    """The actor reshards its FSDP2 roots after log-prob passes (FSDP2 keeps a root gathered after its
    forward, waiting for a backward that a no-grad pass never runs)."""
    tr = reports[(False, False)].trace
    root_bf16 = 2 * (TINY.embedding_params + TINY.lm_head_params)
    layer_bf16 = 2 * TINY.params_per_layer
    ref_pass_gathered = tr.ref_log_prob.labels["Unsharded Param"] + tr.ref_log_prob.labels["All Gather"]
    assert ref_pass_gathered <= root_bf16 + 2 * layer_bf16 + 64 * CUDA_MIN_BLOCK_BYTES  # one root, not two
    assert tr.update.optimizer_step_labels["Unsharded Param"] == 0  # both roots resharded by the step


def test_checkpointing_and_the_fused_head_cut_activations(reports) -> None:
    plain, ckpt, fused = reports[(False, False)], reports[(True, False)], reports[(False, True)]
    row = "activations, logits, temporaries"
    assert ckpt.update.traced.items[row] < plain.update.traced.items[row]
    assert ckpt.trace.update.optimizer_step_labels["OptState"] == plain.trace.update.optimizer_step_labels["OptState"]
    # the plain head materialises fp32 logits [N, V] for the scored positions
    scored = 2 * RESPONSE
    assert plain.update.traced.items[row] > 4 * scored * TINY.vocab_size
    # the chunked head ran instead (on this tiny vocabulary its chunk buffers are not smaller than the logits)
    assert fused.trace.fused_logprob and fused.update.traced.items[row] != plain.update.traced.items[row]


def test_rows_sum_and_errors_are_computed_from_them(reports) -> None:
    for rep in reports.values():
        for check in (rep.update, rep.log_prob):
            assert check.traced.total_bytes == sum(check.traced.items.values())
            assert check.analytic.total_bytes == sum(check.analytic.items.values())
            a, t = check.analytic.total_bytes, check.traced.total_bytes
            assert check.relative_error["total"] == pytest.approx((a - t) / t)
            for row, err in check.relative_error.items():
                if row != "total" and err is not None and check.traced.items[row]:
                    assert err == pytest.approx(
                        (check.analytic.items[row] - check.traced.items[row]) / check.traced.items[row]
                    )
        # the update's traced total is the tracker's peak minus nothing but what the plan keeps off the GPU
        assert rep.update.traced.total_bytes == rep.trace.update.peak_bytes
        # sharded states agree to the 512-B rounding of each tensor
        for row in ("sharded params", "sharded grads", "Adam states", "reference shard"):
            assert abs(rep.update.relative_error[row]) < 0.01, row
        assert "overhead_cuda_context" in rep.update.not_traced


def test_analytic_update_total_is_close_on_the_tiny_model(reports) -> None:
    """A loose bound (small models are dominated by per-tensor rounding and the chunk size of the fused
    head); the full-size accuracy is benchmarks/estimator_accuracy.py's job."""
    for key in ((False, False), (True, False)):
        assert abs(reports[key].update.total_error) < 0.25, key


def test_offloaded_reference_is_left_out() -> None:
    rep = _compare(ref_param_offload=True)
    assert rep.update.traced.items["reference shard"] == 0
    assert rep.update.traced.total_bytes == rep.trace.update.peak_bytes - rep.trace.ref_shard_bytes
    assert any("ref_param_offload" in note for note in rep.notes)


def test_what_cannot_be_traced_is_an_input_error() -> None:
    with pytest.raises(InputError, match="param_offload=True"):
        _compare(param_offload=True)
    with pytest.raises(InputError, match="ulysses_sp=2"):
        _compare(ulysses_sp=2)


def test_spec_the_hf_class_cannot_build_is_an_input_error() -> None:
    from grpo_pilot.engine.actor import LossSettings
    from grpo_pilot.engine.settings import ActorSettings
    from grpo_pilot.verify.traced import trace_actor_step

    no_bias = TINY.model_copy(update={"qkv_bias": False, "name": "qwen2-without-bias"})
    with pytest.raises(InputError, match="transformers built") as info:
        trace_actor_step(
            no_bias,
            world_size=2,
            settings=ActorSettings(),
            loss=LossSettings(),
            prompt_len_tokens=4,
            response_len_tokens=4,
            update_seqs=1,
        )
    assert "qkv_bias=False" in info.value.hint


def test_adjustments_are_undone_after_a_trace(reports) -> None:
    import torch.distributed as dist
    import torch.distributed._tools.mem_tracker as mem_tracker
    import torch.distributed.tensor._sharding_prop as sharding_prop
    from torch._guards import detect_fake_mode

    assert sharding_prop.detect_fake_mode is detect_fake_mode
    assert mem_tracker._WeakRefInfo._calculate_mem_consumed.__name__ == "_calculate_mem_consumed"
    assert not dist.is_initialized()


@pytest.mark.parametrize("alias", ["qwen2.5-7b", "qwen3-8b", "llama-3.1-8b", "qwen2.5-0.5b"])
def test_hf_config_from_spec_builds_the_exact_parameter_count(alias: str) -> None:
    from grpo_pilot.profiles.catalog import resolve_model

    spec = resolve_model(alias).spec
    assert sum(math.prod(shape) for shape in _param_shapes(spec)) == spec.num_params


def test_verify_import_does_not_import_torch() -> None:
    code = (
        "import sys, grpo_pilot.verify.traced, grpo_pilot.verify.compare, grpo_pilot.cli.plan_verify; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
