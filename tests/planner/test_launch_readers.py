"""--from-verl / --from-trl readers: bash words as published, verl keys and defaults, TRL batch arithmetic."""

from __future__ import annotations

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import PlanInputs, model_ref
from grpo_pilot.planner.export import trl_settings, verl_command, verl_overrides
from grpo_pilot.planner.from_trl import read_trl, trl_launch
from grpo_pilot.planner.from_verl import read_verl, verl_launch
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.shell_words import arithmetic, read_script
from grpo_pilot.profiles import resolve_model

SCRIPT = r"""#!/bin/bash
set -x
export VLLM_ATTENTION_BACKEND=XFORMERS
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2-7B-Instruct}
MODEL_NAME=Qwen/Qwen2.5-Math-1.5B
max_len=$((1024 * 3))   # comment
nodes=2
train_files="['$HOME/data/gsm8k/train.parquet']"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$train_files" \
    data.train_batch_size=$((64*2)) \
    data.max_prompt_length=512 \
    data.max_response_length=${max_len} \
    actor_rollout_ref.model.path=$MODEL_PATH \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$((max_len * 4)) \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    trainer.experiment_name='name_${MODEL_NAME##*/}' \
    trainer.nnodes=$nodes \
    trainer.n_gpus_per_node=8 $@ 2>&1 | tee log.txt
"""


def test_bash_reader_expands_what_scripts_use() -> None:
    s = read_script(SCRIPT, {"HOME": "/home/u"})
    assert s.variables["max_len"] == "3072" and s.variables["MODEL_PATH"] == "Qwen/Qwen2-7B-Instruct"
    assert s.variables["VLLM_ATTENTION_BACKEND"] == "XFORMERS"
    launch = next(c for c in s.commands if "verl.trainer.main_ppo" in c.words)
    assert "data.train_files=['/home/u/data/gsm8k/train.parquet']" in launch.words
    assert "trainer.experiment_name=name_${MODEL_NAME##*/}" in launch.words  # single quotes: literal
    assert launch.words[-1] == "trainer.n_gpus_per_node=8"  # `$@` empty, the pipe ends the command
    assert arithmetic("(a + 2) * b / 3 - 7 % 4", {"a": "4", "b": "5"}) == 7
    assert read_script("x=path/to/model.bin\ny=${x%.*}\nz=${x##*/}\nw=${UNSET:=d}").variables | {} == {
        "x": "path/to/model.bin",
        "y": "path/to/model",
        "z": "model.bin",
        "w": "d",
        "UNSET": "d",
    }


def test_bash_reader_reports_what_it_cannot_know() -> None:
    s = read_script('N=$(nproc)\necho "$N $MISSING"')
    assert s.substitutions == ("$(nproc)",) and "MISSING" in s.unset
    with pytest.raises(InputError, match="Unterminated"):
        read_script("echo 'oops")
    with pytest.raises(InputError, match="divides by zero"):
        read_script("x=$((1/0))")


def test_verl_script_maps_to_planner_inputs() -> None:
    launch = read_verl(SCRIPT, ["trainer.nnodes=1", "~actor_rollout_ref.actor.use_kl_loss"])
    assert launch.model == "Qwen/Qwen2-7B-Instruct" and (launch.num_nodes, launch.gpus_per_node) == (1, 8)
    w, k = launch.workload, launch.knobs
    assert (w["prompts_per_step"], w["mini_batch_prompts"], w["n"]) == (128, 32, 5)
    assert (w["prompt_len_tokens"], w["response_len_tokens"]) == (512, 3072)
    assert w["use_kl_loss"] is False  # removed by ~key; verl's default is off
    assert k["max_token_len_per_gpu"] == 12288 and k["micro_batch_size_per_gpu"] is None
    assert k["log_prob_max_token_len_per_gpu"] == 12288  # log-prob passes inherit the actor's dynamic budget
    assert k["rollout_tp"] == 4 and k["gpu_memory_utilization"] == 0.6 and k["vllm_engine"] == "v0"
    assert k["gradient_checkpointing"] is True and k["enforce_eager"] is False  # verl's current defaults
    Workload(**w), Knobs(**k)  # valid planner inputs


