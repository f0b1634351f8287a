"""Pure helpers of the rollout backends: where a completion ends, prompt checks, seeds, env, KV sizing."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from grpo_pilot.engine.model_factory import build_char_tokenizer
from grpo_pilot.engine.rollout import SamplingConfig
from grpo_pilot.engine.rollout.completion import check_prompts, eos_token_ids, finish_completion, make_decoder, stop_cut
from grpo_pilot.engine.rollout.hf import kv_bytes_per_token
from grpo_pilot.engine.rollout.vllm_backend import GIB, engine_env, request_seeds, stale_reports
from grpo_pilot.errors import InputError

TOK = build_char_tokenizer()
DECODE = make_decoder(TOK)
EOS = TOK.eos_token_id  # 1
PAD = TOK.pad_token_id  # 0


def ids(text: str) -> list[int]:
    return TOK.encode(text)


def test_eos_is_kept_and_everything_after_it_dropped() -> None:
    raw = ids("ab") + [EOS] + ids("cd") + [PAD, PAD]
    gen = finish_completion(raw, eos_ids=(EOS,), sampling=SamplingConfig(max_new_tokens=10), decode=DECODE)
    assert gen.token_ids == (*ids("ab"), EOS)
    assert gen.text == "ab"
    assert gen.finish_reason == "stop"


def test_length_cut_at_max_new_tokens() -> None:
    raw = ids("abcdefgh")
    gen = finish_completion(raw, eos_ids=(EOS,), sampling=SamplingConfig(max_new_tokens=5), decode=DECODE)
    assert gen.token_ids == tuple(ids("abcde"))
    assert gen.finish_reason == "length"
    assert gen.num_tokens == 5


def test_eos_as_last_allowed_token_is_a_stop() -> None:
    raw = ids("abcd") + [EOS]
    gen = finish_completion(raw, eos_ids=(EOS,), sampling=SamplingConfig(max_new_tokens=5), decode=DECODE)
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == EOS and gen.num_tokens == 5


def test_stop_string_kept_and_first_one_wins() -> None:
    raw = ids("x = 4\n#### 4\n\nmore") + [EOS]
    sampling = SamplingConfig(max_new_tokens=50, stop=("\n\n", "####"))
    gen = finish_completion(raw, eos_ids=(EOS,), sampling=sampling, decode=DECODE)
    assert gen.text == "x = 4\n####"
    assert gen.finish_reason == "stop"
    assert gen.token_ids == tuple(ids("x = 4\n####"))


def test_stop_string_after_eos_is_ignored() -> None:
    raw = ids("ab") + [EOS] + ids("STOP")
    gen = finish_completion(
        raw, eos_ids=(EOS,), sampling=SamplingConfig(max_new_tokens=20, stop=("STOP",)), decode=DECODE
    )
    assert gen.token_ids == (*ids("ab"), EOS)


def test_stop_cut_matches_a_linear_scan() -> None:
    text = "the cat sat on the mat. the end"
    toks = ids(text)
    for stop in (("the",), ("mat",), (". ",), ("end",), ("zzz",), ("sat", "cat")):
        linear = next((k for k in range(1, len(toks) + 1) if any(s in DECODE(toks[:k]) for s in stop)), None)
        assert stop_cut(toks, stop, DECODE) == linear, stop


def test_multiple_eos_ids_from_generation_config() -> None:
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[7, EOS]))
    assert eos_token_ids(TOK, model) == (EOS, 7)
    raw = ids("ab") + [7] + ids("c")
    gen = finish_completion(raw, eos_ids=(EOS, 7), sampling=SamplingConfig(max_new_tokens=9), decode=DECODE)
    assert gen.token_ids == (*ids("ab"), 7) and gen.finish_reason == "stop"


def test_no_eos_anywhere_is_an_input_error() -> None:
    tok = SimpleNamespace(eos_token_id=None)
    with pytest.raises(InputError, match="end-of-sequence"):
        eos_token_ids(tok, SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None)))


@pytest.mark.parametrize(
    ("prompts", "match"),
    [([[5, 6], []], "Prompt 1 is empty"), ([[5, 999]], "token id 999"), ([[5] * 20], "over max_model_len=24")],
)
def test_check_prompts_names_the_bad_prompt(prompts: list[list[int]], match: str) -> None:
    with pytest.raises(InputError, match=match):
        check_prompts(prompts, SamplingConfig(max_new_tokens=5), max_model_len=24, vocab_size=100)


def test_check_prompts_accepts_exact_fit() -> None:
    check_prompts([[5] * 19], SamplingConfig(max_new_tokens=5), max_model_len=24, vocab_size=100)


def test_sampling_config_bounds() -> None:
    assert SamplingConfig(temperature=0.0, max_new_tokens=1).greedy
    for bad in ({"max_new_tokens": 0}, {"max_new_tokens": 4, "top_p": 0.0}, {"max_new_tokens": 4, "temperature": -1.0}):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


def test_request_seeds_are_distinct_and_reproducible() -> None:
    a = request_seeds(3, 64)
    assert a == request_seeds(3, 64)
    assert len(set(a)) == 64
    assert set(a).isdisjoint(request_seeds(4, 64))
    assert all(0 <= s < 2**63 for s in a)


def test_engine_env_rounds_kv_cache_up_to_whole_gib() -> None:
    env = engine_env(on_cpu=True, kv_cache_bytes=GIB + 1)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert engine_env(on_cpu=True, kv_cache_bytes=10)["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in engine_env(on_cpu=False, kv_cache_bytes=5 * GIB)


def test_stale_reports_ignore_parameter_free_layers() -> None:
    msgs = [
        "RotaryEmbedding: Failed to load weights",
        "ParallelLMHead: Failed to load weights",
        "Following weights were not loaded from checkpoint: {'x'}",
    ]
    assert stale_reports(msgs, frozenset({"ParallelLMHead", "QKVParallelLinear"})) == msgs[1:]


def test_kv_bytes_per_token_formula() -> None:
    # Qwen2.5-7B shape: 28 layers, 4 KV heads of dim 128 -> 2*28*4*128*2 = 57,344 bytes/token in bf16.
    cfg = SimpleNamespace(
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, hidden_size=3584, head_dim=None
    )
    assert kv_bytes_per_token(cfg, 2) == 57_344
    mha = SimpleNamespace(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=None, hidden_size=128)
    assert kv_bytes_per_token(mha, 4) == 2 * 2 * 2 * 64 * 4
    assert math.isclose(kv_bytes_per_token(cfg, 4), 2 * kv_bytes_per_token(cfg, 2))
