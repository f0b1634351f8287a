"""The lean decode loop: sampling rule, prefill sharing, early exit, and the Llama-family step vs transformers."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import VOCAB, tiny

import grpo_pilot.engine.rollout.decode as decode_module
from grpo_pilot.engine.rollout.decode import decode_batch, left_pad, sample_next
from grpo_pilot.engine.rollout.llama_step import LlamaDecodeStep, unsupported_reason

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [5, 6, 7, 8, 9], [20, 21, 22, 23, 24, 25, 26], [11, 12]]


def draws(logits: list[float], *, rows: int = 20000, seed: int = 0, **kw: float) -> torch.Tensor:
    """Empirical frequencies of `rows` draws from the same logits row."""
    g = torch.Generator().manual_seed(seed)
    picked = sample_next(torch.tensor([logits] * rows), generator=g, **{"temperature": 1.0, "top_p": 1.0, **kw})
    return torch.bincount(picked, minlength=len(logits)).float() / rows


def test_sampling_follows_softmax_temperature_and_top_p() -> None:
    p = [0.5, 0.3, 0.15, 0.05]
    logits = [math.log(x) for x in p] + [-math.inf]
    tol = 0.015  # 4+ binomial standard deviations at 20000 draws
    torch.testing.assert_close(draws(logits), torch.tensor(p + [0.0]), atol=tol, rtol=0)
    # temperature 2: p^(1/2), renormalised
    hot = torch.tensor(p).sqrt()
    torch.testing.assert_close(
        draws(logits, temperature=2.0), torch.cat([hot / hot.sum(), torch.zeros(1)]), atol=tol, rtol=0
    )
    # top-p 0.7: kept while the mass before a token is < 0.7 -> {0.5, 0.3}, renormalised
    # (transformers' TopPLogitsWarper rule)
    torch.testing.assert_close(draws(logits, top_p=0.7), torch.tensor([0.625, 0.375, 0.0, 0.0, 0.0]), atol=tol, rtol=0)
    # top-p 0.5: the mass before token 1 is exactly 0.5 -> only the most likely token remains
    assert draws(logits, top_p=0.5).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    # greedy, and a one-hot row always gives its token
    assert sample_next(
        torch.tensor([logits, [0.0, 9.0, 1.0, 0.0, 0.0]]), temperature=0.0, top_p=1.0, generator=None
    ).tolist() == [0, 1]
    assert draws([-math.inf, -math.inf, 3.0], rows=500).tolist() == [0.0, 0.0, 1.0]
    # the caller's generator decides: same seed, same draws
    assert torch.equal(draws(logits, rows=64, seed=3), draws(logits, rows=64, seed=3))


def test_left_pad_right_aligns_prompts() -> None:
    ids, real = left_pad([[1, 2, 3], [4]], 0, torch.device("cpu"))
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert real.tolist() == [[True, True, True], [False, False, True]]


def reference_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """Full forward without cache or padding, argmax, n times."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def greedy(
    model: torch.nn.Module, prompts: list[list[int]], n: int = 6, eos: tuple[int, ...] = (1,)
) -> list[list[int]]:
    with torch.no_grad():
        return decode_batch(
            model, prompts, max_new_tokens=n, eos_ids=eos, pad_id=0, temperature=0.0, top_p=1.0, generator=None
        )


