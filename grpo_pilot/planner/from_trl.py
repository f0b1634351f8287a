"""Read a TRL `GRPOConfig` YAML (or an Axolotl GRPO config) into the planner's inputs (`--from-trl`).

TRL counts completions, not prompts (trl 1.16 `GRPOConfig`): one optimizer step takes
`per_device_train_batch_size × processes × gradient_accumulation_steps` completions, one generation
batch `per_device_train_batch_size × processes × steps_per_generation` (steps_per_generation defaults to
gradient_accumulation_steps; `generation_batch_size`, when given, is that product), so with n = num_generations:
  mini_batch_prompts = B · P · GA / n,  prompts_per_step = B · P · steps_per_generation / n.
Rollout: `use_vllm` with `vllm_mode: colocate` shares the training GPUs (vllm_gpu_memory_utilization,
vllm_tensor_parallel_size); `vllm_mode: server` (and the older `vllm_device`) runs vLLM on the GPUs the
training processes leave free (`num_processes`, an accelerate setting recipe files such as open-r1's
carry); without vLLM TRL generates with the policy (HF generate). `beta > 0` loads the reference model.
Parameters are sharded like FSDP full sharding (the planner's TRL model, `ExecutorTraits`): a run under
DeepSpeed ZeRO-2 or DDP replicates parameters and needs more memory than planned — said in the notes.

Axolotl (`rl: grpo`) maps `base_model`, `micro_batch_size`, `gradient_accumulation_steps`,
`sequence_len` and its `trl:` section onto the same fields.
"""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen

# TRL defaults (trl 1.16 GRPOConfig; transformers TrainingArguments for the Trainer fields).
TRL_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 8,
    "max_prompt_length": 512,
    "max_completion_length": 256,
    "num_iterations": 1,
    "beta": 0.0,
    "use_vllm": False,
    "vllm_mode": "server",
    "vllm_gpu_memory_utilization": 0.3,
    "vllm_tensor_parallel_size": 1,
    "gradient_checkpointing": False,
    "ds3_gather_for_generation": True,
}


class TrlLaunch(Frozen):
    """What a TRL GRPO config sets, in the planner's terms."""

    model: str
    workload: dict[str, Any]
    knobs: dict[str, Any]
    notes: tuple[str, ...] = Field(default=())


def _zero3(deepspeed: Any) -> bool:
    """Whether a `deepspeed` setting names ZeRO stage 3 (a config name like 'zero3', a path to a
    zero3 json, or an inline dict with zero_optimization.stage 3)."""
    if isinstance(deepspeed, Mapping):
        stage = (deepspeed.get("zero_optimization") or {}).get("stage")
        return str(stage) == "3"
    return isinstance(deepspeed, str) and "zero3" in deepspeed.replace("_", "").replace("-", "").lower()


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{key}: {value!r} is not a positive integer.", "Fix the config.")
    return value


