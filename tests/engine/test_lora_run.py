"""The LoRA CPU example end to end (examples/tiny/plan-lora.json with run-lora.toml's settings): the reward climbs,
checkpoints hold the adapters only, a resumed run ends exactly like an uninterrupted one, and profile.json sets the
measured memory beside the plan's prediction (grpo-plan models the adapters: their gradients and AdamW states).
A QLoRA plan is refused on this CPU before anything starts."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_pilot.engine.dist_checkpoint import read_metadata
from grpo_pilot.engine.loop import run
from grpo_pilot.engine.run_config import RunConfig
from grpo_pilot.errors import InputError
from grpo_pilot.planner.adapters import flag_adapter
from grpo_pilot.planner.plan import load_plan, save_plan

torch.set_num_threads(1)
PLAN = "examples/tiny/plan-lora.json"
STEPS = 16
# run-lora.toml's learning rate and temperature (its comments say why they differ from run.toml)
SETTINGS = dict(
    dataset="examples/tiny/prompts.jsonl",
    reward="char_fraction:char=a",
    lr=1e-2,
    temperature=0.2,
    seed=0,
    threads=1,
    checkpoint_every=8,
)
ADAPTER_PARAMS = 2 * 8 * (4 * 128 + 3 * 320)  # layers x r x (in + out) of q, k, v, o (64x64) and gate, up, down
BASE_PARAMS = 138_176  # the tiny Qwen2 (tied embeddings): what a full fine-tune checkpoints, with AdamW's m and v


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted run, in a process of its own: the CPU tracker counts every tensor alive in the process (as
    max_memory_allocated counts the whole process on a GPU), and this process holds the tensors of every test
    module collected before this one."""
    out = tmp_path_factory.mktemp("lora") / "run"
    code = (
        "import torch; torch.set_num_threads(1)\n"
        "from grpo_pilot.engine.loop import run\n"
        "from grpo_pilot.engine.run_config import RunConfig\n"
        "from grpo_pilot.planner.plan import load_plan\n"
        f"run(load_plan({PLAN!r}), RunConfig(output_dir={str(out)!r}, steps={STEPS}, **{SETTINGS!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_the_mean_reward_climbs(straight):
    rewards = [r["reward_mean"] for r in lines(straight / "metrics.jsonl")]
    assert len(rewards) == STEPS
    first, last = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert first < 0.1  # random init: 'a' is one of ~100 tokens
    assert last > 0.5, f"first 3 steps {first:.3f}, last 5 {last:.3f}"
    assert all(r["kl"] >= 0 for r in lines(straight / "metrics.jsonl"))  # the reference pass ran (adapters off)


@pytest.mark.slow
def test_checkpoints_hold_the_adapters_and_their_optimizer_states_only(straight):
    actor = straight / "checkpoints" / f"step-{STEPS:06d}" / "actor"
    meta = read_metadata(actor / ".metadata").state_dict_metadata
    model = {k: v for k, v in meta.items() if k.startswith("model.")}
    assert len(model) == 2 * 7 * 2 and all(".lora_A." in k or ".lora_B." in k for k in model)
    assert sum(math.prod(v.size) for v in model.values()) == ADAPTER_PARAMS
    moments = [k for k in meta if k.startswith("optimizer.state.") and k.endswith((".exp_avg", ".exp_avg_sq"))]
    assert len(moments) == 2 * len(model) and all(".lora_" in k for k in moments)
    on_disk = sum(f.stat().st_size for f in actor.iterdir())
    # a full fine-tune's checkpoint holds 3 fp32 tensors per base parameter (1.87 MB on disk for this model, measured);
    # rank 8 on every linear of a 64-wide model is 17% of the parameters, so at most half of those tensors' bytes
    assert on_disk < BASE_PARAMS * 4 * 3 / 2


@pytest.mark.slow
def test_resume_is_exact(straight, tmp_path):
    out = tmp_path / "resumed"
    run(load_plan(PLAN), RunConfig(output_dir=str(out), steps=STEPS // 2, **SETTINGS))
    run(load_plan(PLAN), RunConfig(output_dir=str(out), steps=STEPS, resume=True, **SETTINGS))
    got, want = lines(out / "metrics.jsonl"), lines(straight / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert [r["prompt_indices"] for r in got] == [r["prompt_indices"] for r in want]
    for key in ("reward_mean", "kl", "loss"):
        assert [r[key] for r in got] == pytest.approx([r[key] for r in want], abs=1e-6), key
    assert [r["grad_norm"] for r in got] == pytest.approx([r["grad_norm"] for r in want], rel=1e-4)


@pytest.mark.slow
def test_profile_sets_measured_memory_beside_the_adapter_plan(straight):
    profile = json.loads((straight / "profile.json").read_text())
    assert profile["adapter"] == {
        "setting": "lora, r=8, targets all-linear",
        "trainable_params": ADAPTER_PARAMS,
        "trainable_bytes": ADAPTER_PARAMS * 4,
        "plan_models_adapters": True,
    }
    assert profile["memory_compared"] is True and profile["plan_memory_full_ft"] is False
    # the plan counts gradients and AdamW states for the adapters only, and the frozen base beside them
    plan = load_plan(PLAN)
    items = plan.phases["update"].items
    assert items["optimizer_states"] == ADAPTER_PARAMS * 8 and items["actor_grads"] == ADAPTER_PARAMS * 4
    assert items["frozen_base"] + items["actor_params"] == (BASE_PARAMS + ADAPTER_PARAMS) * 4
    for phase in ("rollout", "log_prob", "update"):
        row = profile["phases"][phase]
        assert row["memory_rel_error"] == pytest.approx(row["measured_peak_bytes"] / row["predicted_tensor_bytes"] - 1)
        # the plan bounds the run from above; on this 64-wide model it over-counts the update's activations
        # by ~30 % (the full fine-tune plan.json alike: -31 % measured on 2026-11-26), so only a loose floor
        assert -0.5 < row["memory_rel_error"] <= 0.05, (phase, row)


def test_a_qlora_plan_is_refused_on_this_cpu_before_anything_starts(tmp_path):
    plan = load_plan(PLAN)
    qlora = plan.model_copy(
        update={"workload": plan.workload.model_copy(update={"adapter": flag_adapter(8, base_bits="4bit")})}
    )
    path = save_plan(qlora, tmp_path / "plan-qlora.json")
    out = tmp_path / "run"
    with pytest.raises(InputError, match="needs bitsandbytes' CUDA kernels; this run is on the CPU"):
        run(load_plan(path), RunConfig(output_dir=str(out), steps=1, **SETTINGS))
    assert not out.exists()  # nothing written
