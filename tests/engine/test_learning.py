"""The CPU example learns: char_fraction reward, random-init tiny Qwen2, 3 seeds, short schedule.

grpo.md: "reward = fraction of a target character climbs from ~0.02 to > 0.8 within ~25–60 steps".
Here: 30 steps at lr 5e-3 (the example itself runs 60 steps at 2e-3), one thread.
"""

from __future__ import annotations

import json

import pytest
import torch

from grpo_pilot.engine.loop import run
from grpo_pilot.engine.run_config import RunConfig
from grpo_pilot.planner.plan import load_plan

torch.set_num_threads(1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mean_reward_of_last_10_steps_is_clearly_above_first_10(tmp_path, seed):
    cfg = RunConfig(
        dataset="examples/tiny/prompts.jsonl",
        reward="char_fraction:char=a",
        steps=30,
        lr=5e-3,
        seed=seed,
        output_dir=str(tmp_path),
        threads=1,
        cpu_memory="rss",
        checkpoint_every=0,
    )
    run(load_plan("examples/tiny/plan.json"), cfg)
    rewards = [json.loads(line)["reward_mean"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rewards) == 30
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert first < 0.2  # random init: 'a' is one of ~100 tokens
    assert last > first + 0.3, f"seed {seed}: first 10 steps {first:.3f}, last 10 {last:.3f}"
