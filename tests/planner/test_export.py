"""--emit verl / trl: the plan's values under the peers' key names."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.evaluate import PlanInputs, model_ref
from grpo_pilot.planner.export import trl_config_text, trl_settings, verl_command, verl_overrides
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.profiles import resolve_model

# reference/verl-config.md "What the tool must emit": the minimum set of a runnable GRPO command.
VERL_REQUIRED = {
    "algorithm.adv_estimator",
    "data.train_files",
    "data.val_files",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "data.filter_overlong_prompts",
    "data.truncation",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.kl_loss_type",
    "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.ref.fsdp_config.param_offload",
    "actor_rollout_ref.rollout.name",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.rollout.max_num_seqs",
    "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.free_cache_engine",
    "algorithm.use_kl_in_reward",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    "trainer.logger",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.total_epochs",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.val_before_train",
}


def plan_for(knobs: Knobs, workload: Workload = Workload(), gpus: str = "2x8xH100", model: str = "qwen-8b"):
    return evaluate(
        PlanInputs(model=model_ref(resolve_model(model)), cluster=parse_cluster(gpus), workload=workload), knobs
    )


def test_verl_overrides_map_every_value() -> None:
    knobs = Knobs(
        rollout_tp=4,
        gpu_memory_utilization=0.65,
        micro_batch_size_per_gpu=8,
        param_offload=True,
        ref_param_offload=True,
        ulysses_sp=2,
        fused_logprob=True,
        enforce_eager=True,
        log_prob_max_token_len_per_gpu=12288,
    )
    w = Workload(prompts_per_step=512, mini_batch_prompts=128, n=8, prompt_len_tokens=1024, response_len_tokens=3072)
    o = dict(verl_overrides(plan_for(knobs, w)))
    assert VERL_REQUIRED <= set(o)
    assert o["data.train_batch_size"] == "512" and o["actor_rollout_ref.actor.ppo_mini_batch_size"] == "128"
    assert o["actor_rollout_ref.rollout.n"] == "8"
    assert o["data.max_prompt_length"] == "1024" and o["data.max_response_length"] == "3072"
    assert o["actor_rollout_ref.rollout.max_model_len"] == "4096"
    assert o["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "4"
    assert o["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.65"
    assert (
        o["actor_rollout_ref.actor.use_dynamic_bsz"] == "False"
        and o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "8"
    )
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" not in o
    assert (
        o["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"]
        == o["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"]
        == "12288"
    )
    assert (
        o["actor_rollout_ref.actor.fsdp_config.param_offload"] == "True"
        and o["actor_rollout_ref.actor.fsdp_config.optimizer_offload"] == "False"
    )
    assert o["actor_rollout_ref.ref.fsdp_config.param_offload"] == "True"
    assert o["actor_rollout_ref.actor.ulysses_sequence_parallel_size"] == "2"
    assert (
        o["actor_rollout_ref.model.use_fused_kernels"] == "True"
        and o["actor_rollout_ref.rollout.enforce_eager"] == "True"
    )
    assert o["trainer.nnodes"] == "2" and o["trainer.n_gpus_per_node"] == "8"
    assert o["actor_rollout_ref.model.path"] == "Qwen/Qwen3-8B"


def test_verl_dynamic_batching_and_no_kl() -> None:
    o = dict(verl_overrides(plan_for(Knobs(max_token_len_per_gpu=6144), Workload(use_kl_loss=False))))
    assert (
        o["actor_rollout_ref.actor.use_dynamic_bsz"] == "True"
        and o["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "6144"
    )
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" not in o
    assert o["actor_rollout_ref.actor.use_kl_loss"] == "False" and o["actor_rollout_ref.actor.kl_loss_coef"] == "0.0"


def test_verl_command_is_one_shell_command() -> None:
    text = verl_command(plan_for(Knobs()))
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines[0] == "python3 -m verl.trainer.main_ppo \\"
    assert all(ln.endswith(" \\") for ln in lines[:-1]) and not lines[-1].endswith("\\")
    words = shlex.split(" ".join(ln.rstrip("\\") for ln in lines))
    assert words[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert 'trainer.logger=["console"]' in words and "data.train_files=$TRAIN_FILES" in words
    assert dict(w.split("=", 1) for w in words[3:]) == dict(verl_overrides(plan_for(Knobs())))


def test_trl_batch_sizes_count_completions() -> None:
    w = Workload(prompts_per_step=512, mini_batch_prompts=128, n=8)
    settings, notes = trl_settings(
        plan_for(Knobs(micro_batch_size_per_gpu=4, rollout_tp=2, gpu_memory_utilization=0.4), w)
    )
    world = 16
    assert settings["per_device_train_batch_size"] == 4
    assert settings["per_device_train_batch_size"] * world * settings["gradient_accumulation_steps"] == 128 * 8
    assert settings["per_device_train_batch_size"] * world * settings["steps_per_generation"] == 512 * 8
    assert settings["num_generations"] == 8 and settings["max_completion_length"] == 1024
    assert settings["vllm_max_model_length"] == 1536 and settings["beta"] == 0.001
    assert settings["vllm_mode"] == "colocate" and settings["vllm_tensor_parallel_size"] == 2
    assert settings["vllm_gpu_memory_utilization"] == 0.4
    # checkpointing is FSDP's (transformers refuses gradient_checkpointing together with it)
    assert settings["fsdp"] is True and settings["fsdp_config"]["activation_checkpointing"] is True
    assert settings["gradient_checkpointing"] is False and settings["fsdp_config"]["cpu_offload"] is False
    assert any("512 tokens" in n for n in notes)  # the prompt cap is a dataset filter in trl 1.16


def test_trl_split_is_server_mode_and_token_budget_becomes_sequences() -> None:
    plan = plan_for(Knobs(placement="split", max_token_len_per_gpu=4 * 1536, rollout_tp=2), Workload(use_kl_loss=False))
    settings, notes = trl_settings(plan)
    assert settings["vllm_mode"] == "server" and "vllm_tensor_parallel_size" not in settings
    assert settings["per_device_train_batch_size"] == 4 and settings["beta"] == 0.0
    assert any("trl vllm-serve" in n for n in notes) and any("token budget" in n for n in notes)
    text = trl_config_text(plan)
    assert "config = GRPOConfig(" in text and "vllm_mode='server'," in text
    compile(text, "<trl>", "exec")  # valid Python


def test_exports_follow_the_plans_target() -> None:
    inp = PlanInputs(model=model_ref(resolve_model("qwen-8b")), cluster=parse_cluster("8xH100"), target="trl")
    trl_plan = evaluate(inp, Knobs())
    settings, notes = trl_settings(trl_plan)
    assert settings["vllm_enable_sleep_mode"] is False  # TRL's default, which the trl estimate models
    assert not any("re-plan with --target trl" in n for n in notes)
    other, other_notes = trl_settings(plan_for(Knobs()))
    assert other["vllm_enable_sleep_mode"] is True and any("re-plan with --target trl" in n for n in other_notes)
    assert "re-plan with --target verl" in verl_command(trl_plan)


def test_trl_keys_are_grpo_config_fields() -> None:
    trl = pytest.importorskip("trl")
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    settings, _ = trl_settings(plan_for(Knobs(param_offload=True)))
    assert set(settings) <= fields


@pytest.mark.parametrize(
    "knobs",
    [Knobs(), Knobs(param_offload=True, gradient_checkpointing=False), Knobs(placement="split")],
    ids=["colocated", "offload", "server"],
)
def test_trl_settings_construct_a_grpo_config(knobs: Knobs, tmp_path) -> None:
    """The emitted keyword arguments build the installed GRPOConfig (transformers' FSDP plugin included).

    bf16 needs a GPU to validate; on a CPU-only host the GPU plan is built with bf16 off and use_cpu."""
    trl = pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    settings, _ = trl_settings(plan_for(knobs))
    assert settings["bf16"] is True and settings["fsdp"] is True
    host = {} if torch.cuda.is_available() else {"bf16": False, "use_cpu": True}
    config = trl.GRPOConfig(**{**settings, **host}, output_dir=str(tmp_path))
    plugin = config.fsdp_plugin_args
    assert plugin["fsdp_version"] == 2 and plugin["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert plugin["activation_checkpointing"] is knobs.gradient_checkpointing
    assert plugin.get("cpu_offload", False) is knobs.param_offload
    assert config.num_generations == settings["num_generations"]


def test_trl_cpu_plan_constructs_verbatim(tmp_path) -> None:
    trl = pytest.importorskip("trl")
    inp = PlanInputs(model=model_ref(resolve_model("qwen3-0.6b")), cluster=parse_cluster("1xcpu"), target="trl")
    settings, _ = trl_settings(evaluate(inp, Knobs(rollout_backend="hf", rollout_tp=1)))
    assert settings["bf16"] is False and "fsdp" not in settings  # one process: nothing to shard
    config = trl.GRPOConfig(**settings, output_dir=str(tmp_path))
    assert config.gradient_checkpointing is True and not config.fsdp


def test_verl_fixed_log_prob_micro_batch_and_v0_engine() -> None:
    plan = plan_for(Knobs(log_prob_micro_batch_size_per_gpu=16, vllm_engine="v0"))
    o = dict(verl_overrides(plan))
    for role in ("rollout", "ref"):
        assert o[f"actor_rollout_ref.{role}.log_prob_use_dynamic_bsz"] == "False"
        assert o[f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu"] == "16"
        assert f"actor_rollout_ref.{role}.log_prob_max_token_len_per_gpu" not in o
    assert "VLLM_USE_V1=0" in verl_command(plan)


def test_the_allocator_the_plan_assumes_reaches_each_export() -> None:
    expandable, default = plan_for(Knobs(allocator="expandable")), plan_for(Knobs(allocator="default"))
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in verl_command(expandable)
    assert "--pin allocator=expandable" in verl_command(default)
    assert "export PYTORCH_CUDA_ALLOC_CONF" not in verl_command(default)
    assert any("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in n for n in trl_settings(expandable)[1])
    assert not any("PYTORCH_CUDA_ALLOC_CONF" in n for n in trl_settings(default)[1])


def test_trl_export_names_the_plans_launcher() -> None:
    """A ZeRO-1/2 plan exports a DeepSpeed config (its optimizer offload included), a DDP plan neither FSDP nor
    DeepSpeed, a fully sharded one FSDP — never an FSDP launch for states the plan replicates."""
    inputs = PlanInputs(
        model=model_ref(resolve_model("qwen2.5-1.5b")),
        cluster=parse_cluster("4xH100"),
        workload=Workload(),
        target="trl",
    )
    zero2 = trl_settings(evaluate(inputs, Knobs(state_sharding="zero2", optimizer_offload=True)))[0]
    assert "fsdp" not in zero2 and "fsdp_config" not in zero2
    assert zero2["deepspeed"]["zero_optimization"] == {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
    }
    zero1 = trl_settings(evaluate(inputs, Knobs(state_sharding="zero1")))[0]
    assert zero1["deepspeed"]["zero_optimization"] == {"stage": 1}
    ddp, notes = trl_settings(evaluate(inputs, Knobs(state_sharding="ddp")))
    assert not {"fsdp", "fsdp_config", "deepspeed"} & set(ddp) and any("(DDP)" in n for n in notes)
    full = trl_settings(evaluate(inputs, Knobs()))[0]
    assert full["fsdp"] is True and "deepspeed" not in full
