"""grpo-run against hostile input: --out targets, plan files, run configs, flags and datasets.

All of these are refused before any model is built (in-process, fast).
"""

from __future__ import annotations

import json
import os

import pytest
from hostile_helpers import RUN_GOOD, TINY_PLAN, assert_refused, invoke

from grpo_pilot.cli.run import app
from grpo_pilot.outputs import DirectoryLock

PLAN_RAW = json.loads(open(TINY_PLAN).read())


def _run(scratch, plan: str = TINY_PLAN, *extra, out: str | None = None, good: list[str] = RUN_GOOD):
    return invoke(app, [plan, *good, "--out", out or str(scratch.root / "run"), *extra])


# only what a run config case cannot set (flags and --set win over the file)
RUN_MINIMAL = ["--dataset", "examples/tiny/prompts.jsonl", "--reward", "char_fraction:char=a", "-q"]


RUN_OUT_CASES = [
    ("file", "is a regular file, not a directory"),
    ("under-file", "is a regular file, not a directory"),
    ("fifo", "is a named pipe"),
    ("/dev/null", "is a character device"),
]


@pytest.mark.parametrize("kind,fragment", RUN_OUT_CASES, ids=[c[0] for c in RUN_OUT_CASES])
def test_run_out_refused(scratch, kind, fragment):
    root = scratch.root
    if kind == "file":
        (root / "out").write_text("keep me\n")
        out = str(root / "out")
    elif kind == "under-file":
        (root / "f").write_text("keep me\n")
        out = str(root / "f" / "run")
    elif kind == "fifo":
        os.mkfifo(root / "pipe")
        out = str(root / "pipe")
    else:
        out = kind
    scratch.mark()
    assert_refused(_run(scratch, out=out), 2, "--out", fragment)
    scratch.check()


def test_run_out_locked_names_the_pid(scratch):
    out = scratch.root / "run"
    out.mkdir()
    with DirectoryLock(out, "grpo-run"):
        scratch.mark()
        assert_refused(_run(scratch, out=str(out)), 2, "is in use", f"PID {os.getpid()}")
        scratch.check()


def _edited(**changes) -> dict:
    raw = json.loads(json.dumps(PLAN_RAW))
    for path, value in changes.items():
        node = raw
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[key]
        if value is None:
            node.pop(keys[-1])
        else:
            node[keys[-1]] = value
    return raw


PLAN_CASES = [
    ("binary", b"\x00\x01\x02PK\x03\x04", 2, "binary"),
    ("nested", b"[" * 200_000 + b"]" * 200_000, 2, "nested deeper"),
    ("huge-number", b'{"schema_version": 1e999, "knobs": {}}', 2, "too large"),
    ("nan", b'{"schema_version": NaN, "knobs": {}}', 2, "NaN"),
    ("list", b"[1, 2]", 2, "not a grpo-pilot plan"),
    ("future-schema", json.dumps(_edited(schema_version=99)).encode(), 2, "schema_version 99"),
    ("missing-field", json.dumps(_edited(model=None)).encode(), 2, "field 'model'"),
    ("wrong-type", json.dumps(_edited(knobs__rollout_tp="two")).encode(), 2, "knobs.rollout_tp"),
    ("marked-not-fitting", json.dumps(_edited(fits=False)).encode(), 3, "marked as not fitting"),
    ("100000-completions", json.dumps(_edited(workload__n=100_000)).encode(), 2, "does not add up"),
    ("host-ram-shrunk", json.dumps(_edited(cluster__host_ram_bytes_per_node=1 << 20)).encode(), 3, "does not fit"),
    ("tp-on-one-cpu", json.dumps(_edited(knobs__rollout_tp=2)).encode(), 2, "rollout_tp=2"),
    ("phases-emptied", json.dumps(_edited(phases={})).encode(), 2, "phases lacks rollout, log_prob, update"),
    ("phase-removed", json.dumps(_edited(phases__weight_sync=None)).encode(), 2, "phases lacks weight_sync"),
    ("times-removed", json.dumps(_edited(phase_times_s__update=None)).encode(), 2, "phase_times_s lacks update"),
    # a knob edit on a CPU plan moves the peak by < 10% (the process baseline dwarfs the tensors), the update's
    # tensors by far more
    ("knob-edited", json.dumps(_edited(knobs__micro_batch_size_per_gpu=32)).encode(), 2, "update tensors"),
    (
        "nan-knob",
        json.dumps(_edited(knobs__gpu_memory_utilization=0.123)).replace("0.123", "NaN").encode(),
        2,
        "field 'knobs.gpu_memory_utilization': NaN is not a JSON number",
    ),
]


