"""The allocator replay scripts' own arithmetic: the plan-command reader, the CUDA scratch added at the noted ops,
the count of frees made by Python's collector, and that the recording of a measured case runs (the call into
verify/traced.py's `_samples` is keyword-only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import allocator_replay  # noqa: E402
import allocator_replay_34e4d2d as old  # noqa: E402

from grpo_pilot.verify.allocator_sim import replay  # noqa: E402

MiB = 1 << 20


def test_plan_command_flags_with_and_without_values():
    got = old._flags("grpo-plan --model qwen2.5-1.5b --n 4 --kl --pin rollout_backend=hf")
    assert got == {"model": "qwen2.5-1.5b", "n": "4", "kl": True, "pin": "rollout_backend=hf"}


def test_logsumexp_scratch_is_its_amax_and_full_chunk_freed_after_the_output():
    events = [("o", "logsumexp", [[[110, 151936], 4]]), ("a", 1, 440), ("f", 1)]
    out = old.with_scratch(events, ("logsumexp",))
    assert [e[0] for e in out] == ["a", "a", "a", "f", "f", "f"]
    assert out[0][2] == 110 * 4 and out[1][2] == 110 * 151936 * 4
    assert out[3:5] == [("f", out[1][1]), ("f", out[0][1])]  # freed once the op's output exists
    assert old.with_scratch(events, ()) == [("a", 1, 440), ("f", 1)]  # notes dropped, nothing added


def test_attention_backward_scratch_adds_the_query_head_kv_grads_only_for_grouped_query_attention():
    q, kv = [16, 12, 255, 128], [16, 2, 381, 128]
    gqa = [("o", "flash_backward", [[q, 2], [q, 2], [kv, 2], [kv, 2]]), ("a", 1, 10)]
    sizes = [e[2] for e in old.with_scratch(gqa, ("attention_backward",)) if e[0] == "a"][:-1]
    assert sizes == [16 * 12 * 255 * 128 * 4, 2 * 16 * 12 * 381 * 128 * 2]
    mha = [("o", "flash_backward", [[q, 2], [q, 2], [q, 2], [q, 2]]), ("a", 1, 10)]
    assert [e[2] for e in old.with_scratch(mha, ("attention_backward",)) if e[0] == "a"][:-1] == [q[0] * 12 * 255 * 512]


def test_scratch_under_a_lasting_block_can_take_a_new_segment():
    """A transient the fake tensors do not show changes the reserve when a lasting block lands beside it: the scratch
    takes the start of the freed 100 MiB block, the op's 20 MiB output the next part, and once the scratch is freed
    the largest free piece is 70 MiB, so a later 75 MiB request needs its own segment (76 MiB) — without the scratch
    the output sits at the start and the 80 MiB left take that request."""
    events = [("a", 1, 100 * MiB), ("f", 1), ("o", "logsumexp", [[[1, 10 * MiB // 4], 4]]), ("a", 2, 20 * MiB)]
    events += [("a", 3, 75 * MiB)]
    plain = replay(old.with_scratch(events, ()))
    scratch = replay(old.with_scratch(events, ("logsumexp",)))
    assert plain.peak_reserved_bytes == 100 * MiB
    assert scratch.peak_reserved_bytes == 100 * MiB + 2 * MiB + 76 * MiB  # + the small pool's segment for amax


def test_frees_inside_a_collection_are_counted():
    events = [("a", 1, 5), ("a", 2, 7), ("c", "gc_start"), ("f", 2), ("c", "gc_stop"), ("f", 1)]
    assert old.freed_by_collections(events) == (1, 7)


def test_the_measured_case_records_its_first_allocations(monkeypatch):
    """record_case reaches the actor's construction and the first step (stopped there: the full 0.5B step takes
    minutes of fake-tensor work on two cores)."""

    class Stop(Exception):
        """Raised at the first rollout: the recording got that far."""

    seen: list = []

    def stop(model, prompts, new_tokens):
        seen.append((prompts, new_tokens))
        raise Stop

    monkeypatch.setattr(allocator_replay, "_rollout", stop)
    case = {"plan_command": "grpo-plan --model qwen2.5-0.5b --gpus 1xH200 --prompts-per-step 16 --mini-batch 16 "
            "--n 4 --prompt-len 64 --response-len 256 --no-kl --pin rollout_backend=hf",
            "knobs": {"micro_batch_size_per_gpu": 16, "rollout_backend": "hf"}}  # fmt: skip
    with pytest.raises(Stop):
        allocator_replay.record_case(case, steps=1, rollout=True)
    ((prompts, new_tokens),) = seen
    assert new_tokens == 256 and len(prompts) == 16 * 4
    assert {len(p) for p in prompts} == {64 - 2}  # the runs' prompts: prompt_len - 2 tokens
    assert len({tuple(p) for p in prompts}) == 16 and prompts[0] == prompts[3] != prompts[4]  # groups of 4


def test_a_device_trace_becomes_the_simulators_events():
    import allocator_trace_gpu as trace_gpu

    trace = [
        {"action": "segment_alloc", "addr": 0, "size": 20 * MiB},
        {"action": "alloc", "addr": 0, "size": 3 * MiB},
        {"action": "alloc", "addr": 3 * MiB, "size": 4 * MiB},
        {"action": "free_requested", "addr": 0, "size": 3 * MiB},
        {"action": "free_completed", "addr": 0, "size": 3 * MiB},
        {"action": "alloc", "addr": 0, "size": 2 * MiB},  # the same address handed out again: a new id
        {"action": "free_completed", "addr": 0, "size": 2 * MiB},
        {"action": "free_completed", "addr": 3 * MiB, "size": 4 * MiB},
        {"action": "segment_free", "addr": 0, "size": 20 * MiB},
        {"action": "segment_free", "addr": 40 * MiB, "size": 2 * MiB},  # one release frees both
        {"action": "alloc", "addr": 0, "size": 30 * MiB},
    ]
    events = trace_gpu.events_from_trace(trace)
    assert events == [("a", 1, 3 * MiB), ("a", 2, 4 * MiB), ("f", 1), ("a", 3, 2 * MiB), ("f", 3), ("f", 2), ("e",),
                      ("a", 4, 30 * MiB)]  # fmt: skip
    r = replay(events)
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes) == (30 * MiB, 30 * MiB)  # the 20 MiB segment released


def test_the_gpu_trace_without_a_gpu_says_so(tmp_path, capsys):
    import allocator_trace_gpu as trace_gpu

    measurements = str(ROOT / "tests/planner/gpu_measurements/h200-2026-11-26.json")
    assert trace_gpu.main([measurements, str(tmp_path)]) == 0
    assert "no GPU" in capsys.readouterr().out and not any(tmp_path.iterdir())
