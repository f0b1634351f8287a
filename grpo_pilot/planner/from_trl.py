"""Read a TRL `GRPOConfig` YAML (or an Axolotl GRPO config) into the planner's inputs (`--from-trl`).

TRL counts completions, not prompts (trl 1.16 `GRPOConfig`): one optimizer step takes
`per_device_train_batch_size × processes × gradient_accumulation_steps` completions, one generation
batch `per_device_train_batch_size × processes × steps_per_generation` (steps_per_generation defaults to
gradient_accumulation_steps; `generation_batch_size`, when given, is that product), so with n = num_generations:
  mini_batch_prompts = B · P · GA / n,  prompts_per_step = B · P · steps_per_generation / n.
Rollout: `use_vllm` with `vllm_mode: colocate` shares the training GPUs (vllm_gpu_memory_utilization,
vllm_tensor_parallel_size); `vllm_mode: server` runs vLLM on the GPUs the training processes leave free
(`num_processes`, an accelerate setting recipe files such as open-r1's carry); without vLLM TRL generates with
the policy (HF generate). `beta > 0` loads the reference model.
The older `vllm_device` (TRL <= 0.15, removed in 0.16.0 with server mode) puts one vLLM engine inside the main
training process on one device (trl v0.15.0 grpo_trainer.py lines 374-391): `auto` is cuda:0 when a single GPU
is visible ("share it") and otherwise the first GPU after the training processes, `cuda:{num_processes}`; a
device index of a training process shares that GPU with training, one past the visible GPUs is TRL's error.
A shared device is planned as colocated (vLLM beside the trainer, never released), a free one as the split layout;
its `vllm_gpu_memory_utilization` defaulted to 0.9 (v0.15.0 grpo_config.py lines 180-181).
Model states follow the launcher (`Knobs.state_sharding`, memory/zero.py): `fsdp:` or DeepSpeed ZeRO-3 shard every
state; `deepspeed:` ZeRO-1 / ZeRO-2 replicate the bf16 parameters and partition the optimizer states (and the
gradients); a YAML naming neither is DDP on several processes — `accelerate launch` without --config_file — so a
launch whose accelerate config comes on the command line (open-r1's `--config_file .../zero2.yaml`) needs
`--override deepspeed=zero2` (said in the notes). A `deepspeed:` name or mapping whose stage is not told is
planned as ZeRO-3.
The model's load dtype (`Knobs.model_dtype`: `model_init_kwargs` / `dtype` / `torch_dtype`, fp32 when unnamed; `auto`
resolved from the checkpoint) sets the element sizes each launcher holds: planner/trl_dtype.py reads it,
memory/precision.py `trl_precision` applies it.

Axolotl (`rl: grpo`) maps `base_model`, `micro_batch_size`, `gradient_accumulation_steps`,
`sequence_len` and its `trl:` section onto the same fields.

Batch rules are TRL's own (trl 1.16 trl/trainer/grpo_config.py `GRPOConfig.__post_init__` lines 1096-1141):
`generation_batch_size` must divide by `per_device_train_batch_size × processes` and by `num_generations`
(a group may span optimizer steps: an optimizer step need not hold whole groups), it and
`steps_per_generation` exclude each other, and `num_generations >= 2`. Adapter settings (`use_peft`,
`lora_*`, `load_in_4bit/8bit`, `peft_config`, Axolotl `adapter`) are read into `TrlLaunch.adapter`
(planner/adapters.py) and planned as `Workload.adapter` (memory/lora_plan.py). Every value is checked where it is read:
a bad one is an error naming its key (its text bounded, whatever the YAML holds).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.planner.adapters import AdapterSettings, show, trl_adapter
from grpo_pilot.planner.trl_dtype import launch_dtype, model_dtype_knob

MAX_YAML_DEPTH = 64  # nesting of a config's mappings and lists (a GRPOConfig YAML nests 2-3 levels)

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
}


class TrlLaunch(Frozen):
    """What a TRL GRPO config sets, in the planner's terms."""

    model: str
    workload: dict[str, Any]
    knobs: dict[str, Any]
    adapter: AdapterSettings | None = Field(default=None, description="LoRA / QLoRA settings (None: full FT).")
    zero_stage: int | None = Field(
        default=None, description="DeepSpeed ZeRO stage named by `deepspeed:` (None: no DeepSpeed, or not told)."
    )
    gather_for_generation: bool = Field(
        default=True,
        description="ds3_gather_for_generation (trl 1.16 grpo_config.py line 498, default True): under ZeRO-3 "
        "generation with the policy gathers the whole model on every GPU.",
    )
    model_dtype: str | None = Field(
        default=None,
        description="dtype / torch_dtype the model is loaded in as the launch names it ('auto': the checkpoint's, "
        "resolved with the model: planner/trl_dtype.py `checkpoint_model_dtype`); None: not named (fp32).",
    )
    notes: tuple[str, ...] = Field(default=())


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{key}: {show(value)} is not a positive integer.", "Fix the config.")
    return value


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{key}: {show(value)} is not true or false.", "Fix the config.")
    return value


