"""`hf` rollout backend: batching, stop handling, sampling controls, RNG and module-state hygiene."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from grpo_pilot.engine.model_factory import build_char_tokenizer
from grpo_pilot.engine.rollout import Generation, RolloutBackend, SamplingConfig, build_rollout
from grpo_pilot.engine.rollout.hf import HFRollout, kv_bytes_per_token
from grpo_pilot.errors import InputError, RunError

TOK = build_char_tokenizer()
TEXTS = ["hello", "abc 12", "x", "The answer is 42.", "q: 3+4=?", "zz top", "a much longer prompt, with commas"]
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12)


def tiny_qwen2(seed: int = 0) -> torch.nn.Module:
    """2 layers, hidden 128, 2 heads of dim 64. initializer_range 0.1 (not 0.02) gives decisive argmaxes."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=len(TOK),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.1,
        eos_token_id=TOK.eos_token_id,
        pad_token_id=TOK.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_qwen2()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return [TOK.encode(t) for t in TEXTS]


def reference_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """Independent reference: full forward (no KV cache, no padding) and argmax, n times."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
            if ids[-1] == TOK.eos_token_id:
                break
    return ids[len(prompt) :]


def test_batched_greedy_equals_reference_and_per_prompt(model: torch.nn.Module, prompts: list[list[int]]) -> None:
    batched = HFRollout(model, TOK, max_model_len=64, max_num_seqs=3).generate(prompts, GREEDY)  # 3 chunks
    one_by_one = HFRollout(model, TOK, max_model_len=64, max_num_seqs=1)
    assert len(batched) == len(prompts)
    for p, gen in zip(prompts, batched):
        assert gen.token_ids == one_by_one.generate([p], GREEDY)[0].token_ids
        assert list(gen.token_ids) == reference_greedy(model, p, GREEDY.max_new_tokens)
        assert gen.text == TOK.decode(list(gen.token_ids), skip_special_tokens=True)


def test_lengths_and_finish_reasons(model: torch.nn.Module, prompts: list[list[int]]) -> None:
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=7, seed=1)
    for gen in HFRollout(model, TOK, max_model_len=64).generate(prompts * 3, sampling):
        assert 1 <= gen.num_tokens <= 7
        if gen.finish_reason == "length":
            assert gen.num_tokens == 7 and TOK.eos_token_id not in gen.token_ids
        else:
            assert gen.token_ids[-1] == TOK.eos_token_id


def test_kv_budget_caps_rows_without_changing_outputs(model: torch.nn.Module, prompts: list[list[int]]) -> None:
    seq = max(map(len, prompts)) + GREEDY.max_new_tokens
    per_seq = kv_bytes_per_token(model.config, 4) * seq  # fp32 on CPU: 2*2*2*64*4 = 2048 B/token
    assert per_seq == 2048 * seq
    capped = HFRollout(model, TOK, max_model_len=64, kv_cache_bytes=2 * per_seq + 1)
    assert capped.rows_per_chunk(seq, torch.device("cpu")) == 2
    free = HFRollout(model, TOK, max_model_len=64)
    assert [g.token_ids for g in capped.generate(prompts, GREEDY)] == [
        g.token_ids for g in free.generate(prompts, GREEDY)
    ]


def test_stop_string_cuts_a_real_completion(model: torch.nn.Module, prompts: list[list[int]]) -> None:
    backend = HFRollout(model, TOK, max_model_len=64)
    full = backend.generate(prompts[:1], SamplingConfig(temperature=0.0, max_new_tokens=20))[0]
    stop = full.text[4:6]  # a substring the model really produces
    end = full.text.index(stop) + len(stop)
    cut = backend.generate(prompts[:1], SamplingConfig(temperature=0.0, max_new_tokens=20, stop=(stop,)))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:end]
    assert cut.token_ids == full.token_ids[:end]


def test_eos_from_generation_config_ends_the_completion(prompts: list[list[int]]) -> None:
    net = tiny_qwen2()
    full = HFRollout(net, TOK, max_model_len=64).generate(prompts[:1], GREEDY)[0]
    new_eos = full.token_ids[3]
    first = full.token_ids.index(new_eos)
    net.generation_config.eos_token_id = [TOK.eos_token_id, new_eos]
    gen = HFRollout(net, TOK, max_model_len=64).generate(prompts[:1], GREEDY)[0]
    assert gen.token_ids == full.token_ids[: first + 1]
    assert gen.finish_reason == "stop"


def test_sampling_is_seeded_and_leaves_the_global_rng_alone(model: torch.nn.Module, prompts: list[list[int]]) -> None:
    backend = HFRollout(model, TOK, max_model_len=64)
    s1 = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=11)
    torch.manual_seed(123)
    a = backend.generate(prompts, s1)
    after = torch.rand(3)
    torch.manual_seed(123)
    expected = torch.rand(3)
    assert torch.equal(after, expected)
    b = backend.generate(prompts, s1)
    c = backend.generate(prompts, s1.model_copy(update={"seed": 12}))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    group = backend.generate([prompts[0]] * 6, s1)  # one GRPO group: copies must differ
    assert len({g.token_ids for g in group}) > 1


def test_tiny_top_p_and_tiny_temperature_reduce_to_greedy(model: torch.nn.Module, prompts: list[list[int]]) -> None:
    backend = HFRollout(model, TOK, max_model_len=64)
    greedy = [g.token_ids for g in backend.generate(prompts, GREEDY)]
    nucleus = backend.generate(prompts, SamplingConfig(temperature=1.0, top_p=1e-6, max_new_tokens=12, seed=5))
    cold = backend.generate(prompts, SamplingConfig(temperature=1e-4, max_new_tokens=12, seed=5))
    assert [g.token_ids for g in nucleus] == greedy
    assert [g.token_ids for g in cold] == greedy
    hot = backend.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=12, seed=5))
    assert [g.token_ids for g in hot] != greedy


def test_module_state_restored_and_checkpoint_defaults_ignored(prompts: list[list[int]]) -> None:
    net = tiny_qwen2()
    reference = [g.token_ids for g in HFRollout(net, TOK, max_model_len=64).generate(prompts, GREEDY)]
    net.train()
    net.gradient_checkpointing_enable()
    net.config.use_cache = False
    net.generation_config.repetition_penalty = 50.0  # would change greedy outputs if it leaked in
    net.generation_config.top_k = 1
    out = HFRollout(net, TOK, max_model_len=64).generate(prompts, GREEDY)
    assert [g.token_ids for g in out] == reference
    assert net.training and net.is_gradient_checkpointing
    assert net.config.use_cache is False
    assert net.generation_config.repetition_penalty == 50.0 and net.generation_config.top_k == 1
    assert all(p.grad is None for p in net.parameters())


def test_factory_protocol_and_errors(model: torch.nn.Module, prompts: list[list[int]]) -> None:
    backend = build_rollout("hf", model, TOK, max_model_len=32, gpu_memory_utilization=0.5)
    assert isinstance(backend, RolloutBackend) and backend.name == "hf"
    assert backend.generate([], GREEDY) == []
    with pytest.raises(InputError, match="over max_model_len=32"):
        backend.generate([[5] * 25], GREEDY)
    assert backend.shares_policy  # generating on the policy itself: a sync has nothing to copy, takes nothing
    backend.sync_weights(_explode())
    backend.sleep()
    backend.wake()
    assert isinstance(backend.generate(prompts[:1], GREEDY)[0], Generation)
    backend.close()
    with pytest.raises(RunError, match="closed"):
        backend.generate(prompts[:1], GREEDY)
    with pytest.raises(InputError, match="tensor_parallel_size=2"):
        build_rollout("hf", model, TOK, max_model_len=32, gpu_memory_utilization=0.5, tensor_parallel_size=2)
    with pytest.raises(InputError, match="Unknown rollout backend"):
        build_rollout("sglang", model, TOK, max_model_len=32, gpu_memory_utilization=0.5)  # type: ignore[arg-type]


def _explode():
    raise AssertionError("the weights were read")
    yield  # pragma: no cover


def test_replica_sync_copies_every_named_weight_and_refuses_partial_syncs(prompts: list[list[int]]) -> None:
    from grpo_pilot.engine.weight_sync import buckets, full_weights, stream

    other = tiny_qwen2(seed=1)
    replica = HFRollout(tiny_qwen2(seed=0), TOK, max_model_len=32, shares_policy=False)
    want = [g.token_ids for g in HFRollout(other, TOK, max_model_len=32).generate(prompts[:2], GREEDY)]
    assert [g.token_ids for g in replica.generate(prompts[:2], GREEDY)] != want
    replica.sync_weights(stream(buckets(full_weights(other), 4096)))  # several small buckets
    assert [g.token_ids for g in replica.generate(prompts[:2], GREEDY)] == want
    some = [(n, t) for n, t in full_weights(other) if not n.endswith("lm_head.weight")]
    with pytest.raises(RunError, match="stale"):
        replica.sync_weights(some)
    with pytest.raises(RunError, match="does not have"):
        replica.sync_weights([("no.such.weight", torch.zeros(1))])


def test_vllm_backend_errors_without_starting_an_engine(
    model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in (
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_LOGGING_LEVEL",
    ):
        monkeypatch.delenv(key, raising=False)  # restored after the test
    with pytest.raises(InputError, match="tensor_parallel_size=2 needs a group of workers"):
        build_rollout("vllm", model, TOK, max_model_len=32, gpu_memory_utilization=0.5, tensor_parallel_size=2)
    with pytest.raises(InputError, match="kv_cache_bytes=0"):
        build_rollout("vllm", model, TOK, max_model_len=32, gpu_memory_utilization=0.5, kv_cache_bytes=0)
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vllm were not installed
    with pytest.raises(InputError, match="needs vLLM"):
        build_rollout("vllm", model, TOK, max_model_len=32, gpu_memory_utilization=0.5, kv_cache_bytes=3 << 30)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"
