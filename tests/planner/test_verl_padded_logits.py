"""verl's padded log-prob path (`model.use_remove_padding=False`, memory/logits.py "verl, padded"): the formula
against a cpu trace of the op sequence of dp_actor's non-rmpad branch, and what the planner does with it."""

from __future__ import annotations

import pytest

from grpo_pilot.engine.profiling import _tensor_tracker_class
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.memory.logits import logits_block_bytes, logprob_logits_bytes
from grpo_pilot.planner.traits import traits_for

torch = pytest.importorskip("torch")


class _FlashCrossEntropy(torch.autograd.Function):
    """flash-attn's Triton cross-entropy as verl 0.1 calls it (`cross_entropy_loss(logits, labels)`,
    inplace_backward False): row by row, no logits-sized temporaries; saves the logits and the per-row lse;
    backward allocates empty_like(logits)."""

    @staticmethod
    def forward(ctx, logits, labels):
        lse = torch.stack([torch.logsumexp(logits[i].float(), 0) for i in range(logits.shape[0])])
        ctx.save_for_backward(logits, lse, labels)
        return lse - torch.stack([logits[i, labels[i]].float() for i in range(logits.shape[0])])

    @staticmethod
    def backward(ctx, grad):
        logits, lse, labels = ctx.saved_tensors
        out = torch.empty_like(logits)
        for i in range(logits.shape[0]):
            p = torch.exp(logits[i].float() - lse[i])
            p[labels[i]] -= 1
            out[i] = (p * grad[i]).to(out.dtype)
        return out, None


def _traced_peak(batch: int, seq: int, response: int, vocab: int) -> int:
    """Peak live bytes above the inputs of dp_actor's non-rmpad log-prob + entropy with an entropy bonus,
    CUDA autocast's casts made explicit (softmax with dtype=float32, logsumexp on a float32 copy)."""
    torch.manual_seed(0)
    hidden = torch.randn(batch, seq, 16, dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(vocab, 16, dtype=torch.bfloat16) * 0.02).requires_grad_(True)
    labels = torch.randint(0, vocab, (batch, response))
    tracker = _tensor_tracker_class()()
    with tracker:
        tracker.track_existing()
        base = tracker.live_bytes
        logits = hidden @ weight.t()  # the lm_head under bf16 autocast (transformers >= 4.46: no upcast)
        logits.div_(1.0)
        logits = logits[:, -response - 1 : -1]
        log_probs = -_FlashCrossEntropy.apply(logits.reshape(-1, vocab), labels.reshape(-1)).view(batch, response)
        pd = torch.softmax(logits, -1, dtype=torch.float32)
        entropy = torch.logsumexp(logits.to(torch.float32), -1) - torch.sum(pd * logits, -1, dtype=torch.float32)
        del logits, pd
        loss = -log_probs.mean() - 0.001 * entropy.mean()
        del log_probs, entropy
        loss.backward(inputs=[hidden])
    return tracker.peak_bytes - base


@pytest.mark.parametrize("seq", [12, 48])  # S/R 1.5: logsumexp's backward binds; 6: the product's backward
def test_padded_entropy_gradient_matches_the_traced_op_sequence(seq: int) -> None:
    batch, response, vocab = 2, 8, 4096
    traced = _traced_peak(batch, seq, response, vocab)
    planned = logprob_logits_bytes(
        batch * seq, vocab, 0, 2, kernel="verl", training=True, fused=False, entropy="grad",
        padded_response_tokens=batch * response,
    )  # fmt: skip
    assert planned == pytest.approx(traced, rel=0.005), (traced, planned)  # per-row vectors aside: < one R unit


def test_padded_path_counts_the_eager_float32_entropy() -> None:
    # TinyZero's PPO micro-batch on one H100: 4 rows of 256 + 1024 tokens, Qwen2.5's vocabulary, bf16
    full, resp, vocab, h = 4 * 1280, 4 * 1024, 151936, 2048
    kw = {"kernel": "verl", "fused": False}
    rmpad = logprob_logits_bytes(full, vocab, h, 2, training=True, entropy="grad", **kw)
    padded = logprob_logits_bytes(full, vocab, h, 2, training=True, entropy="grad", padded_response_tokens=resp, **kw)
    assert rmpad == 6 * full * vocab + 2 * full * h
    assert padded == 28 * resp * vocab + 2 * full * h  # logsumexp's backward: 28 bytes per response element
    # no gradient (the old-log-prob pass, entropy as a metric): the logits, then pd, x and logsumexp's temporary
    metric = logprob_logits_bytes(
        full, vocab, h, 2, training=False, entropy="metric", padded_response_tokens=resp, **kw
    )
    assert metric == 2 * full * vocab + 12 * resp * vocab
    # without entropy (the reference pass): the logits and the cross-entropy's copy of the response slice
    bare = logprob_logits_bytes(full, vocab, h, 2, training=False, entropy="none", padded_response_tokens=resp, **kw)
    assert bare == 2 * (full + resp) * vocab
    # the allocator's block: the fp32 [B, R, V] tensors outgrow the bf16 [B, S, V] logits once R > S / 2
    assert logits_block_bytes(full, vocab, 2, padded_response_tokens=resp, **kw) == 4 * resp * vocab
    assert logits_block_bytes(full, vocab, 2, **kw) == 2 * full * vocab


def test_remove_padding_is_a_verl_setting_only() -> None:
    assert Knobs().remove_padding is True
    assert traits_for("verl").has_knob("remove_padding")
    assert not traits_for("grpo-pilot").has_knob("remove_padding")
    assert not traits_for("trl").has_knob("remove_padding")


def test_a_padded_launch_has_no_length_boundary() -> None:
    """TinyZero's PPO launch on 2 H100 (verl 0.1, no remove-padding): every row is padded to 256 + 1024 tokens
    whatever the responses, so an OOM at the maxima is an OOM — no "fits below a mean response" verdict."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "real_runs"))
    from corpus import HERE, evaluate, load_cases

    case = next(c for c in load_cases(HERE / "cases_families.json") if c["id"] == "tinyzero-ppo-qwen2.5-3b-2xH100")
    plan = evaluate(case)["plan"]
    assert plan["knobs"]["remove_padding"] is False
    assert plan["verdict"]["kind"] == "does_not_fit" and plan["verdict"]["boundary_mean_response_tokens"] is None
    assert "use_remove_padding=False" in plan["verdict"]["message"]


def test_verl_before_1100_differentiates_through_the_entropy_even_at_coefficient_zero(est) -> None:
    """dp_actor before 25b0f2262 (#1100) builds `pg_loss - entropy_loss * entropy_coeff` in every update: a
    coefficient of 0 still runs the entropy's backward. Padded, no checkpointing, so the logits bind."""
    w = Workload(entropy_coeff=0.0, prompt_len_tokens=256, response_len_tokens=1024)
    knobs = {"remove_padding": False, "gradient_checkpointing": False, "micro_batch_size_per_gpu": 2}
    today = est("qwen2.5-3b", "2xH100", target="verl", workload=w, **knobs).phases["update"].items["logits"]
    old = est("qwen2.5-3b", "2xH100", target="verl", workload=w, entropy_every_pass=True, **knobs)
    full, resp, vocab, h = 2 * 1280, 2 * 1024, 151936, 2048
    assert today == (2 * full + 4 * resp) * vocab + 2 * full * h  # no entropy: logits, the copy and its gradient
    assert old.phases["update"].items["logits"] == 28 * resp * vocab + 2 * full * h
