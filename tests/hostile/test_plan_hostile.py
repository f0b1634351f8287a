"""grpo-plan against hostile input: --out targets, absurd or unbuildable config.json files, bad pins."""

from __future__ import annotations

import json
import os

import pytest
from hostile_helpers import TINY_MODEL_FLAGS, assert_refused, invoke

from grpo_pilot.cli.plan import app

BASE_CFG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


def _out_target(scratch, kind: str) -> str:
    root = scratch.root
    if kind == "dir":
        (root / "d").mkdir()
        return str(root / "d")
    if kind == "file":
        (root / "notes.txt").write_text("my notes\n")
        return str(root / "notes.txt")
    if kind == "under-file":
        (root / "f").write_text("x")
        return str(root / "f" / "plan.json")
    if kind == "fifo":
        os.mkfifo(root / "pipe")
        return str(root / "pipe")
    if kind == "symlink":
        (root / "real.json").write_text("{}")
        os.symlink(root / "real.json", root / "link.json")
        return str(root / "link.json")
    if kind == "json-not-plan":
        (root / "other.json").write_text('{"hello": 1}\n')
        return str(root / "other.json")
    return kind  # a literal path such as /dev/null


OUT_CASES = [
    ("dir", "is a directory"),
    ("file", "is not a plan file grpo-pilot wrote"),
    ("under-file", "is a regular file, not a directory"),
    ("fifo", "is a named pipe"),
    ("symlink", "is a symbolic link"),
    ("json-not-plan", "is not a plan file grpo-pilot wrote"),
    ("/dev/null", "is a character device"),
]