def _axolotl(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Axolotl's names for the GRPOConfig fields."""
    out = dict(cfg.get("trl") or {})
    renames = {
        "base_model": "model_name_or_path",
        "micro_batch_size": "per_device_train_batch_size",
        "gradient_accumulation_steps": "gradient_accumulation_steps",
        "gradient_checkpointing": "gradient_checkpointing",
    }
    for src, dst in renames.items():
        if src in cfg:
            out[dst] = cfg[src]
    if "sequence_len" in cfg and "max_prompt_length" not in out:
        out["max_prompt_length"] = cfg["sequence_len"]
    for key in ("fsdp", "fsdp_config", "deepspeed", "num_processes"):
        if key in cfg:
            out[key] = cfg[key]
    return out


def trl_launch(cfg: Mapping[str, Any], total_gpus: int, num_nodes: int = 1) -> TrlLaunch:
    """Map a GRPOConfig / Axolotl mapping on `total_gpus` GPUs over `num_nodes` nodes (see module docstring).

    vLLM server GPUs are planned as an equal share of every node (the planner's split layout); a whole
    node serving vLLM beside whole training nodes has the same per-GPU memory."""
    if not isinstance(cfg, Mapping):
        raise InputError("The TRL config is not a mapping of settings.", "Pass a GRPOConfig YAML file.")
    notes: list[str] = []
    if str(cfg.get("rl", "")).lower() == "grpo" or "base_model" in cfg:
        cfg = _axolotl(cfg)
        notes.append("read as an Axolotl GRPO config")

    def get(key: str) -> Any:
        value = cfg.get(key)
        return TRL_DEFAULTS.get(key) if value is None else value

    model = cfg.get("model_name_or_path")
    if not model:
        raise InputError("The config has no model_name_or_path (base_model for Axolotl).", "Add it, or pass --model.")
    micro = _int(get("per_device_train_batch_size"), "per_device_train_batch_size")
    accum = _int(get("gradient_accumulation_steps"), "gradient_accumulation_steps")
    n = _int(get("num_generations"), "num_generations")
    steps_per_generation = _int(cfg.get("steps_per_generation") or accum, "steps_per_generation")
    use_vllm = bool(get("use_vllm"))
    mode = str(cfg.get("vllm_mode") or ("server" if cfg.get("vllm_device") else TRL_DEFAULTS["vllm_mode"]))
    processes = cfg.get("num_processes")
    if processes is None:
        processes = total_gpus - 1 if (use_vllm and mode == "server") else total_gpus
    processes = _int(processes, "num_processes")
    if processes > total_gpus:
        raise InputError(f"num_processes={processes} exceeds the {total_gpus} GPUs of --gpus.", "Check --gpus.")
    rollout_gpus = total_gpus - processes
    if cfg.get("generation_batch_size") is not None:
        generation = _int(cfg["generation_batch_size"], "generation_batch_size")
        if generation % (micro * processes):
            raise InputError(
                f"generation_batch_size={generation} is not a multiple of per_device_train_batch_size × processes "
                f"= {micro * processes} (TRL requires it).",
                "Fix the batch settings.",
            )
        steps_per_generation = generation // (micro * processes)
    completions_per_step = micro * processes * accum
    if completions_per_step % n or (micro * processes * steps_per_generation) % n:
        raise InputError(
            f"per_device_train_batch_size × processes × gradient_accumulation_steps = {completions_per_step} "
            f"is not a multiple of num_generations={n} (TRL requires whole groups).",
            "Fix the batch settings.",
        )
    fsdp = cfg.get("fsdp")
    fsdp_cfg = cfg.get("fsdp_config") or {}
    offload = (isinstance(fsdp, str) and "offload" in fsdp) or bool(
        isinstance(fsdp_cfg, Mapping) and (fsdp_cfg.get("cpu_offload") or fsdp_cfg.get("offload_params"))
    )
    if cfg.get("deepspeed") or not fsdp:
        notes.append(
            "planned with FSDP full sharding (the planner's TRL model); DeepSpeed ZeRO-2 or DDP replicate "
            "parameters and need more memory than this plan shows"
        )
    knobs: dict[str, Any] = {
        "micro_batch_size_per_gpu": micro,
        "max_token_len_per_gpu": None,
        "log_prob_micro_batch_size_per_gpu": micro,  # TRL scores log-probs in per-device batches
        "gradient_checkpointing": bool(get("gradient_checkpointing")),
        "param_offload": offload,
        "optimizer_offload": offload,
        "ref_param_offload": False,
        "ulysses_sp": 1,
        "fused_logprob": False,
        "enforce_eager": False,
    }
    if not use_vllm:
        knobs.update(rollout_backend="hf", rollout_tp=1, placement="colocated")
        if _zero3(cfg.get("deepspeed")) and bool(get("ds3_gather_for_generation")):
            knobs["hf_generation_weights"] = "model"  # GatheredParameters around generate (TRL's default)
    elif mode == "colocate":
        knobs.update(
            rollout_backend="vllm",
            placement="colocated",
            rollout_tp=_int(get("vllm_tensor_parallel_size"), "vllm_tensor_parallel_size"),
            gpu_memory_utilization=float(get("vllm_gpu_memory_utilization")),
        )
    else:
        if rollout_gpus < 1:
            raise InputError(
                f"vLLM server mode needs GPUs besides the {processes} training processes; --gpus has {total_gpus}.",
                "Set num_processes below the GPU count, or use vllm_mode: colocate.",
            )
        if rollout_gpus % num_nodes:
            raise InputError(
                f"{rollout_gpus} vLLM GPUs do not divide evenly over {num_nodes} nodes.",
                "Set num_processes (--override num_processes=N) so the vLLM GPUs split evenly across nodes.",
            )
        util = cfg.get("vllm_gpu_memory_utilization")
        knobs.update(
            rollout_backend="vllm",
            placement="split",
            split_rollout_gpus_per_node=rollout_gpus // num_nodes,
            rollout_tp=1,
            gpu_memory_utilization=float(util if util is not None else 0.9),  # trl vllm-serve default
        )
        notes.append(f"vLLM server on {rollout_gpus} GPU(s), {processes} training processes")
    workload = {
        "prompts_per_step": micro * processes * steps_per_generation // n,
        "mini_batch_prompts": completions_per_step // n,
        "n": n,
        "prompt_len_tokens": _int(get("max_prompt_length"), "max_prompt_length"),
        "response_len_tokens": _int(get("max_completion_length"), "max_completion_length"),
        "use_kl_loss": float(get("beta") or 0.0) > 0.0,
        "ppo_epochs": _int(get("num_iterations"), "num_iterations"),
        "entropy_coeff": 0.0,
    }
    return TrlLaunch(model=str(model), workload=workload, knobs=knobs, notes=tuple(notes))


def read_trl(text: str, total_gpus: int, overrides: list[str] | None = None, num_nodes: int = 1) -> TrlLaunch:
    """Parse YAML text (PyYAML, imported here), apply `key=value` overrides (values read as YAML, e.g.
    `num_processes=8` for a config run on another launcher layout), and map it."""
    import yaml

    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"The TRL config is not valid YAML ({exc}).", "Pass a GRPOConfig YAML file.") from None
    cfg = dict(cfg or {}) if isinstance(cfg, dict) or cfg is None else cfg
    for word in overrides or []:
        key, sep, value = word.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--override '{word}' is not key=value.", "Write e.g. --override num_processes=8.")
        try:
            cfg[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            cfg[key.strip()] = value
    return trl_launch(cfg, total_gpus, num_nodes)