def step_vs_transformers(model: torch.nn.Module, *, atol: float, rtol: float) -> LlamaDecodeStep:
    """Three decode steps of `LlamaDecodeStep` and of transformers' forward from the same ragged, left-padded
    prefill; logits compared at each step (the next token is transformers' argmax). Returns the step."""
    from transformers import DynamicCache

    assert unsupported_reason(model) is None
    ids, real = left_pad(PROMPTS, 0, torch.device("cpu"))
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    rows = torch.arange(len(PROMPTS))
    total = ids.shape[1] + 4
    key_mask = torch.ones((len(PROMPTS), total), dtype=torch.bool)
    key_mask[:, : ids.shape[1]] = real
    with torch.no_grad():
        caches = [DynamicCache(config=model.config) for _ in range(2)]
        for cache in caches:
            model(
                input_ids=ids, attention_mask=real.long(), position_ids=positions, past_key_values=cache, use_cache=True
            )
        step = LlamaDecodeStep(model, caches[0], rows, key_mask)
        token, last = torch.tensor([3, 4, 5, 6, 7]), positions[:, -1:]
        for t in range(1, 4):
            last = last + 1
            ours = step(token, last)
            theirs = model(
                input_ids=token[:, None],
                attention_mask=key_mask[:, : ids.shape[1] + t].long(),
                position_ids=last,
                past_key_values=caches[1],
                use_cache=True,
            ).logits[:, -1]
            torch.testing.assert_close(ours, theirs, atol=atol, rtol=rtol)
            token = theirs.argmax(-1)
    return step


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("qwen2", {}),
        ("qwen3", {}),
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
    ],
)
def test_llama_family_step_matches_the_transformers_forward(model_type: str, extra: dict) -> None:
    # fp32: the lean variant (hand-written GQA attention on an additive mask, fused residual matmuls);
    # the last case's RoPE is not "default", so cos/sin come from rotary_emb every step
    step = step_vs_transformers(tiny(model_type, **extra), atol=1e-5, rtol=1e-5)
    assert step.lean and (step.table is None) == ("rope_parameters" in extra)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_bf16_and_autocast_use_the_modules_variant_and_match_transformers(model_type: str) -> None:
    # bf16 weights: the model's own norm modules and SDPA, as transformers runs them -> the same bf16 numbers
    step = step_vs_transformers(tiny(model_type).to(torch.bfloat16), atol=1e-2, rtol=1e-2)
    assert not step.lean and step.keys[0].dtype == torch.bfloat16
    # fp32 weights under bf16 autocast (the CUDA rollout's setting, here on the CPU): not lean either
    with torch.autocast("cpu", dtype=torch.bfloat16):
        step = step_vs_transformers(tiny(model_type), atol=1e-2, rtol=1e-2)
    assert not step.lean


def test_unsupported_models_are_named_and_decode_the_same_through_their_own_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert "eager" in str(unsupported_reason(tiny("qwen2", attn="eager")))
    assert "sliding" in str(
        unsupported_reason(tiny("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0))
    )
    assert "gpt2" in str(unsupported_reason(_gpt2()))
    model = tiny("qwen2")
    fast = greedy(model, PROMPTS)
    assert fast == [reference_greedy(model, p, 6) for p in PROMPTS]
    eager = tiny("qwen2", attn="eager")  # same seed, same weights; 2-D mask path of the loop
    assert greedy(eager, PROMPTS) == fast
    monkeypatch.setattr(decode_module, "unsupported_reason", lambda m: "forced")  # transformers' forward + DynamicCache
    assert greedy(model, PROMPTS) == fast


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64))


def test_shared_prefill_and_early_exit() -> None:
    model = tiny("qwen2")
    # duplicated prompts share one prefill row: every copy decodes as if alone
    together = greedy(model, PROMPTS)
    assert together[0] == together[2] and together[1] == together[4]
    assert together == [greedy(model, [p])[0] for p in PROMPTS]
    # every id ends a completion: one token per row, the loop stops after the first step
    everything = tuple(range(VOCAB))
    assert [len(r) for r in greedy(model, PROMPTS, n=6, eos=everything)] == [1] * len(PROMPTS)
    # finished rows are padded while the others continue
    first = [r[0] for r in together]
    rows = greedy(model, PROMPTS, n=6, eos=(first[1],))
    assert rows[1] == [first[1], 0, 0, 0, 0, 0] and rows[4] == rows[1]
    for got, alone in zip(rows, together):
        cut = alone.index(first[1]) + 1 if first[1] in alone else len(alone)
        assert got == alone[:cut] + [0] * (len(alone) - cut)


def test_the_compaction_rule_and_its_bounds() -> None:
    should = decode_module.should_compact
    assert decode_module.COMPACT_FRACTION == 0.25
    assert should(1, 4, 0.25) and should(3, 8, 0.25) and not should(1, 5, 0.25) and not should(2, 9, 0.25)
    assert not should(0, 4, 1e-9) and not should(7, 8, None) and should(8, 8, 1.0) and not should(7, 8, 1.0)
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="compact_fraction"):
            decode_batch(
                tiny("qwen2"),
                PROMPTS,
                max_new_tokens=2,
                eos_ids=(1,),
                pad_id=0,
                temperature=0.0,
                top_p=1.0,
                generator=None,
                compact_fraction=bad,
            )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_rows_shrinks_the_step_and_leaves_the_kept_rows_logits_unchanged(dtype: torch.dtype) -> None:
    # unchanged up to rounding: the BLAS picks its matmul kernel by the row count (decode.py's docstring)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    from transformers import DynamicCache

    model = tiny("qwen3").to(dtype)
    ids, real = left_pad(PROMPTS, 0, torch.device("cpu"))
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    key_mask = torch.ones((len(PROMPTS), ids.shape[1] + 4), dtype=torch.bool)
    key_mask[:, : ids.shape[1]] = real
    steps = []
    with torch.no_grad():
        for _ in range(2):
            cache = DynamicCache(config=model.config)
            model(
                input_ids=ids, attention_mask=real.long(), position_ids=positions, past_key_values=cache, use_cache=True
            )
            steps.append(LlamaDecodeStep(model, cache, torch.arange(len(PROMPTS)), key_mask))
        full, kept = steps
        assert full.lean == (dtype == torch.float32)
        token, last = torch.tensor([3, 4, 5, 6, 7]), positions[:, -1:] + 1
        torch.testing.assert_close(full(token, last), kept(token, last), atol=0, rtol=0)
        rows = torch.tensor([3, 0, 1])  # rows 2 and 4 finished; the kept ones in a new order
        kept.keep_rows(rows)
        assert (
            kept.num_rows == 3
            and all(k.shape[0] == 3 for k in kept.keys + kept.values)
            and kept.mask.shape[0] == 3 * (2 if full.lean else 1)
        )
        for _ in range(3):  # the kept rows decode exactly as inside the full batch (0 and 1 have left padding, 3 none)
            last = last + 1
            ours = full(token, last)
            torch.testing.assert_close(kept(token[rows], last[rows]), ours[rows], **tol)
            token = ours.argmax(-1)


