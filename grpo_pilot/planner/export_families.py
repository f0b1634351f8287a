"""The launch families' keys in the exports (export.py): verl overrides, TRL's PEFT / quantization settings,
Axolotl's adapter keys. Key names as verl b178a3cd's `_generated_ppo_trainer.yaml` /
`_generated_ppo_megatron_trainer.yaml`, peft's `LoraConfig`, transformers' `BitsAndBytesConfig` and
Axolotl's config reference spell them (the readers, from_verl.py / verl_families.py / adapters.py, read the
same keys back).

- PPO: `algorithm.adv_estimator=gae` and the critic's keys (model path = the actor's, its micro-batches or
  token budgets, gradient checkpointing, offloads), `trainer.critic_warmup=0`;
- Megatron: `--config-name=ppo_megatron_trainer` (verl_command), `actor.strategy=megatron`, the parallel sizes,
  `sequence_parallel`, `use_distributed_optimizer`, the offloads under `actor.megatron.*` /
  `ref.megatron.*` instead of `fsdp_config.*`, recompute under `override_transformer_config`; the FSDP-only
  keys (Ulysses, fsdp_size, fsdp_config offloads) are dropped;
- LoRA: `model.lora_rank`, `lora_alpha`, `target_modules`, `rollout.load_format=safetensors` (verl's LoRA docs:
  vLLM loads the base, only adapters sync), `rollout.layered_summon`;
- activation offload: `model.enable_activation_offload`.
"""

from __future__ import annotations

from grpo_pilot.planner.adapters import AdapterSettings
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.memory.lora_plan import DEFAULT_LORA_RANK

ARR = "actor_rollout_ref."
MEGATRON_CONFIG_NAME = "ppo_megatron_trainer"
# FSDP-only keys of export.verl_overrides that have no meaning under Megatron
_FSDP_ONLY = (
    ARR + "actor.ulysses_sequence_parallel_size",
    ARR + "actor.fsdp_config.param_offload",
    ARR + "actor.fsdp_config.fsdp_size",
    ARR + "actor.fsdp_config.optimizer_offload",
    ARR + "ref.fsdp_config.param_offload",
    ARR + "model.enable_gradient_checkpointing",
)


def _b(flag: bool) -> str:
    return "True" if flag else "False"


def _alpha(adapter: AdapterSettings) -> float:
    """The adapter's alpha (peft's LoraConfig default 8 goes with r 8: alpha = r when unset)."""
    return adapter.alpha if adapter.alpha is not None else float(adapter.rank or DEFAULT_LORA_RANK)


def _targets(adapter: AdapterSettings) -> str:
    names = adapter.target_modules or ("all-linear",)
    return names[0] if len(names) == 1 else "[" + ",".join(names) + "]"


def _critic(workload: Workload, knobs: Knobs, model_path: str) -> list[tuple[str, str]]:
    s = workload.critic_settings
    out = [
        ("critic.model.path", model_path),
        ("critic.model.use_remove_padding", "True"),
        ("critic.model.enable_gradient_checkpointing", _b(s.gradient_checkpointing)),
        ("critic.model.fsdp_config.param_offload", _b(knobs.critic_param_offload)),
        ("critic.model.fsdp_config.optimizer_offload", _b(knobs.critic_optimizer_offload)),
        ("trainer.critic_warmup", "0"),
    ]
    if s.micro_batch_size_per_gpu is not None:
        out += [
            ("critic.use_dynamic_bsz", "False"),
            ("critic.ppo_micro_batch_size_per_gpu", str(s.micro_batch_size_per_gpu)),
        ]
    elif s.max_token_len_per_gpu is not None:
        out += [("critic.use_dynamic_bsz", "True"), ("critic.ppo_max_token_len_per_gpu", str(s.max_token_len_per_gpu))]
    elif knobs.dynamic_batching:  # verl's default: the actor's flag, a 32768-token budget (2× the actor's)
        out += [
            ("critic.use_dynamic_bsz", "True"),
            ("critic.ppo_max_token_len_per_gpu", str(2 * (knobs.max_token_len_per_gpu or 0))),
        ]
    else:
        out += [("critic.ppo_micro_batch_size_per_gpu", str(knobs.micro_batch_size_per_gpu or 1))]
    if s.reward_model:
        out += [
            ("reward_model.enable", "True"),
            ("reward_model.model.fsdp_config.param_offload", _b(s.reward_model_param_offload)),
        ]
    return out


def _megatron(knobs: Knobs) -> list[tuple[str, str]]:
    out = [
        (ARR + "actor.strategy", "megatron"),
        (ARR + "actor.megatron.tensor_model_parallel_size", str(knobs.megatron_tp)),
        (ARR + "actor.megatron.pipeline_model_parallel_size", str(knobs.megatron_pp)),
        (
            ARR + "actor.megatron.virtual_pipeline_model_parallel_size",
            str(knobs.megatron_vpp) if knobs.megatron_vpp > 1 else "null",
        ),
        (ARR + "actor.megatron.context_parallel_size", str(knobs.megatron_cp)),
        (ARR + "actor.megatron.sequence_parallel", _b(knobs.megatron_sequence_parallel)),
        (ARR + "actor.megatron.use_distributed_optimizer", _b(knobs.megatron_distributed_optimizer)),
        (ARR + "actor.megatron.param_offload", _b(knobs.param_offload)),
        (ARR + "actor.megatron.optimizer_offload", _b(knobs.optimizer_offload)),
        (ARR + "ref.megatron.param_offload", _b(knobs.ref_param_offload)),
    ]
    if knobs.megatron_recompute != "none":
        base = ARR + "actor.megatron.override_transformer_config."
        out.append((base + "recompute_granularity", knobs.megatron_recompute))
        if knobs.megatron_recompute == "full":
            out += [
                (base + "recompute_method", knobs.megatron_recompute_method),
                (base + "recompute_num_layers", str(knobs.megatron_recompute_num_layers)),
            ]
    return out


