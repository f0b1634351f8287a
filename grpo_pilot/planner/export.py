"""Exports of a `Plan` to the peers' configuration languages.

- `verl_overrides(plan)` / `verl_command(plan)`: a runnable `python3 -m verl.trainer.main_ppo ...`
  command with verl's Hydra key names (reference/verl-config.md "What the tool must emit"; key names
  checked against verl's ppo_trainer.yaml and public run scripts).
- `trl_settings(plan)` / `trl_config_text(plan)`: the matching TRL `GRPOConfig` keyword arguments
  (field names checked against the installed trl 1.16 `GRPOConfig` dataclass). TRL batch sizes count
  completions: `per_device_train_batch_size` is the micro-batch in sequences, the optimizer step is
  `per_device × processes × gradient_accumulation_steps` completions (our mini-batch × n), and one
  generation batch feeds `steps_per_generation` micro-steps (prompts per step × n completions).

Knobs a target cannot express are listed as comment lines, never silently dropped. The launch families'
keys (PPO's critic, Megatron, LoRA, SGLang, activation offload) come from export_families.py.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.export_families import (
    MEGATRON_CONFIG_NAME,
    axolotl_adapter_lines,
    trl_family_notes,
    trl_peft_lines,
    verl_family_overrides,
)
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.ref_offload import forced_ref_offload
from grpo_pilot.planner.roofline import pools
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.planner.verl_engine_knobs import EXPANDABLE_ENV
from grpo_pilot.planner.verl_versions import change_named

# KL settings of verl's GRPO example scripts (examples/grpo_trainer/run_qwen2-7b.sh: kl_loss_coef
# 0.001, kl_loss_type low_var_kl); the workload only says whether the KL loss is on.
KL_LOSS_COEF = 0.001
KL_LOSS_TYPE = "low_var_kl"


def _b(flag: bool) -> str:
    return "True" if flag else "False"


def _model_path(plan: Plan) -> str:
    return plan.model.hub_id or plan.model.resolved


def micro_batch_seqs(plan: Plan) -> int:
    """Sequences per update micro-batch: the fixed micro-batch, or what the token budget holds."""
    k, seq = plan.knobs, plan.workload.seq_len_tokens
    if k.dynamic_batching:
        scale = k.ulysses_sp if traits_for(plan.target).budget_scaled_by_sp else 1
        return max(1, (k.max_token_len_per_gpu or seq) * scale // seq)
    return k.micro_batch_size_per_gpu or 1


def _verl_allocator_note(plan: Plan) -> str:
    """What the plan's allocator setting means for a verl launch (verl_versions.CHANGES 'expandable_segments', for
    the Megatron workers 'megatron_expandable_segments')."""
    megatron = plan.knobs.strategy == "megatron"
    since = change_named("megatron_expandable_segments" if megatron else "expandable_segments").source
    if plan.knobs.allocator == "expandable":
        return (
            f"the plan assumes expandable segments ({since} and later set them for training); with an older "
            f"verl, export {EXPANDABLE_ENV} before launching."
        )
    return (
        f"the plan assumes PyTorch's default allocator (fixed segments); {since} and later switch expandable "
        "segments on, which holds less: re-plan with --pin allocator=expandable for a recent verl."
    )


def verl_notes(plan: Plan) -> tuple[str, ...]:
    notes = [_verl_allocator_note(plan)]
    if plan.knobs.placement == "split":
        notes.append(
            "placement=split has no main_ppo key: verl's main_ppo colocates rollout and training "
            "(hybrid engine); "
            "this command runs colocated, so re-plan with --pin placement=colocated before trusting its memory."
        )
    if plan.target != "verl":
        notes.append(
            f"memory was estimated for target {plan.target}; "
            "re-plan with --target verl for verl's own memory behaviour."
        )
    if plan.workload.use_kl_loss and forced_ref_offload(plan.knobs, traits_for("verl")):
        # fsdp_workers.py _build_model_optimizer (fefca4172 #121 on; FSDP2 db84a4007 #1026): role "ref" gets
        # CPUOffload(offload_params=True) / CPUOffloadPolicy whatever the key (planner/ref_offload.py)
        notes.append(
            "actor_rollout_ref.ref.fsdp_config.param_offload is written for completeness: verl (since #121) wraps the "
            "FSDP reference in CPUOffload whatever it says, so the reference lives in host RAM and streams in during "
            "its pass."
        )
    if plan.knobs.rollout_backend == "vllm" and plan.knobs.vllm_engine == "v0":
        notes.append("the plan assumes vLLM's V0 engine: export VLLM_USE_V1=0 (vLLM >= 0.8) before launching.")
    if not plan.fits:
        notes.append("this plan does NOT fit (see grpo-plan's violations); the command is printed for reference only.")
    return tuple(notes)


def verl_overrides(plan: Plan) -> tuple[tuple[str, str], ...]:
    """Ordered (key, value) Hydra overrides for verl's FSDP GRPO trainer."""
    k, w, c = plan.knobs, plan.workload, plan.cluster
    out: list[tuple[str, str]] = [
        ("algorithm.adv_estimator", "grpo"),
        ("algorithm.use_kl_in_reward", "False"),
        ("data.train_files", "$TRAIN_FILES"),
        ("data.val_files", "$VAL_FILES"),
        ("data.train_batch_size", str(w.prompts_per_step)),
        ("data.max_prompt_length", str(w.prompt_len_tokens)),
        ("data.max_response_length", str(w.response_len_tokens)),
        ("data.filter_overlong_prompts", "True"),
        ("data.truncation", "error"),
        ("actor_rollout_ref.model.path", _model_path(plan)),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", _b(k.gradient_checkpointing)),
        ("actor_rollout_ref.model.use_remove_padding", _b(k.remove_padding)),
        ("actor_rollout_ref.model.use_fused_kernels", _b(k.fused_logprob)),
        ("actor_rollout_ref.actor.strategy", "fsdp2"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", str(w.mini_batch_prompts)),
        ("actor_rollout_ref.actor.ppo_epochs", str(w.ppo_epochs)),
    ]
    if k.dynamic_batching:
        out += [
            ("actor_rollout_ref.actor.use_dynamic_bsz", "True"),
            ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", str(k.max_token_len_per_gpu)),
        ]
    else:
        out += [
            ("actor_rollout_ref.actor.use_dynamic_bsz", "False"),
            ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", str(k.micro_batch_size_per_gpu)),
        ]
    out += [
        ("actor_rollout_ref.actor.use_kl_loss", _b(w.use_kl_loss)),
        ("actor_rollout_ref.actor.kl_loss_coef", str(KL_LOSS_COEF if w.use_kl_loss else 0.0)),
        ("actor_rollout_ref.actor.kl_loss_type", KL_LOSS_TYPE),
        ("actor_rollout_ref.actor.entropy_coeff", repr(w.entropy_coeff)),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", str(k.ulysses_sp)),
        ("actor_rollout_ref.actor.fsdp_config.param_offload", _b(k.param_offload)),
        ("actor_rollout_ref.actor.fsdp_config.fsdp_size", str(k.fsdp_size or -1)),
        ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", _b(k.optimizer_offload)),
    ]
    for role in ("rollout", "ref"):
        if k.log_prob_micro_batch_size_per_gpu is None:
            out += [
                (f"actor_rollout_ref.{role}.log_prob_use_dynamic_bsz", "True"),
                (f"actor_rollout_ref.{role}.log_prob_max_token_len_per_gpu", str(k.log_prob_max_token_len_per_gpu)),
            ]
        else:
            out += [
                (f"actor_rollout_ref.{role}.log_prob_use_dynamic_bsz", "False"),
                (
                    f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu",
                    str(k.log_prob_micro_batch_size_per_gpu),
                ),
            ]
    out += [
        ("actor_rollout_ref.ref.fsdp_config.param_offload", _b(k.ref_param_offload)),
        ("actor_rollout_ref.rollout.name", k.rollout_backend),
        ("actor_rollout_ref.rollout.n", str(w.n)),
        (
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            str(k.rollout_tp if k.rollout_backend != "hf" else 1),
        ),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", f"{k.gpu_memory_utilization:g}"),
        ("actor_rollout_ref.rollout.max_num_batched_tokens", str(k.max_num_batched_tokens)),
        ("actor_rollout_ref.rollout.max_num_seqs", str(k.max_num_seqs)),
        ("actor_rollout_ref.rollout.max_model_len", str(w.seq_len_tokens)),
        ("actor_rollout_ref.rollout.enforce_eager", _b(k.enforce_eager)),
        ("actor_rollout_ref.rollout.free_cache_engine", "True"),
        ("trainer.n_gpus_per_node", str(c.gpus_per_node)),
        ("trainer.nnodes", str(c.num_nodes)),
        ("trainer.logger", '["console"]'),
        ("trainer.project_name", "grpo-pilot"),
        ("trainer.experiment_name", f"{plan.model.resolved}-{c.label()}".replace("/", "_")),
        ("trainer.total_epochs", "1"),
        ("trainer.save_freq", "-1"),
        ("trainer.test_freq", "-1"),
        ("trainer.val_before_train", "False"),
    ]
    return tuple(verl_family_overrides(out, w, k, _model_path(plan)))


def _shell_value(value: str) -> str:
    """Quote for bash, but leave $VARS expandable (data files come from the environment)."""
    if value.startswith("$") and value[1:].replace("_", "").isalnum():
        return f'"{value}"'
    return shlex.quote(value)


def verl_command(plan: Plan) -> str:
    """A bash command line (with `#` comment lines first) that launches verl with the plan's knobs."""
    head = [
        f"# verl GRPO for {_model_path(plan)} on {plan.cluster.label()} "
        f"(grpo-pilot plan: predicted {plan.predicted_step_s:.1f} s/step, fits={plan.fits})",
        "# set TRAIN_FILES and VAL_FILES to your parquet files first",
    ]
    head += [f"# note: {n}" for n in verl_notes(plan)]
    entry = "python3 -m verl.trainer.main_ppo"
    if plan.knobs.strategy == "megatron":
        entry += f" --config-path=config --config-name={MEGATRON_CONFIG_NAME}"
    lines = [entry] + [f"    {key}={_shell_value(val)}" for key, val in verl_overrides(plan)]
    return "\n".join(head) + "\n" + " \\\n".join(lines) + "\n"


def trl_fsdp_config(k: Knobs) -> dict[str, Any]:
    """The `fsdp_config` dict of transformers >= 5 (`fsdp=True` + this dict; the string form
    "full_shard offload auto_wrap" is deprecated): FSDP2 sharding every decoder layer, offloaded to host
    RAM when the plan offloads parameters or optimizer states, and FSDP's activation checkpointing in
    place of `gradient_checkpointing` (transformers refuses both; the latter adds an all-gather)."""
    return {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "reshard_after_forward": True,
        "cpu_offload": k.param_offload or k.optimizer_offload,
        "activation_checkpointing": k.gradient_checkpointing,
    }


def trl_deepspeed_config(k: Knobs) -> dict[str, Any]:
    """The `deepspeed` dict (TrainingArguments accepts a dict; transformers' HfTrainerDeepSpeedConfig fills the
    "auto" values from the other arguments) of a ZeRO-1/2 plan, its optimizer offloaded to host RAM when the plan
    offloads it (DeepSpeed `zero_optimization.offload_optimizer.device`, memory/zero.py)."""
    zero: dict[str, Any] = {"stage": 1 if k.state_sharding == "zero1" else 2}
    if k.optimizer_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
    }