def decode_batch_sizes(model: torch.nn.Module, fast: bool, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that collects the batch size of every decode forward (the Llama step's calls, or the model's
    after the prefill)."""
    sizes: list[int] = []
    if fast:
        original = LlamaDecodeStep.__call__
        monkeypatch.setattr(
            LlamaDecodeStep,
            "__call__",
            lambda self, tokens, positions: (sizes.append(len(tokens)), original(self, tokens, positions))[1],
        )
    else:
        monkeypatch.setattr(
            decode_module, "unsupported_reason", lambda m: "forced"
        )  # transformers' forward + DynamicCache
        model.register_forward_pre_hook(
            lambda mod, args, kwargs: (
                sizes.append(kwargs["input_ids"].shape[0]) if kwargs["input_ids"].shape[1] == 1 else None
            ),
            with_kwargs=True,
        )
    return sizes


@pytest.mark.parametrize("fast", [True, False], ids=["llama_step", "generic"])
@pytest.mark.parametrize(
    ("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (1.0, 0.8)], ids=["greedy", "t1", "t1_top_p"]
)
def test_compaction_on_and_off_give_identical_completions(
    fast: bool, temperature: float, top_p: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    model = tiny("qwen2")
    sizes = decode_batch_sizes(model, fast, monkeypatch)
    # 14 rows, 7 distinct prompts: the shared prefill expands 3 of them to 4 or 2 rows
    prompts = PROMPTS * 2 + [[30 + i, 31 + 2 * i, 60 - i][: i + 1] for i in range(4)]
    eos = tuple(range(40, 52))  # ~1 in 8 ids ends a row: long-tailed lengths

    def stop(tails: list[list[int]]) -> list[bool]:  # also stop on two ids in a row summing to a multiple of 13
        return [len(t) == 2 and sum(t) % 13 == 0 for t in tails]

    def run(compact: float | None) -> list[list[int]]:
        sizes.clear()
        g = torch.Generator().manual_seed(11)
        with torch.inference_mode():
            return decode_batch(
                model,
                prompts,
                max_new_tokens=20,
                eos_ids=eos,
                pad_id=0,
                temperature=temperature,
                top_p=top_p,
                generator=g,
                stop=stop,
                stop_window=2,
                compact_fraction=compact,
            )

    off = run(None)
    assert sizes and set(sizes) == {len(prompts)}  # never compacted: every forward over all 14 rows
    on_default = run(decode_module.COMPACT_FRACTION)
    default_sizes = list(sizes)
    on_eager = run(1e-9)  # compact as soon as any row finishes
    assert on_default == off and on_eager == off
    # compaction really happened: the decode batch shrank, never grew, and ended below the full batch
    for shrunk in (default_sizes, sizes):
        assert shrunk == sorted(shrunk, reverse=True) and shrunk[-1] < len(prompts)
    assert len(set(sizes)) >= len(set(default_sizes)) >= (3 if temperature else 2)
    # long-tailed, ended both ways: rows stop at their first EOS or stop hit, the longest ran to the loop's end,
    # the rest padded
    ends = [
        next(
            ((i + 1, t in eos) for i, t in enumerate(r) if t in eos or (i and (r[i - 1] + t) % 13 == 0)), (len(r), None)
        )
        for r in off
    ]
    assert max(n for n, _ in ends) == len(off[0]) > min(n for n, _ in ends) and {True, False} <= {
        by_eos for _, by_eos in ends
    }
    assert all(r[n:] == [0] * (len(r) - n) for r, (n, _) in zip(off, ends))