@pytest.mark.parametrize("name,data,code,fragment", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_bad_plan(scratch, tmp_path, name, data, code, fragment):
    plan = tmp_path / "plan.json"
    plan.write_bytes(data)
    scratch.mark()
    assert_refused(_run(scratch, str(plan)), code, fragment)
    scratch.check()


def test_force_warns_about_an_edited_plan(scratch, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_edited(workload__n=100_000)))
    scratch.mark()
    args = [plan, *RUN_GOOD, "--dataset", tmp_path / "none.jsonl", "--out", scratch.root / "r", "--force"]
    err = assert_refused(invoke(app, args), 2, "does not exist")  # past the re-check, stopped by the next input
    assert "warning: --force: running although" in err and "does not add up" in err
    scratch.check()


def test_plan_that_is_a_device_or_a_directory(scratch, tmp_path):
    scratch.mark()
    assert_refused(_run(scratch, "/dev/zero"), 2, "character device")  # never read forever
    assert_refused(_run(scratch, str(tmp_path)), 2, "is a directory")
    scratch.check()


def test_force_lets_a_not_fitting_plan_through_to_the_next_check(scratch, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_edited(fits=False)))
    scratch.mark()
    args = [plan, *RUN_GOOD, "--dataset", tmp_path / "none.jsonl", "--out", scratch.root / "r", "--force"]
    result = invoke(app, args)
    err = assert_refused(result, 2, "does not exist")
    assert "warning: --force" in err and "marked as not fitting" in err
    scratch.check()


CONFIG_CASES = [
    ("lr-huge", "lr = 1e30\n", "'lr'"),
    ("lr-inf", "lr = inf\n", "'lr'"),
    ("lr-nan", "lr = nan\n", "'lr'"),
    ("lr-string", 'lr = "fast"\n', "'lr'"),
    ("threads-huge", "threads = 100000\n", "'threads'"),
    ("steps-negative", "steps = -1\n", "'steps'"),
    ("temperature-zero", "temperature = 0\n", "'temperature'"),
    ("unknown-key", "learning_rate = 1e-3\n", "Unknown setting 'learning_rate'"),
    ("bad-toml", "lr = = 1\n", "not valid TOML"),
    ("run-not-table", "run = 3\n", "Unknown setting 'run'"),
    # issue 16: settings accepted that then crashed "as a bug", and silent coercions
    ("temperature-tiny", "temperature = 1e-300\n", "'temperature'"),
    ("top-p-tiny", "top_p = 1e-300\n", "'top_p'"),
    ("weight-decay-huge", "weight_decay = 1e300\n", "'weight_decay'"),
    ("steps-bool", "steps = true\n", "it must be an integer, not true or false"),
    ("steps-string", 'steps = "2"\n', "it must be an integer, not a string"),
    ("steps-float", "steps = 2.0\n", "it must be an integer"),
    ("lr-bool", "lr = true\n", "it must be a number"),
    ("resume-int", "resume = 1\n", "it must be true or false"),
    ("seed-negative", "seed = -1\n", "'seed'"),
    ("seed-huge", "seed = 100000000000000000000\n", "'seed'"),
    ("seed-float", "seed = 1e29\n", "it must be an integer"),
    ("stop-empty", 'stop = [""]\n', "empty stop string"),
    ("key-outside-run", "[run]\nlr = 1e-3\n[train]\nsteps = 5\n", "the table 'train' outside it"),
    ("top-key-outside-run", "steps = 5\n[run]\nlr = 1e-3\n", "the key 'steps' outside it"),
]


