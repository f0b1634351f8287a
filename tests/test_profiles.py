"""Bundled model configs, exact parameter counts and model resolution (no torch).

The architecture table below is the record of what was checked against public sources
(`grpo_pilot/profiles/configs/SOURCES.md`); a wrong edit of a bundled JSON fails here.
"""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from importlib import resources
from pathlib import Path

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.profiles import bundled_names, load_hf_config, resolve_model, spec_from_hf_config

CONFIGS = Path(str(resources.files("grpo_pilot.profiles") / "configs"))

# alias: (hidden, intermediate, layers, q heads, kv heads, head_dim, vocab, tied, max_positions, rope_theta)
VERIFIED = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 64, 151936, True, 32768, 1e6),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 128, 151936, True, 131072, 1e6),
    "qwen2.5-3b": (2048, 11008, 36, 16, 2, 128, 151936, True, 32768, 1e6),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 128, 152064, False, 131072, 1e6),
    "qwen2.5-14b": (5120, 13824, 48, 40, 8, 128, 152064, False, 131072, 1e6),
    "qwen2.5-32b": (5120, 27648, 64, 40, 8, 128, 152064, False, 131072, 1e6),
    "qwen2.5-72b": (8192, 29568, 80, 64, 8, 128, 152064, False, 131072, 1e6),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936, True, 40960, 1e6),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936, True, 40960, 1e6),
    "qwen3-4b": (2560, 9728, 36, 32, 8, 128, 151936, True, 40960, 1e6),
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936, False, 40960, 1e6),
    "qwen3-14b": (5120, 17408, 40, 40, 8, 128, 151936, False, 40960, 1e6),
    "qwen3-32b": (5120, 25600, 64, 64, 8, 128, 151936, False, 40960, 1e6),
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128, 128256, False, 131072, 5e5),
    "llama-3.1-70b": (8192, 28672, 80, 64, 8, 128, 128256, False, 131072, 5e5),
    "llama-3.1-405b": (16384, 53248, 126, 128, 8, 128, 128256, False, 131072, 5e5),
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 64, 128256, True, 131072, 5e5),
    "llama-3.2-3b": (3072, 8192, 28, 24, 8, 128, 128256, True, 131072, 5e5),
    "deepseek-r1-distill-qwen-1.5b": (1536, 8960, 28, 12, 2, 128, 151936, False, 131072, 1e4),
    "deepseek-r1-distill-qwen-7b": (3584, 18944, 28, 28, 4, 128, 152064, False, 131072, 1e4),
    "deepseek-r1-distill-qwen-14b": (5120, 13824, 48, 40, 8, 128, 152064, False, 131072, 1e6),
    "deepseek-r1-distill-qwen-32b": (5120, 27648, 64, 40, 8, 128, 152064, False, 131072, 1e6),
    "qwen2-0.5b": (896, 4864, 24, 14, 2, 64, 151936, True, 131072, 1e6),
    "qwen2-1.5b": (1536, 8960, 28, 12, 2, 128, 151936, True, 131072, 1e6),
    "qwen2-7b": (3584, 18944, 28, 28, 4, 128, 152064, False, 32768, 1e6),
    "qwen2-72b": (8192, 29568, 80, 64, 8, 128, 152064, False, 32768, 1e6),
    "qwen2.5-coder-14b": (5120, 13824, 48, 40, 8, 128, 152064, False, 32768, 1e6),
    "qwen2.5-math-1.5b": (1536, 8960, 28, 12, 2, 128, 151936, True, 4096, 1e4),
    "qwen2.5-math-7b": (3584, 18944, 28, 28, 4, 128, 152064, False, 4096, 1e4),
    "deepseek-llm-7b": (4096, 11008, 30, 32, 32, 128, 102400, False, 4096, 1e4),
}


def _raw(alias: str) -> dict:
    return json.loads((CONFIGS / f"{alias}.json").read_text())


def _billions(text: str) -> Decimal:
    assert text.endswith("B"), text
    return Decimal(text[:-1])


def _matches_published(exact: int, published: str) -> bool:
    """Within 1% of the card's figure, or the card's own rounding of the exact count.

    Cards give 2-4 significant digits; "1.7B" (Qwen3-1.7B) is 1.2% from the exact 1.7206B but is
    exactly what rounding 1.7206 to one decimal gives, so it is still a match.
    """
    value = _billions(published)
    exact_b = Decimal(exact) / Decimal(10**9)
    within_1pct = abs(exact_b - value) <= value * Decimal("0.01")
    rounded = exact_b.quantize(Decimal(1).scaleb(value.as_tuple().exponent)) == value
    return within_1pct or rounded


def test_every_bundled_model_is_verified() -> None:
    assert set(bundled_names()) == set(VERIFIED)