def _number(value: Any, key: str, low: float, high: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high:
        raise InputError(f"{key}: {show(value)} is not a finite number in [{low:g}, {high:g}].", "Fix the config.")
    return float(value)


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
    for key in ("fsdp", "fsdp_config", "deepspeed", "num_processes", "adapter", "lora_r", "lora_alpha"):
        if key in cfg:
            out[key] = cfg[key]
    for key in ("lora_dropout", "lora_target_modules", "lora_target_linear", "load_in_4bit", "load_in_8bit"):
        if key in cfg:
            out[key] = cfg[key]
    out.setdefault("dtype", _axolotl_dtype(cfg))
    return out


def _axolotl_dtype(cfg: Mapping[str, Any]) -> str:
    """The dtype Axolotl loads the model in (axolotl-ai-cloud/axolotl@067b021c8 src/axolotl/utils/config/__init__.py
    L191-L196 `normalize_config`: bf16 / bfloat16 -> bfloat16, else load_in_8bit / fp16 / float16 -> float16, else
    float32; `bf16: auto` is bf16 where the GPU has it, else fp16 (L160-L167): 2 bytes either way; loaders/model.py
    L611-L612 passes it to from_pretrained)."""
    if cfg.get("bf16") in (True, "auto") or cfg.get("bfloat16"):
        return "bfloat16"
    if cfg.get("load_in_8bit") or cfg.get("fp16") or cfg.get("float16"):
        return "float16"
    return "float32"


def trl_launch(cfg: Mapping[str, Any], total_gpus: int, num_nodes: int = 1) -> TrlLaunch:
    """Map a GRPOConfig / Axolotl mapping on `total_gpus` GPUs over `num_nodes` nodes (see module docstring).

    vLLM server GPUs are planned as an equal share of every node (the planner's split layout); a whole
    node serving vLLM beside whole training nodes has the same per-GPU memory. A launch's adapters are
    read into `adapter` (and the workload)."""
    if not isinstance(cfg, Mapping):
        raise InputError("The TRL config is not a mapping of settings.", "Pass a GRPOConfig YAML file.")
    notes: list[str] = []
    axolotl = str(cfg.get("rl", "")).lower() == "grpo" or "base_model" in cfg
    if axolotl:
        cfg = _axolotl(cfg)
        notes.append("read as an Axolotl GRPO config")

    def get(key: str) -> Any:
        value = cfg.get(key)
        return TRL_DEFAULTS.get(key) if value is None else value

    model = cfg.get("model_name_or_path")
    if not model:
        raise InputError("The config has no model_name_or_path (base_model for Axolotl).", "Add it, or pass --model.")
    if not isinstance(model, str):
        raise InputError(f"model_name_or_path: {show(model)} is not a model name.", "Fix the config.")
    adapter = trl_adapter(cfg, axolotl)
    batch = _batches(cfg, get, total_gpus, notes)
    use_vllm, mode, processes, micro = batch["use_vllm"], batch["mode"], batch["processes"], batch["micro"]
    knobs = _trl_knobs(cfg, get, micro, notes)
    zero_stage, gather, offloads = _deepspeed(cfg, use_vllm, notes)
    knobs.update(offloads, state_sharding=_state_sharding(cfg, zero_stage, processes, notes))
    if knobs["state_sharding"] != "full" and adapter is not None:
        notes.append("LoRA under ZeRO-1/2 or DDP: the adapters' states planned replicated (approximate)")
    dtype = launch_dtype(cfg)
    knob_dtype = model_dtype_knob(dtype, zero_stage=zero_stage, state_sharding=knobs["state_sharding"], notes=notes)
    if knob_dtype is not None:
        knobs["model_dtype"] = knob_dtype
    if not use_vllm:
        knobs.update(rollout_backend="hf", rollout_tp=1, placement="colocated")
        if zero_stage == 3 and gather:
            knobs["hf_generation_weights"] = "model"  # GatheredParameters around generate (TRL's default)
    elif mode == "colocate":
        # TRL <= 0.15's in-process engine defaulted to 0.9 of its device (module docstring); colocate mode to 0.3
        util = cfg.get("vllm_gpu_memory_utilization", 0.9 if cfg.get("vllm_device") else None)
        knobs.update(
            rollout_backend="vllm",
            placement="colocated",
            rollout_tp=_int(get("vllm_tensor_parallel_size"), "vllm_tensor_parallel_size"),
            gpu_memory_utilization=_number(
                TRL_DEFAULTS["vllm_gpu_memory_utilization"] if util is None else util,
                "vllm_gpu_memory_utilization",
                0,
                1,
            ),
        )
    else:
        knobs.update(_server_knobs(cfg, total_gpus, processes, num_nodes))
        notes.append(f"vLLM server on {total_gpus - processes} GPU(s), {processes} training processes")
    workload = {
        "prompts_per_step": batch["prompts_per_step"],
        "mini_batch_prompts": batch["mini_batch_prompts"],
        "n": batch["n"],
        "prompt_len_tokens": _int(get("max_prompt_length"), "max_prompt_length"),
        "response_len_tokens": _int(get("max_completion_length"), "max_completion_length"),
        "use_kl_loss": _number(get("beta"), "beta", 0.0, 1e6) > 0.0,
        "ppo_epochs": _int(get("num_iterations"), "num_iterations"),
        "entropy_coeff": 0.0,
        "adapter": adapter,
    }
    return TrlLaunch(
        model=model,
        workload=workload,
        knobs=knobs,
        adapter=adapter,
        zero_stage=zero_stage,
        gather_for_generation=gather,
        model_dtype=dtype,
        notes=tuple(notes),
    )


# DeepSpeed ZeRO stage -> what the planner shards (memory/zero.py); stage 0 under bf16 is DeepSpeed's own
# data-parallel wrapper (bf16 weights, an fp32 master copy: engine.py DDP_BFLOAT16), planned as DDP
STAGE_SHARDING: dict[int, str] = {3: "full", 2: "zero2", 1: "zero1", 0: "ddp"}


def _state_sharding(cfg: Mapping[str, Any], zero_stage: int | None, processes: int, notes: list[str]) -> str:
    """`Knobs.state_sharding` from the launcher: the ZeRO stage told, ZeRO-3 (full) for a `deepspeed:` whose stage
    is not told (its note says so), else `_no_launcher`."""
    if zero_stage is not None:
        return STAGE_SHARDING[zero_stage]
    if _deepspeed_mapping(cfg):
        return "full"
    return _no_launcher(cfg, processes, notes)


def _no_launcher(cfg: Mapping[str, Any], processes: int, notes: list[str]) -> str:
    """A YAML without `deepspeed:` or `fsdp:`: `accelerate launch` without --config_file (or torchrun) wraps the
    policy in DDP on several processes (accelerate's default distributed type MULTI_GPU); one process is not
    wrapped. A launcher config given on the command line is not in the YAML: say so."""
    if cfg.get("fsdp"):
        return "full"
    if processes > 1:
        notes.append(
            "no deepspeed: / fsdp: key: planned as DDP, what `accelerate launch` without --config_file runs (every "
            "state replicated); a launch with --config_file zero2.yaml / zero3.yaml / fsdp.yaml needs "
            "--override deepspeed=zero2 (or zero3, zero1) or --override fsdp=full_shard"
        )
    return "ddp"


def _deepspeed_mapping(cfg: Mapping[str, Any]) -> Any:
    """`deepspeed:` as accelerate reads it (accelerate 1.15.0 utils/deepspeed.py `HfDeepSpeedConfig.__init__`
    L136-L157: a dict, a file path, or a JSON string, tried before base64): a JSON string becomes its mapping, a path
    stays a name (the file is the user's, not read). An accelerate config's `deepspeed_config:` section (the
    DeepSpeedPlugin fields, `zero_stage` / `offload_*_device`) stands in when the YAML carries one instead."""
    ds = cfg.get("deepspeed")
    if not ds and isinstance(cfg.get("deepspeed_config"), Mapping):
        return cfg["deepspeed_config"]
    if isinstance(ds, str) and ds.lstrip().startswith("{"):
        try:
            return json.loads(ds)
        except json.JSONDecodeError:
            raise InputError(
                f"deepspeed: {show(ds)} is neither a file name nor valid JSON.", "Fix the config."
            ) from None
    return ds


def _zero_stage(ds: Any) -> int | None:
    """The ZeRO stage a `deepspeed:` mapping (`zero_optimization.stage`, or DeepSpeedPlugin's `zero_stage`) or name
    (ms-swift's `zero3`, a file `ds_z3_config.json`) tells; None when it does not."""
    if isinstance(ds, Mapping):
        zero = ds.get("zero_optimization")
        stage = zero.get("stage") if isinstance(zero, Mapping) else ds.get("zero_stage")
        return stage if stage in (0, 1, 2, 3) else None
    if isinstance(ds, str):
        name = ds.lower().replace("_", "").replace("-", "")
        return next((k for k in (3, 2, 1) if f"zero{k}" in name or f"z{k}" in name or f"stage{k}" in name), None)
    return None


def _deepspeed(cfg: Mapping[str, Any], use_vllm: bool, notes: list[str]) -> tuple[int | None, bool, dict[str, bool]]:
    """(ZeRO stage, ds3_gather_for_generation, offload knobs) from `deepspeed:` (`_deepspeed_mapping`)."""
    ds = _deepspeed_mapping(cfg)
    gather = cfg.get("ds3_gather_for_generation", True)
    gather = _flag(gather, "ds3_gather_for_generation")
    if not ds:
        return None, gather, {}
    stage = _zero_stage(ds)
    if stage is None:
        notes.append(
            f"deepspeed: {show(ds)} — its ZeRO stage is not told by the name; planned as full sharding (ZeRO-3): "
            "--override deepspeed=zero2 (or zero1) plans the replicated parameters of a lower stage"
        )
    elif stage < 3:
        notes.append(
            f"DeepSpeed ZeRO-{stage} (bf16): parameters replicated in bf16 on every GPU, "
            + ("gradients and " if stage == 2 else "")
            + "the fp32 master copy and Adam moments partitioned, DeepSpeed's default 5e8-element reduce bucket "
            "(a reduce_bucket_size the config sets is not read)"
        )
    if stage == 3 and not use_vllm and gather:
        notes.append(
            "DeepSpeed ZeRO-3 with generation by the policy: TRL gathers the whole model on every GPU while "
            "generating (ds3_gather_for_generation, default true: trl/models/utils.py unwrap_model_for_generation) "
            "— not in this plan's rollout memory"
        )
    return stage, gather, _ds_offloads(ds, stage, notes)


OFFLOAD_DEVICES: frozenset[str] = frozenset({"none", "cpu", "nvme"})  # deepspeed runtime/zero/offload_config.py


def _offload_device(ds: Mapping[str, Any], section: str, plugin_key: str) -> str:
    """`zero_optimization.<section>.device`, else DeepSpeedPlugin's `<plugin_key>` (accelerate 1.15.0
    utils/dataclasses.py `offload_optimizer_device` / `offload_param_device`, mapped onto those sections at L1284);
    'none' when neither is set."""
    zero = ds.get("zero_optimization")
    sec = zero.get(section) if isinstance(zero, Mapping) else None
    value = sec.get("device") if isinstance(sec, Mapping) else None
    value = ds.get(plugin_key) if value is None else value
    device = "none" if value is None else str(value).lower()
    if device not in OFFLOAD_DEVICES:
        raise InputError(f"deepspeed {section}.device: {show(value)} is not none, cpu or nvme.", "Fix the config.")
    return device


def _ds_offloads(ds: Any, stage: int | None, notes: list[str]) -> dict[str, bool]:
    """The offload knobs DeepSpeed's offload sections set (memory/zero.py for ZeRO-1/2; ZeRO-3 in the note)."""
    if isinstance(ds, Mapping):
        devices = (
            _offload_device(ds, "offload_optimizer", "offload_optimizer_device"),
            _offload_device(ds, "offload_param", "offload_param_device"),
        )
        optimizer, param, nvme = devices[0] != "none", devices[1] != "none", "nvme" in devices
    else:  # a file name: its sections are not read, only a name that says offload
        optimizer = param = "offload" in str(ds).lower()
        nvme = False
        notes.append(
            f"deepspeed: {show(ds)} is a file the planner does not read ("
            + ("its name says offload: planned as offload_optimizer and offload_param to cpu" if optimizer else "")
            + ("; " if optimizer else "")
            + "to plan its offload sections pass them, e.g. --override 'deepspeed={zero_optimization: {stage: 3, "
            "offload_optimizer: {device: cpu}, offload_param: {device: cpu}}}')"
        )
    if not (optimizer or param):
        return {}
    if nvme:
        notes.append("DeepSpeed offload to nvme planned as cpu offload (the plan's host RAM counts what NVMe holds)")
    if stage in (0, 1, 2):
        if param:
            notes.append(f"offload_param is ZeRO-3's (DeepSpeed reads it only in stage 3): ignored under ZeRO-{stage}")
        if stage == 0 and optimizer:
            notes.append("offload_optimizer under ZeRO stage 0 is not modelled: ignored")
        return {"optimizer_offload": True} if optimizer and stage else {}
    return _zero3_offloads(optimizer=optimizer, param=param, notes=notes)


def _zero3_offloads(*, optimizer: bool, param: bool, notes: list[str]) -> dict[str, bool]:
    """ZeRO-3 offload in the planner's FSDP-offload terms (memory/host.py). DeepSpeed 0.19.6 stage3.py:
    offload_optimizer puts the fp32 master partition, the fp32 gradient partition (`grad_partitions_flat_buffer`
    on `self.device` = cpu, L740-L746) and DeepSpeedCPUAdam's moments on the host (L328, `_configure_offloading`
    L772-L777) — the states `param_offload` + `optimizer_offload` move for FSDP; offload_param only moves the bf16
    partitions (`param_groups_fp16_flat_cpu_memory` L857, else kept on the GPU L918), which the plan's ZeRO-3 does
    not count."""
    if not optimizer:
        notes.append(
            "DeepSpeed ZeRO-3 offload_param without offload_optimizer moves only the bf16 parameter partitions to "
            "the host, which the plan's sharded states do not count: planned without offload"
        )
        return {}
    notes.append(
        "DeepSpeed ZeRO-3 offload_optimizer planned as the FSDP offload of the fp32 master, gradient and Adam "
        "partitions (param_offload + optimizer_offload); approximate: the bf16 partitions (2 bytes per parameter "
        "over the ranks) are not counted, on the host with offload_param"
        + ("" if param else " and on the GPU without it")
        + ", and the offload traffic is planned as FSDP's (the fp32 shard streamed in every micro-batch)"
    )
    return {"param_offload": True, "optimizer_offload": True}


def _batches(cfg: Mapping[str, Any], get: Any, total_gpus: int, notes: list[str]) -> dict[str, Any]:
    """TRL's batch arithmetic (module docstring) in prompts."""
    micro = _int(get("per_device_train_batch_size"), "per_device_train_batch_size")
    accum = _int(get("gradient_accumulation_steps"), "gradient_accumulation_steps")
    n = _int(get("num_generations"), "num_generations")
    if n < 2:
        raise InputError("num_generations: 1 — GRPO needs at least 2 completions per prompt (TRL refuses).", "")
    use_vllm = _flag(get("use_vllm"), "use_vllm")
    legacy = cfg.get("vllm_mode") is None and cfg.get("vllm_device") is not None
    mode = cfg.get("vllm_mode") or TRL_DEFAULTS["vllm_mode"]
    if mode not in ("server", "colocate"):
        raise InputError(f"vllm_mode: {show(mode)} is neither server nor colocate.", "Fix the config.")
    processes = cfg.get("num_processes")
    if processes is None:  # the recipe's launcher leaves one GPU to vLLM (TRL <= 0.15 on one GPU: shares it)
        processes = (
            total_gpus - 1 if (use_vllm and mode == "server" and not (legacy and total_gpus == 1)) else total_gpus
        )
    processes = _int(processes, "num_processes")
    if processes > total_gpus:
        raise InputError(f"num_processes={processes} exceeds the {total_gpus} GPUs of --gpus.", "Check --gpus.")
    if use_vllm and legacy:
        mode = _legacy_vllm_device(cfg["vllm_device"], total_gpus, processes, notes)
    if cfg.get("generation_batch_size") is not None and cfg.get("steps_per_generation") is not None:
        raise InputError(
            "generation_batch_size and steps_per_generation are both set (TRL refuses: one sets the other).",
            "Keep one of them.",
        )
    steps_per_generation = _int(cfg.get("steps_per_generation") or accum, "steps_per_generation")
    if cfg.get("generation_batch_size") is not None:
        generation = _int(cfg["generation_batch_size"], "generation_batch_size")
        if generation % (micro * processes):
            raise InputError(
                f"generation_batch_size={generation} is not a multiple of per_device_train_batch_size × processes "
                f"= {micro * processes} (TRL requires it).",
                "Fix the batch settings.",
            )
        steps_per_generation = generation // (micro * processes)
    generation = micro * processes * steps_per_generation
    if generation % n:
        raise InputError(
            f"the generation batch (per_device_train_batch_size × processes × steps_per_generation = {generation}) "
            f"is not a multiple of num_generations={n} (TRL requires whole groups in it).",
            "Fix the batch settings.",
        )
    completions_per_step = micro * processes * accum
    mini = completions_per_step // n
    if completions_per_step % n:
        mini = max(1, mini)
        notes.append(
            f"an optimizer step takes {completions_per_step} completions, not whole groups of {n}: planned as "
            f"{mini} prompt(s) per optimizer step ({generation // completions_per_step or 1} optimizer steps per "
            "generation batch in TRL; the planner counts whole prompts)"
        )
    return {
        "micro": micro,
        "n": n,
        "use_vllm": use_vllm,
        "mode": mode,
        "processes": processes,
        "prompts_per_step": generation // n,
        "mini_batch_prompts": min(mini, generation // n),
    }


def _legacy_vllm_device(device: Any, total_gpus: int, processes: int, notes: list[str]) -> str:
    """Where TRL <= 0.15 puts its in-process vLLM engine (module docstring): "colocate" when the device is a
    training process's GPU, "server" (the split layout) when it is a free one; TRL's own error past the GPUs."""
    text = str(device).strip().lower()
    if text == "auto":
        index = 0 if total_gpus == 1 else processes
    else:
        kind, _, number = text.partition(":")
        if kind != "cuda" or not number.isdigit():
            raise InputError(f"vllm_device: {show(device)} is neither 'auto' nor 'cuda:N'.", "Fix the config.")
        index = int(number)
    if index >= total_gpus:
        raise InputError(
            f"vllm_device resolves to cuda:{index}, which --gpus ({total_gpus} GPUs) does not have: TRL refuses "
            "('The requested device for vllm ... is not available').",
            f"Set num_processes to {total_gpus - 1} (one GPU left to vLLM), or check --gpus.",
        )
    if index < processes:
        notes.append(
            f"vllm_device cuda:{index} is also a training GPU: TRL (<= 0.15) runs its vLLM engine there beside "
            "training, planned as colocated (only that GPU generates; the plan's rollout time assumes every GPU does)"
        )
        return "colocate"
    return "server"


def _trl_knobs(cfg: Mapping[str, Any], get: Any, micro: int, notes: list[str]) -> dict[str, Any]:
    fsdp = cfg.get("fsdp")
    fsdp_cfg = cfg.get("fsdp_config") or {}
    offload = (isinstance(fsdp, str) and "offload" in fsdp) or bool(
        isinstance(fsdp_cfg, Mapping) and (fsdp_cfg.get("cpu_offload") or fsdp_cfg.get("offload_params"))
    )
    return {
        "micro_batch_size_per_gpu": micro,
        "max_token_len_per_gpu": None,
        "log_prob_micro_batch_size_per_gpu": micro,  # TRL scores log-probs in per-device batches
        "gradient_checkpointing": _flag(get("gradient_checkpointing"), "gradient_checkpointing"),
        "param_offload": offload,
        "optimizer_offload": offload,
        "ref_param_offload": False,
        "ulysses_sp": 1,
        "fused_logprob": False,
        "enforce_eager": False,
        # PyTorch's default caching allocator: neither TRL nor Axolotl sets PYTORCH_CUDA_ALLOC_CONF (the launch's
        # environment, which the config does not carry: --pin allocator=expandable when it sets the segments), and
        # GRPOTrainer never empties the cache (trl@f2cd577: only the colocated vLLM's sleep mode does, before its
        # wake-ups, trl/generation/vllm_generation.py)
        "allocator": "default",
        "release_cache": "never",
    }


def _server_knobs(cfg: Mapping[str, Any], total_gpus: int, processes: int, num_nodes: int) -> dict[str, Any]:
    rollout_gpus = total_gpus - processes
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
    return {
        "rollout_backend": "vllm",
        "placement": "split",
        "split_rollout_gpus_per_node": rollout_gpus // num_nodes,
        "rollout_tp": 1,
        # trl vllm-serve's default when the config does not say
        "gpu_memory_utilization": 0.9 if util is None else _number(util, "vllm_gpu_memory_utilization", 0, 1),
    }


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of mappings and lists, counted up to `limit` + 1 (aliases are shared, so no blow-up)."""
    seen: set[int] = set()
    stack = [(value, 1)]
    deepest = 0
    while stack:
        node, level = stack.pop()
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        stack += [(child, level + 1) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def _load_yaml(text: str, what: str) -> Any:
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"The {what} is not valid YAML ({str(exc)[:300]}).", "Pass a GRPOConfig YAML file.") from None
    except RecursionError:
        raise InputError(f"The {what} nests deeper than any config (YAML recursion limit).", "Fix the file.") from None
    if _depth(value, MAX_YAML_DEPTH) > MAX_YAML_DEPTH:
        raise InputError(f"The {what} nests more than {MAX_YAML_DEPTH} levels deep.", "Fix the file.")
    return value


def read_trl(text: str, total_gpus: int, overrides: list[str] | None = None, num_nodes: int = 1) -> TrlLaunch:
    """Parse YAML text (PyYAML, imported here), apply `key=value` overrides (values read as YAML, e.g.
    `num_processes=8` for a config run on another launcher layout), and map it."""
    cfg = _load_yaml(text, "TRL config")
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise InputError(
            f"The TRL config is a YAML {type(cfg).__name__}, not a mapping of settings.", "Pass a GRPOConfig YAML file."
        )
    cfg = dict(cfg)
    for word in overrides or []:
        key, sep, value = word.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--override '{word[:80]}' is not key=value.", "Write e.g. --override num_processes=8.")
        try:
            cfg[key.strip()] = _load_yaml(value, f"--override {key.strip()[:40]} value")
        except InputError:
            cfg[key.strip()] = value
    return trl_launch(cfg, total_gpus, num_nodes)