@pytest.mark.parametrize("name,text,fragment", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_run_config(scratch, tmp_path, name, text, fragment):
    config = tmp_path / "run.toml"
    config.write_text(text)
    scratch.mark()
    err = assert_refused(_run(scratch, TINY_PLAN, "--config", str(config), good=RUN_MINIMAL), 2, fragment)
    if "it must be" in fragment:  # the setting is named
        assert f"'{name.split('-')[0]}'" in err
    scratch.check()


def test_run_config_binary_nested_and_directory(scratch, tmp_path):
    scratch.mark()
    (tmp_path / "bin.toml").write_bytes(b"lr = 1\x00\x00")
    assert_refused(_run(scratch, TINY_PLAN, "--config", tmp_path / "bin.toml"), 2, "binary")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert_refused(_run(scratch, TINY_PLAN, "--config", tmp_path / "deep.json"), 2, "nested deeper")
    (tmp_path / "cfgdir").mkdir()
    assert_refused(_run(scratch, TINY_PLAN, "--config", tmp_path / "cfgdir"), 2, "is a directory")
    scratch.check()


FLAG_CASES = [
    (["--threads", "100000"], "'threads'"),
    (["--lr", "1e30"], "'lr'"),
    (["--set", "lr=1e999"], "'lr'"),
    (["--set", "temperature=" + "[" * 50_000 + "]" * 50_000], "'temperature'"),
    (["--set", "nonsense=1"], "Unknown setting 'nonsense'"),
    (["--max-new-tokens", "999"], "exceeds the plan's response_len_tokens"),
]


FLAG_IDS = ["threads", "lr", "set-inf", "set-deep", "set-unknown", "mnt"]


@pytest.mark.parametrize("flags,fragment", FLAG_CASES, ids=FLAG_IDS)
def test_bad_flags(scratch, flags, fragment):
    scratch.mark()
    assert_refused(_run(scratch, TINY_PLAN, *flags, good=RUN_MINIMAL), 2, fragment)
    scratch.check()


DATA_CASES = [
    ("nested", ("[" * 200_000 + "]" * 200_000 + "\n").encode(), (), "nested deeper than"),
    ("nested-skip", ('{"prompt": ' + "[" * 200_000 + "]" * 200_000 + "}\n").encode(), ("--skip-invalid",), "no usable"),
    ("nul", b'{"prompt": "a"}\n\x00\x00\n', (), "NUL byte"),
    ("latin1", '{"prompt": "caf\u00e9"}\n'.encode("latin-1"), (), "not valid UTF-8"),
    ("huge-number", b'{"prompt": "a", "answer": 1e999}\n', (), "too large"),
    ("nan", b'{"prompt": "a", "answer": NaN}\n', (), "NaN"),
    ("empty", b"\n\n", (), "no usable prompt"),
    ("not-object", b"[1]\n", (), "invalid line"),
    ("lone-surrogate", b'{"prompt": "a"}\n{"prompt": "caf\\ud800"}\n', (), "data.jsonl:2: field 'prompt'"),
    ("lone-surrogate-chat", b'{"messages": [{"role": "user", "content": "\\udfff"}]}\n', (), "lone surrogate"),
    ("lone-surrogate-all-skipped", b'{"prompt": "\\ud800"}\n', ("--skip-invalid",), "no usable prompt"),
]


@pytest.mark.parametrize("name,data,extra,fragment", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_dataset(scratch, tmp_path, name, data, extra, fragment):
    path = tmp_path / "data.jsonl"
    path.write_bytes(data)
    scratch.mark()
    assert_refused(_run(scratch, TINY_PLAN, "--dataset", str(path), *extra), 2, fragment)
    scratch.check()


def test_dataset_fifo_directory_missing(scratch, tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    scratch.mark()
    assert_refused(_run(scratch, TINY_PLAN, "--dataset", tmp_path / "pipe.jsonl"), 2, "named pipe")
    assert_refused(_run(scratch, TINY_PLAN, "--dataset", tmp_path), 2, "is a directory")
    assert_refused(_run(scratch, TINY_PLAN, "--dataset", tmp_path / "no.jsonl"), 2, "does not exist")
    scratch.check()


def test_skip_invalid_skips_a_deeply_nested_line(tmp_path):
    from grpo_pilot.engine.data import load_prompts

    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "a"}\n' + "[" * 200_000 + "]" * 200_000 + '\n{"prompt": "b"}\n')
    prompts = load_prompts(path, skip_invalid=True)
    assert len(prompts.records) == 2 and prompts.skipped == 1
    assert "nested deeper than" in prompts.skip_reasons[0] and ":2:" in prompts.skip_reasons[0]


OCCUPIED = [
    ("metrics-fifo", lambda out: os.mkfifo(out / "metrics.jsonl"), "named pipe"),
    ("lengths-symlink", lambda out: os.symlink("/etc/hostname", out / "lengths.jsonl"), "symbolic link"),
    ("profile-dir", lambda out: (out / "profile.json").mkdir(), "is a directory"),
    ("checkpoints-symlink", lambda out: os.symlink(out.parent, out / "checkpoints"), "symbolic link"),
]


@pytest.mark.parametrize("name,occupy,fragment", OCCUPIED, ids=[c[0] for c in OCCUPIED])
def test_run_outputs_occupied_by_non_regular_files(scratch, name, occupy, fragment):
    out = scratch.root / "run"
    out.mkdir()
    occupy(out)
    scratch.mark()
    assert_refused(_run(scratch, out=str(out)), 2, fragment)  # refused up front, not after training
    scratch.check()