@pytest.mark.parametrize("alias", sorted(VERIFIED))
def test_bundled_architecture_matches_published_config(alias: str) -> None:
    h, inter, layers, heads, kv, head_dim, vocab, tied, max_pos, rope = VERIFIED[alias]
    spec = resolve_model(alias).spec
    got = (
        spec.hidden_size,
        spec.intermediate_size,
        spec.num_layers,
        spec.num_attention_heads,
        spec.num_kv_heads,
        spec.head_dim,
        spec.vocab_size,
        spec.tie_word_embeddings,
        spec.max_position_embeddings,
    )
    assert got == (h, inter, layers, heads, kv, head_dim, vocab, tied, max_pos)
    assert _raw(alias)["rope_theta"] == rope


@pytest.mark.parametrize("alias", sorted(VERIFIED))
def test_exact_count_matches_published_count(alias: str) -> None:
    resolved = resolve_model(alias)
    assert resolved.published_params is not None
    assert _matches_published(resolved.spec.num_params, resolved.published_params), (
        alias,
        resolved.spec.num_params,
        resolved.published_params,
    )


@pytest.mark.parametrize("alias", sorted(a for a in VERIFIED if "_published_non_embedding_params" in _raw(a)))
def test_non_embedding_count_matches_card(alias: str) -> None:
    """Qwen cards also state a count without input embedding and untied lm_head."""
    spec = resolve_model(alias).spec
    non_embedding = spec.num_params - spec.embedding_params - spec.lm_head_params
    assert _matches_published(non_embedding, _raw(alias)["_published_non_embedding_params"])


def test_fine_tuned_variants_resolve_to_the_base_shape() -> None:
    """Hub ids of -Instruct / -Chat / -Base variants resolve to the bundled base config (same shapes)."""
    assert resolve_model("Qwen/Qwen2-7B-Instruct").resolved == "qwen2-7b"
    assert resolve_model("deepseek-ai/deepseek-llm-7b-chat").resolved == "deepseek-llm-7b"
    assert resolve_model("Qwen/Qwen2.5-Coder-14B-Instruct").resolved == "qwen2.5-coder-14b"
    assert resolve_model("deepseek-ai/deepseek-llm-7b-chat").spec.num_kv_heads == 32  # MHA: KV as wide as q


def test_published_count_check_rejects_a_wrong_count() -> None:
    # 2% off is neither within 1% nor the card's rounding: the check has teeth.
    assert not _matches_published(7_770_000_000, "7.61B")
    assert _matches_published(7_615_616_512, "7.61B")


def test_qwen2_5_7b_hand_count() -> None:
    """h=3584, I=18944, L=28, 28 q heads / 4 kv heads of d=128, V=152064, untied, q/k/v biases."""
    h, inter, layers, vocab = 3584, 18944, 28, 152064
    q_dim, kv_dim = 28 * 128, 4 * 128  # 3584, 512
    attn_weights = h * q_dim + 2 * h * kv_dim + q_dim * h  # 12,845,056 + 3,670,016 + 12,845,056
    assert attn_weights == 29_360_128
    attn_bias = q_dim + 2 * kv_dim  # 4,608 (o_proj has none)
    mlp = 3 * h * inter  # gate, up, down = 203,685,888
    assert mlp == 203_685_888
    norms = 2 * h  # input + post-attention RMSNorm = 7,168
    per_layer = attn_weights + attn_bias + mlp + norms
    assert per_layer == 233_057_792
    embeddings = vocab * h  # 544,997,376, counted twice (untied lm_head)
    total = layers * per_layer + 2 * embeddings + h  # + final norm
    assert total == 7_615_616_512
    spec = resolve_model("qwen2.5-7b").spec
    assert spec.params_per_layer == per_layer
    assert spec.num_params == total


def test_qwen3_has_qk_norm_and_no_qkv_bias() -> None:
    spec = resolve_model("qwen3-0.6b").spec
    assert spec.qk_norm and not spec.qkv_bias
    assert spec.q_dim == 2048 != spec.hidden_size  # a·d differs from h for Qwen3
    without_norm = spec.model_copy(update={"qk_norm": False})
    assert spec.params_per_layer - without_norm.params_per_layer == 2 * 128
    # 28 layers of (q,k,v,o = 6,291,456) + qk-norm 256 + MLP 9,437,184 + norms 2,048, + final norm
    assert spec.num_params - spec.embedding_params == 28 * (6_291_456 + 256 + 9_437_184 + 2_048) + 1024
    qwen2 = resolve_model("qwen2.5-1.5b").spec
    assert qwen2.qkv_bias and not qwen2.qk_norm