def _lora(adapter: AdapterSettings, knobs: Knobs) -> list[tuple[str, str]]:
    return [
        (ARR + "model.lora_rank", str(adapter.rank or DEFAULT_LORA_RANK)),
        (ARR + "model.lora_alpha", f"{adapter.alpha if adapter.alpha is not None else 16:g}"),
        (ARR + "model.target_modules", _targets(adapter)),
        (ARR + "rollout.load_format", "safetensors"),
        (ARR + "rollout.layered_summon", _b(knobs.layered_summon)),
    ]


def verl_family_overrides(
    overrides: list[tuple[str, str]], workload: Workload, knobs: Knobs, model_path: str
) -> list[tuple[str, str]]:
    """The FSDP GRPO overrides with the launch families' keys set (module docstring)."""
    out = list(overrides)
    if knobs.strategy == "megatron":
        out = [(k, v) for k, v in out if k not in _FSDP_ONLY and k != ARR + "actor.strategy"]
        out += _megatron(knobs)
    if workload.has_critic:
        out = [("algorithm.adv_estimator", "gae") if k == "algorithm.adv_estimator" else (k, v) for k, v in out]
        out += _critic(workload, knobs, model_path)
    if workload.adapter is not None and workload.adapter.method != "none":
        out += _lora(workload.adapter, knobs)
    if knobs.activation_offload:
        out.append((ARR + "model.enable_activation_offload", "True"))
    return out


def trl_peft_lines(adapter: AdapterSettings | None) -> list[str]:
    """Python lines building peft's LoraConfig (and a BitsAndBytesConfig for a quantized base) for GRPOTrainer."""
    if adapter is None or adapter.method == "none":
        return []
    targets = list(adapter.target_modules or ()) or None
    target_text = repr(targets[0]) if targets and len(targets) == 1 else repr(targets)
    lines = [
        "from peft import LoraConfig",
        "",
        "peft_config = LoraConfig(",
        f"    r={adapter.rank or DEFAULT_LORA_RANK},",
        f"    lora_alpha={_alpha(adapter):g},",
        f"    lora_dropout={adapter.dropout or 0.0:g},",
        f"    target_modules={target_text},",
        f"    use_dora={adapter.method == 'dora'},",
        f"    use_rslora={adapter.rslora},",
        '    task_type="CAUSAL_LM",',
        ")",
    ]
    if adapter.base_quantization:
        four = adapter.base_quantization == "4bit"
        lines += [
            "",
            "from transformers import BitsAndBytesConfig",
            "",
            "quantization_config = BitsAndBytesConfig(",
            f"    load_in_4bit={four},",
            f"    load_in_8bit={not four},",
        ]
        if four:
            lines += [
                f'    bnb_4bit_quant_type="{adapter.quant_type or "nf4"}",',
                f"    bnb_4bit_use_double_quant={adapter.double_quant},",
            ]
        lines += [")", "# pass model_init_kwargs={'quantization_config': quantization_config} to GRPOConfig"]
    lines += ["# GRPOTrainer(..., args=config, peft_config=peft_config)"]
    return lines


def axolotl_adapter_lines(adapter: AdapterSettings | None) -> list[str]:
    """The same adapter as Axolotl config keys (commented: Axolotl's YAML, not Python)."""
    if adapter is None or adapter.method == "none":
        return []
    targets = adapter.target_modules or ()
    lines = [
        f"# axolotl: adapter: {'qlora' if adapter.base_quantization == '4bit' else 'lora'}",
        f"# axolotl: lora_r: {adapter.rank or DEFAULT_LORA_RANK}",
        f"# axolotl: lora_alpha: {_alpha(adapter):g}",
        f"# axolotl: lora_dropout: {adapter.dropout or 0.0:g}",
    ]
    if targets == ("all-linear",) or not targets:
        lines.append("# axolotl: lora_target_linear: true")
    else:
        lines.append(f"# axolotl: lora_target_modules: [{', '.join(targets)}]")
    if adapter.base_quantization:
        lines.append(f"# axolotl: load_in_{adapter.base_quantization[0]}bit: true")
    return lines


def trl_family_notes(workload: Workload, knobs: Knobs) -> list[str]:
    """What of the plan TRL's GRPOTrainer cannot run (the config is then for reference only)."""
    notes = []
    if workload.has_critic:
        notes.append("the plan is PPO with a critic: TRL's GRPOTrainer has no critic (this config runs GRPO)")
    if knobs.strategy == "megatron":
        notes.append("the plan trains with Megatron: TRL trains with FSDP / DeepSpeed (re-plan with --target trl)")
    if knobs.rollout_backend == "sglang":
        notes.append("the plan rolls out with SGLang: TRL uses vLLM or generate (re-plan with --target trl)")
    if knobs.activation_offload:
        notes.append("activation_offload has no GRPOConfig key")
    return notes