def test_verl_deprecated_global_micro_batches_are_divided_by_dp() -> None:
    launch = verl_launch(
        {
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.model.path": "m",
            "actor_rollout_ref.actor.ppo_micro_batch_size": "64",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size": "128",
            "actor_rollout_ref.ref.log_prob_micro_batch_size": "256",
            "trainer.n_gpus_per_node": "8",
        }
    )
    assert launch.knobs["micro_batch_size_per_gpu"] == 8
    assert launch.knobs["log_prob_micro_batch_size_per_gpu"] == 32  # the larger of rollout (16) and ref (32)
    assert any("differ" in n for n in launch.notes)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"trainer.nnodes": "0"}, "positive integer"),
        ({"algorithm.adv_estimator": "gae", "critic.strategy": "megatron"}, "critic trained under Megatron"),
        ({"algorithm.adv_estimator": "gae", "critic.use_dynamic_bsz": "False"}, "critic has neither"),
    ],
)
def test_verl_settings_outside_the_model_are_errors(overrides: dict[str, str], expected: str) -> None:
    base = {"actor_rollout_ref.model.path": "m", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4"}
    base["algorithm.adv_estimator"] = "grpo"
    base["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] = "4"
    with pytest.raises(InputError, match=expected):
        verl_launch({**base, **overrides})


def test_verl_families_are_read_not_refused() -> None:
    """GAE (verl's default estimator) trains a critic; LoRA goes into Workload.adapter; Megatron into the knobs."""
    base = {
        "actor_rollout_ref.model.path": "m",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "4",
        "critic.ppo_micro_batch_size_per_gpu": "8",
    }
    ppo = verl_launch(base)  # adv_estimator left at verl's default: gae
    assert ppo.workload["algorithm"] == "ppo" and ppo.workload["critic"].micro_batch_size_per_gpu == 8
    lora = verl_launch({**base, "algorithm.adv_estimator": "grpo", "actor_rollout_ref.model.lora_rank": "32"})
    assert lora.workload["adapter"].rank == 32 and "algorithm" not in lora.workload
    megatron = verl_launch(
        {
            **base,
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref.actor.strategy": "megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "4",
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": "2",
        }
    )
    k = megatron.knobs
    assert (k["strategy"], k["megatron_tp"], k["megatron_pp"], k["ulysses_sp"]) == ("megatron", 4, 2, 1)


def test_verl_export_reads_back_to_the_same_plan() -> None:
    """`--emit verl` then `--from-verl`: the same workload and knobs."""
    workload = Workload(prompts_per_step=256, mini_batch_prompts=64, n=8, response_len_tokens=2048)
    knobs = Knobs(rollout_tp=4, max_token_len_per_gpu=24576, param_offload=True, log_prob_micro_batch_size_per_gpu=8)
    inp = PlanInputs(model=model_ref(resolve_model("qwen2.5-7b")), cluster=parse_cluster("2x8xH100"), workload=workload)
    plan = evaluate(inp, knobs)
    launch = read_verl(verl_command(plan))
    assert Workload(**launch.workload) == workload
    unused = {"micro_batch_size_per_gpu", "log_prob_max_token_len_per_gpu"}  # dynamic update, fixed log-prob
    assert Knobs(**launch.knobs).model_dump(exclude=unused) == knobs.model_dump(exclude=unused)
    assert (launch.num_nodes, launch.gpus_per_node) == (2, 8)
    files = {"data.train_files": "", "data.val_files": ""}  # $TRAIN_FILES / $VAL_FILES unset here
    assert launch.overrides == {**dict(verl_overrides(plan)), **files}


OPEN_R1 = """
model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct
bf16: true
use_vllm: true
gradient_accumulation_steps: 4
gradient_checkpointing: true
max_prompt_length: 512
max_completion_length: 1024
num_generations: 16
per_device_train_batch_size: 16
"""


def test_trl_batch_arithmetic_counts_completions() -> None:
    launch = read_trl(OPEN_R1, total_gpus=8)  # server mode: 7 training processes + 1 vLLM GPU
    w, k = launch.workload, launch.knobs
    assert w["mini_batch_prompts"] == 16 * 7 * 4 // 16 == w["prompts_per_step"] and w["n"] == 16
    assert k["placement"] == "split" and k["split_rollout_gpus_per_node"] == 1
    assert w["use_kl_loss"] is False  # trl 1.16 default beta = 0
    # no deepspeed: / fsdp: key: DDP, with a note naming the override for a launcher config on the command line
    assert k["state_sharding"] == "ddp" and any("--override deepspeed=zero2" in n for n in launch.notes)
    colocated = trl_launch({"model_name_or_path": "m", "use_vllm": True, "vllm_mode": "colocate", "beta": 0.04}, 4)
    assert colocated.knobs["placement"] == "colocated" and colocated.workload["use_kl_loss"] is True
    assert trl_launch({"model_name_or_path": "m"}, 2).knobs["rollout_backend"] == "hf"


def test_trl_export_reads_back() -> None:
    workload = Workload(prompts_per_step=64, mini_batch_prompts=16, n=8, use_kl_loss=False)
    knobs = Knobs(rollout_tp=1, micro_batch_size_per_gpu=4, placement="colocated", gpu_memory_utilization=0.4)
    inp = PlanInputs(
        model=model_ref(resolve_model("qwen2.5-1.5b")), cluster=parse_cluster("8xH100"), workload=workload, target="trl"
    )
    settings, _ = trl_settings(evaluate(inp, knobs))
    launch = trl_launch({"model_name_or_path": "m", "max_prompt_length": 512, **settings}, 8)
    assert {k: launch.workload[k] for k in ("prompts_per_step", "mini_batch_prompts", "n")} == {
        "prompts_per_step": 64,
        "mini_batch_prompts": 16,
        "n": 8,
    }
    assert launch.knobs["micro_batch_size_per_gpu"] == 4 and launch.knobs["param_offload"] is False
    assert launch.knobs["gpu_memory_utilization"] == 0.4 and launch.knobs["placement"] == "colocated"


def test_trl_bad_batches_are_errors() -> None:
    with pytest.raises(InputError, match="multiple of num_generations"):
        trl_launch({"model_name_or_path": "m", "per_device_train_batch_size": 3, "num_generations": 4}, 1)
    with pytest.raises(InputError, match="needs GPUs besides"):
        trl_launch({"model_name_or_path": "m", "use_vllm": True, "num_processes": 2}, 2)
    with pytest.raises(InputError, match="not valid YAML"):
        read_trl("a: [", 1)


def test_environment_words_and_dapo_entry_point() -> None:
    script = "python3 -m recipe.dapo.src.main_dapo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=m \\\n"
    script += "    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \\\n"
    script += "    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2\n"
    launch = read_verl(script, ["VLLM_USE_V1=0", "trainer.nnodes=2"])
    assert launch.knobs["vllm_engine"] == "v0" and launch.num_nodes == 2


def test_trl_generation_batch_size_and_nodes() -> None:
    cfg = {
        "model_name_or_path": "m",
        "use_vllm": True,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 16,
        "generation_batch_size": 512,
        "num_generations": 16,
        "num_processes": 8,
    }
    launch = trl_launch(cfg, total_gpus=16, num_nodes=2)
    assert launch.workload["prompts_per_step"] == 512 // 16 and launch.workload["mini_batch_prompts"] == 32
    assert launch.knobs["split_rollout_gpus_per_node"] == 4  # 8 vLLM GPUs, an equal share of each node
    with pytest.raises(InputError, match="not a multiple"):
        trl_launch({**cfg, "generation_batch_size": 100}, total_gpus=16, num_nodes=2)
    with pytest.raises(InputError, match="divide evenly"):
        trl_launch({**cfg, "num_processes": 9, "generation_batch_size": None}, total_gpus=16, num_nodes=2)
    assert read_trl("model_name_or_path: m\nuse_vllm: true\n", 16, ["num_processes=8"], 2).knobs["placement"] == "split"


def test_trl_launches_run_the_default_allocator_and_never_empty_the_cache() -> None:
    """Neither TRL nor Axolotl sets PYTORCH_CUDA_ALLOC_CONF, and transformers' torch_empty_cache_steps defaults
    to None ("cache will not be emptied"): a TRL plan charges the default allocator's reserve."""
    knobs = trl_launch({"model_name_or_path": "m"}, 2).knobs
    assert (knobs["allocator"], knobs["release_cache"]) == ("default", "never")


def test_trl_legacy_vllm_device_shares_a_training_gpu_or_takes_the_next() -> None:
    """TRL <= 0.15 `vllm_device` (trl v0.15.0 grpo_trainer.py lines 374-391): `auto` on one GPU shares it (planned
    colocated, 0.9 of the device by that release's default); with more GPUs it takes cuda:{num_processes} (split);
    an index of a training process shares that GPU; one past the GPUs is TRL's error."""
    cfg = "model_name_or_path: m\nuse_vllm: true\nvllm_device: auto\nper_device_train_batch_size: 8\n"
    one = read_trl(cfg, 1)
    assert one.knobs["placement"] == "colocated" and one.knobs["gpu_memory_utilization"] == 0.9
    assert one.workload["prompts_per_step"] == 1  # one training process
    assert read_trl(cfg + "vllm_gpu_memory_utilization: 0.3\n", 1).knobs["gpu_memory_utilization"] == 0.3
    two = read_trl(cfg + "num_processes: 1\n", 2)
    assert two.knobs["placement"] == "split" and two.knobs["split_rollout_gpus_per_node"] == 1
    shared = read_trl(cfg.replace("auto", "cuda:1") + "num_processes: 2\n", 2)
    assert shared.knobs["placement"] == "colocated" and any("also a training GPU" in n for n in shared.notes)
    with pytest.raises(InputError, match="cuda:2"):
        read_trl(cfg + "num_processes: 2\n", 2)
    with pytest.raises(InputError, match="neither 'auto' nor"):
        read_trl(cfg.replace("auto", "gpu0"), 2)