def _trl_keyless_notes(plan: Plan) -> list[str]:
    """Notes for the plan's knobs that GRPOConfig cannot express."""
    k, w = plan.knobs, plan.workload
    notes: list[str] = []
    if w.use_kl_loss and k.ref_param_offload:
        notes.append("ref_param_offload has no GRPOConfig key (TRL keeps the reference model on the GPU)")
    if k.ulysses_sp > 1:
        notes.append(
            f"ulysses_sp={k.ulysses_sp} has no GRPOConfig key "
            "(use accelerate's parallelism_config for context parallelism)"
        )
    if k.allocator == "expandable":  # neither TRL nor accelerate sets the allocator (planner/from_trl.py)
        notes.append(f"export {EXPANDABLE_ENV} before launching (the plan assumes expandable segments)")
    if k.state_sharding == "ddp":
        notes.append("the plan replicates every state (DDP): launch without an accelerate FSDP / DeepSpeed config")
    if k.fused_logprob:
        notes.append("fused_logprob has no GRPOConfig key in trl 1.16 (use_liger_kernel is deprecated there)")
    if k.rollout_backend == "vllm" and k.enforce_eager:
        notes.append("enforce_eager has no GRPOConfig key")
    defaults = Knobs()
    if (k.max_num_seqs, k.max_num_batched_tokens) != (defaults.max_num_seqs, defaults.max_num_batched_tokens):
        notes.append("max_num_seqs / max_num_batched_tokens have no GRPOConfig key")
    return notes


