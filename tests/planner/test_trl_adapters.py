"""--from-trl: adapter settings are read (never dropped) into the workload the planner models; TRL's own batch
rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.planner.from_trl import read_trl, trl_launch
from grpo_pilot.planner.from_verl import verl_launch

SCRIPTS = Path(__file__).resolve().parent / "real_runs" / "scripts"


def test_qlora_notebook_settings_are_read_into_the_workload() -> None:
    text = (SCRIPTS / "trl_transcribed_grpo_trl_lora_qlora_qwen2-7b-instruct.yaml").read_text()
    launch = read_trl(text, total_gpus=1)
    assert "r=32" in launch.adapter.describe() and "4bit" in launch.adapter.describe()
    assert launch.workload["adapter"] == launch.adapter
    a = launch.adapter
    assert a is not None and (a.method, a.rank, a.alpha, a.base_quantization, a.quant_type) == (
        "lora",
        32,
        32.0,
        "4bit",
        "nf4",
    )
    assert a.double_quant is True and a.target_modules == tuple(
        "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj".split()
    )


@pytest.mark.parametrize(
    "cfg, expected",
    [
        ({"use_peft": True}, ("trl", "lora", 16, None)),  # trl ModelConfig defaults: r 16
        ({"use_peft": True, "use_dora": True, "load_in_8bit": True}, ("trl", "dora", 16, "8bit")),
        ({"peft_config": {"r": 8, "target_modules": "all-linear"}}, ("trl", "lora", 8, None)),
        ({"rl": "grpo", "base_model": "m", "adapter": "qlora", "lora_r": 64}, ("axolotl", "lora", 64, "4bit")),
    ],
)
def test_adapter_forms(cfg: dict, expected: tuple) -> None:
    launch = trl_launch({"model_name_or_path": "m", **cfg}, 1)
    a = launch.adapter
    assert (a.framework, a.method, a.rank, a.base_quantization) == expected
    assert launch.workload["adapter"] == a  # planned (Workload.adapter), not dropped


def test_verl_lora_is_read_into_the_same_structure() -> None:
    keys = {
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.model.path": "m",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "4",
        "actor_rollout_ref.model.lora_rank": "32",
        "actor_rollout_ref.model.lora_alpha": "32",
    }
    adapter = verl_launch(keys).adapter
    assert (adapter.rank, adapter.alpha, adapter.target_modules) == (32, 32.0, ("all-linear",))


def test_lora_without_regret_batches_are_legal() -> None:
    """TRL only needs whole groups in the generation batch: 16 completions per generation, 8 per optimizer step."""
    text = (SCRIPTS / "trl_transcribed_lora_without_regret_grpo.yaml").read_text()
    launch = read_trl(text, total_gpus=1)
    w = launch.workload
    assert (w["prompts_per_step"], w["mini_batch_prompts"], w["n"]) == (1, 1, 16)
    assert any("not whole groups" in n for n in launch.notes)
    with pytest.raises(InputError, match="generation batch"):  # 12 completions: not whole groups of 16
        trl_launch({"model_name_or_path": "m", "num_generations": 16, "per_device_train_batch_size": 12}, 1)
    with pytest.raises(InputError, match="both set"):
        trl_launch({"model_name_or_path": "m", "generation_batch_size": 16, "steps_per_generation": 2}, 1)
    with pytest.raises(InputError, match="at least 2"):
        trl_launch({"model_name_or_path": "m", "num_generations": 1, "per_device_train_batch_size": 1}, 1)


@pytest.mark.parametrize(
    "cfg, fragment",
    [
        ({"beta": "abc"}, "beta"),
        ({"beta": [1, 2]}, "beta"),
        ({"beta": float("inf")}, "beta"),
        ({"use_vllm": "yes please"}, "use_vllm"),
        (
            {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": "abc"},
            "vllm_gpu_memory_utilization",
        ),
        ({"vllm_mode": "remote"}, "vllm_mode"),
        ({"model_name_or_path": ["a", "b"]}, "model_name_or_path"),
    ],
)
def test_bad_values_name_their_key(cfg: dict, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        trl_launch({"model_name_or_path": "m", **cfg}, 2)


def test_deepspeed_stage_and_generation_gather_are_read() -> None:
    ms_swift = read_trl((SCRIPTS / "ms-swift_issue3871_transcribed_grpo_config.yaml").read_text(), total_gpus=8)
    assert (ms_swift.zero_stage, ms_swift.gather_for_generation, ms_swift.model_dtype) == (3, True, "bfloat16")
    assert any("gathers the whole model" in n for n in ms_swift.notes)
    zero2 = trl_launch({"model_name_or_path": "m", "deepspeed": "recipes/accelerate_configs/ds_zero2.json"}, 2)
    assert zero2.zero_stage == 2 and zero2.knobs["state_sharding"] == "zero2"
    assert any("ZeRO-2 (bf16): parameters replicated" in n for n in zero2.notes)
    no_gather = trl_launch(
        {
            "model_name_or_path": "m",
            "deepspeed": {"zero_optimization": {"stage": 3}},
            "ds3_gather_for_generation": False,
        },
        2,
    )
    assert (no_gather.zero_stage, no_gather.gather_for_generation) == (3, False)
    assert not any("gathers" in n for n in no_gather.notes)