@pytest.mark.parametrize("kind,fragment", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_plan_out_refused(scratch, kind, fragment):
    target = _out_target(scratch, kind)
    scratch.mark()
    assert_refused(invoke(app, [*TINY_MODEL_FLAGS, "--out", target]), 2, "--out", fragment)
    scratch.check()
    if kind == "/dev/null":
        assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_plan_out_replaces_an_earlier_plan(scratch):
    target = scratch.root / "plan.json"
    target.write_text(open("examples/tiny/plan.json").read())
    result = invoke(app, [*TINY_MODEL_FLAGS, "--out", target, "--trials", "8"])
    assert result.exit_code == 0, result.output
    assert json.loads(target.read_text())["fits"] is True
    assert [p.name for p in scratch.root.iterdir()] == ["plan.json"]


def _cfg(**change):
    cfg = dict(BASE_CFG)
    for key, value in change.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


CONFIG_CASES = [
    ("zero-heads", json.dumps(_cfg(num_attention_heads=0)), "num_attention_heads"),
    ("huge-hidden", json.dumps(_cfg()).replace('"hidden_size": 64', '"hidden_size": 1e999'), "too large"),
    ("absurd-layers", json.dumps(_cfg(num_hidden_layers=10**12)), "num_hidden_layers"),
    ("string-size", json.dumps(_cfg(hidden_size="big")), "must be an integer"),
    ("fraction-size", json.dumps(_cfg(intermediate_size=127.5)), "must be an integer"),
    ("bool-size", json.dumps(_cfg(vocab_size=True)), "must be an integer"),
    ("negative-vocab", json.dumps(_cfg(vocab_size=-3)), "vocab_size"),
    ("missing-vocab", json.dumps(_cfg(vocab_size=None)), "'vocab_size' is missing"),
    ("kv-over-heads", json.dumps(_cfg(num_attention_heads=2, num_key_value_heads=7)), "does not divide"),
    ("unknown-model-type", json.dumps(_cfg(model_type="not_a_model")), "model_type 'not_a_model'"),
    ("hidden-not-divisible", json.dumps(_cfg(hidden_size=66)), "not divisible by num_attention_heads"),
    ("moe-top-k", json.dumps(_cfg(num_experts=4, num_experts_per_tok=9, moe_intermediate_size=32)), "between 1"),
    ("bad-bias-flag", json.dumps(_cfg(attention_bias="yes")), "must be true or false"),
    ("nan-literal", json.dumps(_cfg()).replace('"vocab_size": 256', '"vocab_size": NaN'), "NaN"),
    ("json-list", "[1, 2, 3]", "JSON object"),
    ("nested", "[" * 200_000 + "]" * 200_000, "nested deeper"),
    ("binary", None, "binary"),
    ("latin1", None, "not UTF-8"),
    ("truncated", json.dumps(_cfg())[:40], "not usable JSON"),
]


@pytest.mark.parametrize("name,text,fragment", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_model_config(scratch, tmp_path, name, text, fragment):
    model = tmp_path / "model"
    model.mkdir()
    cfg = model / "config.json"
    if name == "binary":
        cfg.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    elif name == "latin1":
        cfg.write_bytes(json.dumps(_cfg(name="caf\u00e9"), ensure_ascii=False).encode("latin-1"))
    else:
        cfg.write_text(text)
    scratch.mark()
    args = ["--model", str(model), "--gpus", "1xcpu", "--out", scratch.root / "plan.json"]
    assert_refused(invoke(app, args), 2, fragment)
    scratch.check()


def test_model_config_that_is_a_fifo(scratch, tmp_path):
    os.mkfifo(tmp_path / "config.json")
    scratch.mark()
    args = ["--model", str(tmp_path / "config.json"), "--gpus", "1xcpu"]
    assert_refused(invoke(app, args), 2, "named pipe")  # refused, not a read that blocks forever
    scratch.check()


PIN_CASES = [
    (["--pin", "rollout_backend=hf", "--pin", "rollout_backend=hf"], "repeats the first"),
    (["--pin", "rollout_backend=hf", "--pin", "rollout_backend=vllm"], "contradicts the first"),
    (["--pin", "rollout_tp=zero"], "--pin rollout_tp=zero"),
    (["--pin", "no_such_knob=1"], "not KEY=VALUE with a known knob key"),
    (["--pin", "rollout_tp"], "not KEY=VALUE"),
]


@pytest.mark.parametrize("pins,fragment", PIN_CASES, ids=["dup-same", "dup-contra", "bad-value", "unknown", "no-eq"])
def test_bad_pins(scratch, pins, fragment):
    scratch.mark()
    args = ["--model", "qwen-0.5b", "--gpus", "2xH100", *pins, "--out", scratch.root / "p.json"]
    assert_refused(invoke(app, args), 2, fragment)
    scratch.check()


def test_impossible_pin_is_a_bad_pin_not_nothing_fits(scratch):
    # Qwen2.5-0.5B has 14 heads: rollout_tp=4 can never divide them, whatever else is chosen
    args = ["--model", "qwen-0.5b", "--gpus", "8xH100", "--pin", "rollout_backend=vllm", "--pin", "rollout_tp=4"]
    args += ["--prompts-per-step", "64", "--mini-batch", "16", "--trials", "8", "--out", scratch.root / "p.json"]
    scratch.mark()
    assert_refused(invoke(app, args), 2, "rollout.heads_divisible_by_tp", "--pin rollout_tp=4", "14 attention heads")
    scratch.check()


def test_memory_verdict_still_exit_3(scratch):
    args = ["--model", "qwen-32b", "--gpus", "1xA100-40G", "--trials", "8", "--out", scratch.root / "p.json"]
    scratch.mark()
    assert_refused(invoke(app, args), 3, "Nothing fits", "No plan file was written")
    scratch.check()


def test_suggestions_respect_the_divisibility_rule(scratch):
    # 30 prompts × n=5 = 150 responses: no larger layout of 8-GPU nodes divides them, so "more GPUs" is not
    # offered as if it could help; the suggestion names a prompts-per-step that would let it
    args = ["--model", "llama-70b", "--gpus", "3xH100", "--trials", "8", "--prompts-per-step", "30"]
    args += ["--mini-batch", "6", "--n", "5", "--out", scratch.root / "p.json"]
    scratch.mark()
    err = assert_refused(invoke(app, args), 3, "prompts per step × n = 150", "--prompts-per-step 32")
    assert "fewest" not in err
    scratch.check()


def test_atomic_writes_only_replace_regular_files(tmp_path):
    from grpo_pilot.atomic import atomic_write_text
    from grpo_pilot.errors import InputError

    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for target, fragment in (("/dev/null", "character device"), (tmp_path / "d", "directory"),
                             (tmp_path / "fifo", "named pipe")):  # fmt: skip
        with pytest.raises(InputError, match=fragment):
            atomic_write_text(target, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "fifo"]  # no temp file left behind
    atomic_write_text(tmp_path / "ok.json", "{}")
    assert (tmp_path / "ok.json").read_text() == "{}"


def test_lengths_and_launch_files(scratch, tmp_path):
    scratch.mark()
    deep = tmp_path / "lengths.jsonl"
    deep.write_text("[" * 200_000 + "]" * 200_000 + "\n")
    assert_refused(invoke(app, [*TINY_MODEL_FLAGS, "--lengths", deep]), 2, "lengths.jsonl:1", "nested deeper")
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"prompt_tokens": 1e999, "response_tokens": 3}\n')
    assert_refused(invoke(app, [*TINY_MODEL_FLAGS, "--lengths", huge]), 2, "too large")
    os.mkfifo(tmp_path / "launch.sh")
    assert_refused(invoke(app, ["--from-verl", tmp_path / "launch.sh", "--gpus", "H100"]), 2, "named pipe")
    (tmp_path / "trl.yaml").write_bytes(b"\x00\x01binary")
    assert_refused(invoke(app, ["--from-trl", tmp_path / "trl.yaml", "--gpus", "8xH100"]), 2, "binary")
    scratch.check()