def trl_settings(plan: Plan) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(GRPOConfig keyword arguments, notes for what GRPOConfig cannot express)."""
    k, w = plan.knobs, plan.workload
    _, train_gpus = pools(plan.cluster, k)
    per_device = micro_batch_seqs(plan)
    per_step_completions = per_device * train_gpus
    grad_accum = max(1, math.ceil(w.mini_batch_prompts * w.n / per_step_completions))
    steps_per_generation = max(1, math.ceil(w.responses_per_step / per_step_completions))
    colocate = k.placement == "colocated"
    settings: dict[str, Any] = {
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": grad_accum,
        "num_generations": w.n,
        "steps_per_generation": steps_per_generation,
        "max_completion_length": w.response_len_tokens,
        "num_iterations": w.ppo_epochs,
        "beta": KL_LOSS_COEF if w.use_kl_loss else 0.0,
        "entropy_coef": w.entropy_coeff,
        "use_vllm": k.rollout_backend == "vllm",
        "gradient_checkpointing": k.gradient_checkpointing,
        "bf16": plan.cluster.device.mixed_precision,
    }
    if k.model_dtype != "fp32":  # TRL loads fp32 unless told (planner/trl_dtype.py); the plan's states follow it
        settings["model_init_kwargs"] = {"dtype": {"bf16": "bfloat16", "fp16": "float16"}[k.model_dtype]}
    if k.rollout_backend == "vllm":
        settings["vllm_mode"] = "colocate" if colocate else "server"
        settings["vllm_max_model_length"] = w.seq_len_tokens
        if colocate:
            settings["vllm_gpu_memory_utilization"] = k.gpu_memory_utilization
            settings["vllm_tensor_parallel_size"] = k.rollout_tp
            # TRL keeps the engine's weights and KV cache through training unless sleep mode is on; the
            # grpo-pilot and verl estimates assume they are freed, so only a TRL-target plan keeps them.
            settings["vllm_enable_sleep_mode"] = plan.target != "trl"
    if k.state_sharding in ("zero1", "zero2"):  # the plan's launcher: DeepSpeed, not FSDP (memory/zero.py)
        settings["deepspeed"] = trl_deepspeed_config(k)
    elif train_gpus > 1 and k.state_sharding == "full":  # one training process has nothing to shard
        settings["fsdp"] = True
        settings["fsdp_config"] = trl_fsdp_config(k)
        if k.gradient_checkpointing:  # FSDP's own checkpointing replaces it (_trl_comment)
            settings["gradient_checkpointing"] = False
    notes = (
        []
        if plan.target == "trl"
        else [
            f"memory was estimated for target {plan.target}; re-plan with --target trl for TRL's own memory behaviour"
        ]
    )
    notes += [
        f"launch on {train_gpus} training processes (accelerate launch --num_processes {train_gpus})",
        f"keep prompts at most {w.prompt_len_tokens} tokens "
        "(filter the dataset; GRPOConfig has no prompt-length cap in trl 1.16)",
    ]
    if per_device * train_gpus * grad_accum != w.mini_batch_prompts * w.n:
        notes.append(
            f"the mini-batch of {w.mini_batch_prompts * w.n} completions is not a multiple of "
            f"{per_device} × {train_gpus}; the optimizer step uses {per_device * train_gpus * grad_accum}"
        )
    if k.rollout_backend == "vllm" and not colocate:
        notes.append(
            f"server mode: start `trl vllm-serve --model {_model_path(plan)} "
            f"--tensor-parallel-size {k.rollout_tp}` on the rollout GPUs"
        )
    if k.dynamic_batching:
        notes.append(
            f"token budget {k.max_token_len_per_gpu} has no GRPOConfig key: "
            f"expressed as {per_device} sequences per micro-batch"
        )
    notes += _trl_keyless_notes(plan)
    if not plan.fits:
        notes.append("this plan does NOT fit; printed for reference only")
    return settings, tuple(notes)


def _trl_comment(key: str, settings: dict[str, Any]) -> str:
    """An end-of-line comment where a setting would read as contradicting another one."""
    if key == "gradient_checkpointing" and settings.get("fsdp_config", {}).get("activation_checkpointing"):
        # GRPOConfig defaults it to True (trl 1.16 trainer/base_config.py); transformers >= 5 warns that both on
        # adds a redundant all-gather (training_args.py, transformers#30404): FSDP's own checkpointing replaces it
        return "  # the plan's checkpointing is fsdp_config['activation_checkpointing'] (FSDP's own), not this"
    return ""


def trl_config_text(plan: Plan) -> str:
    """Python source building the `GRPOConfig`, with notes as comments."""
    settings, notes = trl_settings(plan)
    head = [
        f"# TRL GRPOConfig for {_model_path(plan)} on {plan.cluster.label()} (grpo-pilot plan: predicted "
        f"{plan.predicted_step_s:.1f} s/step, fits={plan.fits})"
    ]
    head += [f"# note: {n}" for n in notes + tuple(trl_family_notes(plan.workload, plan.knobs))]
    body = ["from trl import GRPOConfig", "", "config = GRPOConfig("]
    body += [f"    {key}={value!r},{_trl_comment(key, settings)}" for key, value in settings.items()]
    body += ['    output_dir="grpo-output",', ")"]
    peft = trl_peft_lines(plan.workload.adapter)
    if peft:
        body += [""] + peft + axolotl_adapter_lines(plan.workload.adapter)
    return "\n".join(head + body) + "\n"