def test_tied_and_untied_embeddings() -> None:
    tied = resolve_model("qwen2.5-1.5b").spec
    untied = resolve_model("deepseek-r1-distill-qwen-1.5b").spec  # same shape, untied lm_head
    assert tied.lm_head_params == 0
    assert untied.lm_head_params == untied.embedding_params == 151936 * 1536
    assert untied.num_params - tied.num_params == 151936 * 1536
    llama = resolve_model("llama-3.2-1b").spec
    assert llama.tie_word_embeddings and llama.lm_head_params == 0


def test_short_alias_resolves_to_named_model() -> None:
    resolved = resolve_model("qwen-32b")
    assert resolved.requested == "qwen-32b"
    assert resolved.resolved == "qwen3-32b"
    assert resolved.hub_id == "Qwen/Qwen3-32B"
    assert resolved.spec.name == "Qwen3-32B"
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct").resolved == "qwen2.5-7b"
    assert resolve_model("LLAMA-8B").resolved == "llama-3.1-8b"


def test_unknown_model_lists_closest_aliases() -> None:
    with pytest.raises(InputError) as info:
        resolve_model("qwen-33b")
    err = info.value
    assert "Unknown model 'qwen-33b'" in err.message
    assert "Closest:" in err.hint and "qwen-32b" in err.hint
    assert err.exit_code == 2


def test_local_config_directory_and_file(tmp_path: Path) -> None:
    model_dir = tmp_path / "my-qwen"
    model_dir.mkdir()
    cfg = {k: v for k, v in _raw("qwen2.5-0.5b").items() if not k.startswith("_")}
    (model_dir / "config.json").write_text(json.dumps(cfg))
    by_dir = resolve_model(str(model_dir))
    assert by_dir.hub_id is None and by_dir.published_params is None
    assert by_dir.spec.name == "my-qwen"
    assert by_dir.spec.num_params == resolve_model("qwen2.5-0.5b").spec.num_params
    by_file = resolve_model(str(model_dir / "config.json"))
    assert by_file.spec == by_dir.spec


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "does not hold a JSON object"),
        (json.dumps({"hidden_size": 64, "num_attention_heads": 4}), "not a decoder-only HF config"),
        (
            json.dumps(
                {
                    "hidden_size": "wide",
                    "intermediate_size": 8,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 4,
                    "vocab_size": 10,
                }
            ),
            "not a decoder-only HF config",
        ),
        (
            json.dumps(
                {
                    "hidden_size": 0,
                    "intermediate_size": 8,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 4,
                    "vocab_size": 10,
                }
            ),
            "not a decoder-only HF config",
        ),
    ],
)
def test_malformed_config_is_input_error(tmp_path: Path, content: str, fragment: str) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(InputError) as info:
        resolve_model(str(tmp_path))
    assert fragment in info.value.message
    assert info.value.hint


def test_directory_without_config_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_hf_config(tmp_path)
    assert "No config.json" in info.value.message


def test_bundled_file_round_trips_through_copy(tmp_path: Path) -> None:
    """A bundled JSON copied as a local config gives the same spec (the files are valid HF configs)."""
    shutil.copy(CONFIGS / "llama-3.1-8b.json", tmp_path / "config.json")
    cfg, _ = load_hf_config(tmp_path)
    assert spec_from_hf_config(cfg, "x").num_params == resolve_model("llama-3.1-8b").spec.num_params


def test_a_buildable_config_is_checked_once_per_transformers_version(tmp_path, monkeypatch):
    """transformers' validation costs seconds of imports: a config that passed is remembered (its hash and
    the installed transformers version) and not checked again; a refused one is checked every time."""
    from grpo_pilot.errors import InputError
    from grpo_pilot.profiles import buildable

    monkeypatch.setenv(buildable.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(buildable, "transformers_available", lambda: True)
    calls: list[str] = []

    def fake_check(cfg, name):
        calls.append(name)
        if cfg.get("model_type") == "nope":
            raise InputError("refused", "")

    monkeypatch.setattr(buildable, "_check", fake_check)
    good = {"model_type": "qwen2", "hidden_size": 64}
    buildable.check_buildable(good, "a")
    buildable.check_buildable(dict(good), "b")  # the same config: remembered
    assert calls == ["a"]
    buildable.check_buildable({**good, "hidden_size": 128}, "c")  # another config: checked
    assert calls == ["a", "c"]
    for _ in range(2):
        with pytest.raises(InputError):
            buildable.check_buildable({"model_type": "nope"}, "d")
    assert calls == ["a", "c", "d", "d"]  # a refusal is never cached
    monkeypatch.setattr(buildable.importlib.metadata, "version", lambda _: "99.0")
    buildable.check_buildable(good, "e")  # another transformers: checked again
    assert calls[-1] == "e"
