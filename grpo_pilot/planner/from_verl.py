"""Read a verl launch script (or a list of Hydra overrides) into the planner's inputs (`--from-verl`).

The reverse of `export.verl_overrides`: `grpo-plan --from-verl run.sh` evaluates exactly the
configuration a verl user already has. The script is read as bash would run it with the arguments it is
given (`--script-args`, its `$1 $2 ...`; `shell_words.py` expands, nothing is run); the words after
`verl.trainer.main_ppo` (or any `*main_ppo` / `*main_dapo` entry point) that are Hydra overrides
(`key=value`, `+key=value`, `++key=value`, `~key`) are collected, later ones winning as in Hydra, then
extra overrides (`--override`, like the script's `$@`) on top. A file without such a command is read
as a plain list of overrides.

Keys not given take the defaults of the verl the launch was written for (`verl_versions.py`: its keys
date it, or `VERL_VERSION=<release or date>` pins it); where that cannot be told, today's defaults
(reference/verl-config.md) with a note naming the older default and the override that restores it.
Batch semantics follow verl's workers (`verl_batches.py`). Keys that do not change memory or time
(paths, logging, learning rate, clip ratios, ...) are read and ignored. The launch families are read by
`verl_families.py`: a critic (PPO: `algorithm.adv_estimator=gae` or `critic.enable`), the Megatron trainer
(`--config-name=ppo_megatron_trainer` or `actor.strategy=megatron`), LoRA (`model.lora_rank`, into
`Workload.adapter`), SGLang rollout, activation offload; what the planner cannot plan is refused by
planner/support.py when the plan is made. `actor_rollout_ref.model.override_config.*`
is returned (`hf_overrides`) for the caller to apply to the model's config.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, NamedTuple, Sequence

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.hardware.gpus import GPUSpec
from grpo_pilot.models import Frozen
from grpo_pilot.planner.adapters import AdapterSettings, show, verl_adapter
from grpo_pilot.planner.shell_words import read_script
from grpo_pilot.planner.verl_batches import BatchSettings, micro_batches
from grpo_pilot.planner.verl_engine_knobs import allocator_knobs, engine_max_num_seqs
from grpo_pilot.planner.verl_families import (
    FAMILY_DEFAULTS,
    critic_knob_values,
    critic_settings,
    family_knob_values,
    megatron_data_parallel_divisor,
    megatron_knob_values,
    needs_critic,
)
from grpo_pilot.planner.verl_versions import (
    BEFORE_V1_DEFAULT,
    CHANGES,
    VERSION_WORD,
    VLLM_VERSION_WORD,
    VerlWindow,
    change_named,
    init_offload_knobs,
    vllm_memory_of,
    window,
)

ARR = "actor_rollout_ref."
# verl's PPO entry point and the recipes built on it that take the same Hydra keys (recipe/dapo main_dapo)
LAUNCH_ENTRY_POINTS = ("main_ppo", "main_dapo")
# Hydra override grammar: key=value, +key=value (add), ++key=value (force), ~key or ~key=value (delete)
_OVERRIDE = re.compile(r"^(\+{0,2}|~)([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)+)(?:=(.*))?$", re.S)
MODEL_CONFIG_PREFIX = ARR + "model.override_config."


def _override(word: str) -> tuple[str, str, str | None] | None:
    """(prefix, key, value) of a Hydra override word, or None (a deletion may omit the value)."""
    match = _OVERRIDE.match(word)
    if not match or (match.group(3) is None and match.group(1) != "~"):
        return None
    return match.group(1), match.group(2), match.group(3)


# verl's defaults today for the keys the planner reads (reference/verl-config.md); older ones: verl_versions.
DEFAULTS: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    "algorithm.use_kl_in_reward": False,
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    ARR + "rollout.n": 1,
    ARR + "actor.strategy": "fsdp",
    ARR + "actor.ppo_mini_batch_size": 256,
    ARR + "actor.ppo_epochs": 1,
    ARR + "actor.use_kl_loss": False,
    ARR + "actor.entropy_coeff": 0.0,
    ARR + "actor.use_dynamic_bsz": False,
    ARR + "actor.ppo_max_token_len_per_gpu": 16384,
    ARR + "actor.ulysses_sequence_parallel_size": 1,
    ARR + "actor.fsdp_config.param_offload": False,
    ARR + "actor.fsdp_config.fsdp_size": -1,
    ARR + "actor.fsdp_config.optimizer_offload": False,
    ARR + "ref.fsdp_config.param_offload": False,
    ARR + "model.enable_gradient_checkpointing": True,
    ARR + "model.use_remove_padding": True,
    ARR + "model.use_fused_kernels": False,
    ARR + "model.lora_rank": 0,
    ARR + "rollout.name": "vllm",
    ARR + "rollout.tensor_model_parallel_size": 2,
    ARR + "rollout.gpu_memory_utilization": 0.5,
    ARR + "rollout.enforce_eager": False,
    ARR + "rollout.max_num_batched_tokens": 8192,
    ARR + "rollout.max_num_seqs": 1024,
    ARR + "hybrid_engine": True,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    **FAMILY_DEFAULTS,
}
MEGATRON_CONFIG = "megatron"  # --config-name=ppo_megatron_trainer: verl's Megatron trainer config


class VerlLaunch(Frozen):
    """What a verl launch configures, in the planner's terms."""

    model: str = Field(description="actor_rollout_ref.model.path as written (after variable expansion).")
    num_nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    workload: dict[str, Any] = Field(description="Workload fields.")
    knobs: dict[str, Any] = Field(description="Every Knobs field (the configuration is evaluated as given).")
    overrides: dict[str, str] = Field(description="The Hydra overrides read, key -> value as written.")
    remove_padding: bool = Field(
        default=True, description="model.use_remove_padding: False pads every row to the maxima (lengths ignored)."
    )
    hf_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="actor_rollout_ref.model.override_config (nested): HF config keys verl sets on the model.",
    )
    adapter: AdapterSettings | None = Field(default=None, description="model.lora_rank > 0: the LoRA settings.")
    notes: tuple[str, ...] = Field(default=(), description="Assumptions and ignored settings, for the user.")


class LaunchWords(NamedTuple):
    """The Hydra overrides of a launch, with what else the reading found."""

    overrides: dict[str, str]
    added: tuple[str, ...]  # keys given with a single `+` (absent from that verl's config)
    env: dict[str, str]  # the script's variables and the launch command's environment
    notes: list[str]
    config_name: str = ""  # --config-name (ppo_megatron_trainer: the Megatron trainer)


def parse_value(text: str) -> Any:
    """A Hydra override value: booleans, null, integers, floats (`inf`/`nan` too: checked per key), strings."""
    raw = text.strip()
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~", ""):
        return None
    if re.fullmatch(r"[+-]?[0-9]{1,18}", raw):
        return int(raw)
    try:
        return float(raw)
    except ValueError:
        return raw


def launch_words(
    text: str, environment: Mapping[str, str] | None = None, script_args: Sequence[str] = ()
) -> LaunchWords:
    """The overrides of a launch script (run with `script_args`) or of a plain list of overrides."""
    script = read_script(text, {"HOME": "$HOME", **(environment or {})}, script_args)
    notes: list[str] = list(script.notes)
    env = dict(script.variables)
    launch = next((c for c in script.commands if any(w.endswith(LAUNCH_ENTRY_POINTS) for w in c.words)), None)
    if launch is not None:
        env.update(launch.env)
        start = next(i for i, w in enumerate(launch.words) if w.endswith(LAUNCH_ENTRY_POINTS)) + 1
        words = list(launch.words[start:])
    else:
        words = [w for c in script.commands for w in c.words]
    overrides: dict[str, str] = {}
    added: set[str] = set()
    config_name = ""
    for word in words:
        if word.startswith("--config-name"):
            config_name = (word.split("=", 1)[1] if "=" in word else "").strip("'\"")
            continue
        parsed = _override(word)
        if parsed:
            _apply(overrides, added, parsed)
        elif word and launch is not None and not word.startswith("--config-path"):
            notes.append(f"ignored argument '{word[:80]}'")
    if not overrides:
        why = f" The script exits on line {script.exit_line} before its launch." if script.exit_line else ""
        raise InputError(
            "No verl overrides (key=value after verl.trainer.main_ppo) were found." + why,
            "Pass a verl launch script as published (with --script-args for the arguments it takes), or a file "
            "of Hydra overrides, one key=value per word or line.",
        )
    if script.unset:
        notes.append("unset variables expanded to nothing: " + ", ".join(script.unset[:20]))
    if script.substitutions:
        notes.append("command substitutions not run: " + ", ".join(script.substitutions[:10]))
    return LaunchWords(overrides, tuple(sorted(added)), env, notes, config_name)


def _fsdp_size(value: Any) -> int | None:
    """verl's fsdp_config.fsdp_size: -1 (its default) shards over every GPU; a positive size makes HSDP groups."""
    size = int(value)
    return None if size <= 0 else size


def _apply(overrides: dict[str, str], added: set[str], parsed: tuple[str, str, str | None]) -> None:
    """One override word (prefix, key, value) onto the overrides; `added` tracks keys given with a single +."""
    prefix, key, value = parsed
    if prefix == "~":
        overrides.pop(key, None)
        added.discard(key)
        return
    overrides[key] = value or ""
    if prefix == "+":
        added.add(key)
    else:
        added.discard(key)


class _Values:
    """Typed access to the launch's values; a bad value is an error naming its key."""

    def __init__(self, raw: dict[str, Any], defaults: dict[str, Any]) -> None:
        self.raw, self.defaults = raw, defaults

    def get(self, key: str) -> Any:
        value = self.raw.get(key)
        for _ in range(8):  # `${other.key}`: a Hydra interpolation of another key
            match = re.fullmatch(r"\$\{([A-Za-z0-9_.]+)\}", value) if isinstance(value, str) else None
            if not match:
                break
            value = self.raw.get(match.group(1), self.defaults.get(match.group(1)))
        return self.defaults.get(key) if value is None else value

    def integer(self, key: str, value: Any = None) -> int:
        value = self.get(key) if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{key}={show(value)} is not a positive integer.", "Fix the override or the script.")
        return value

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise InputError(f"{key}={show(value)} is not True or False.", "Fix the override or the script.")
        return value

    def number(self, key: str, *, low: float, high: float, low_open: bool = False) -> float:
        value = self.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value > high or value < low or (low_open and value == low):
            bound = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            raise InputError(
                f"{key}={show(value)} is not a finite number in {bound}.", "Fix the override or the script."
            )
        return float(value)


def _era_defaults(
    overrides: Mapping[str, str], win: VerlWindow, notes: list[str], *, critic: bool = False
) -> dict[str, Any]:
    """Today's defaults, with those that changed replaced by the launch's verl's (or a note where unknown);
    the critic's only for a launch that trains one."""
    defaults = dict(DEFAULTS)
    for change in CHANGES:
        if change.key is None or change.key in overrides or (change.key.startswith("critic.") and not critic):
            continue
        side = win.side(change)
        if side == "before":
            defaults[change.key] = change.before
            notes.append(
                f"{change.key.removeprefix(ARR)} = {change.before}: that verl's default ({change.source} changed it)"
            )
        elif side is None and (win.after is None or win.after < change.at):
            notes.append(
                f"{change.key.removeprefix(ARR)} planned at today's default {change.after}; verl before "
                f"{change.at[:10]} ({change.source}): {change.what} — if the launch's verl is older, pass "
                f"--override {change.key}={change.before} (or --override {VERSION_WORD}=<release or date>)"
            )
    return defaults


def _model_config(overrides: Mapping[str, str]) -> dict[str, Any]:
    """`actor_rollout_ref.model.override_config.a.b=v` words → {"a": {"b": v}} (values typed)."""
    config: dict[str, Any] = {}
    for key, text in overrides.items():
        if not key.startswith(MODEL_CONFIG_PREFIX):
            continue
        *parents, leaf = key[len(MODEL_CONFIG_PREFIX) :].split(".")
        node = config
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InputError(f"{key}: '{part}' is set both as a value and as a section.", "Fix the overrides.")
            node = child
        node[leaf] = _hydra_value(text)
    return config


def _hydra_value(text: str) -> Any:
    """A value, or Hydra's `{k: v, ...}` / `[a, b]` literals (one level deep is what override_config takes)."""
    raw = text.strip()
    if len(raw) > 2 and raw[0] + raw[-1] in ("{}", "[]"):
        parts = [p.strip() for p in raw[1:-1].split(",") if p.strip()]
        if raw[0] == "[":
            return [parse_value(p.strip("'\"")) for p in parts]
        pairs = [p.split(":", 1) for p in parts]
        if all(len(p) == 2 for p in pairs):
            return {k.strip().strip("'\""): parse_value(v.strip().strip("'\"")) for k, v in pairs}
    return parse_value(raw)


def verl_launch(
    overrides: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    *,
    added: Sequence[str] = (),
    version: str | None = None,
    model_fallback: str | None = None,
    config_name: str = "",
    gpu: GPUSpec | None = None,
) -> VerlLaunch:
    """Map verl keys (the launch's verl's defaults for the rest) to planner inputs; see the module docstring.

    `added`: keys given with `+`; `version`: a VERL_VERSION pin; `model_fallback`: the model to plan when the
    launch leaves model.path empty (`--model`); `config_name`: the launch's --config-name (the Megatron
    trainer's makes actor.strategy megatron)."""
    env = dict(env or {})
    notes: list[str] = []
    win = window([k for k in overrides if k not in added], added, version)
    raw = {k: parse_value(t) for k, t in overrides.items()}
    defaults = _era_defaults(overrides, win, notes, critic=needs_critic(_Values(raw, DEFAULTS)))
    if MEGATRON_CONFIG in config_name:
        defaults[ARR + "actor.strategy"] = "megatron"
    v = _Values(raw, defaults)
    adapter = _adapter(v)
    model = _model_path(v, model_fallback, notes)
    nnodes, per_node = v.integer("trainer.nnodes"), v.integer("trainer.n_gpus_per_node")
    megatron = str(v.get(ARR + "actor.strategy")) == "megatron"
    divisor = megatron_data_parallel_divisor(v) if megatron else None
    batches = micro_batches(_batch_settings(v, nnodes * per_node, divisor), win, notes)
    knobs = {**_knobs(v, env, batches, notes), **allocator_knobs(env, win, notes, megatron=megatron)}
    installed = str(env.get(VLLM_VERSION_WORD, "")).strip()
    knobs["max_num_seqs"] = engine_max_num_seqs(knobs, win, notes, installed=installed, gpu=gpu)
    knobs["vllm_memory"] = vllm_memory_of(knobs, env, win, notes)
    # verl before 25b0f2262 (#1100): dp_actor._forward_micro_batch computes the entropy in every pass
    knobs["entropy_every_pass"] = win.side(change_named("entropy")) == "before"
    knobs.update(_family_knobs(v, megatron, adapter is not None, notes))
    use_kl = v.flag(ARR + "actor.use_kl_loss") or v.flag("algorithm.use_kl_in_reward")  # a reference model exists
    if not megatron:  # fsdp_workers' init (megatron_workers builds its own)
        knobs.update(init_offload_knobs(knobs, win, notes, has_ref=use_kl))
    workload = {
        "prompts_per_step": batches.prompts_per_step,
        "mini_batch_prompts": batches.mini_batch_prompts,
        "n": batches.n,
        "prompt_len_tokens": v.integer("data.max_prompt_length"),
        "response_len_tokens": v.integer("data.max_response_length"),
        "use_kl_loss": use_kl,  # the reference model exists for the KL loss and for KL in the reward
        "ppo_epochs": v.integer(ARR + "actor.ppo_epochs"),
        "entropy_coeff": _entropy(v, win, notes),
        "adapter": adapter,
        **_critic_workload(v, nnodes * per_node // (divisor or batches.sp), batches.dynamic, notes),
    }
    remove_padding = v.flag(ARR + "model.use_remove_padding")
    if not remove_padding:
        notes.append(
            "use_remove_padding=False: verl pads every row to max prompt + max response (planned at the maxima)"
        )
    if win.reasons:
        notes.insert(0, "read as " + win.describe())
    return VerlLaunch(
        model=str(model),
        num_nodes=nnodes,
        gpus_per_node=per_node,
        workload=workload,
        knobs=knobs,
        overrides=dict(overrides),
        remove_padding=remove_padding,
        hf_overrides=_model_config(overrides),
        adapter=adapter,
        notes=tuple(notes),
    )


def _model_path(v: _Values, model_fallback: str | None, notes: list[str]) -> str:
    model = v.raw.get(ARR + "model.path")
    if model:
        return str(model)
    if not model_fallback:
        raise InputError(
            "actor_rollout_ref.model.path is not set (an unset variable in the script?).",
            "Add the override (or set the variable, e.g. --override BASE_MODEL=Qwen/Qwen2.5-3B), or pass --model.",
        )
    notes.append(f"actor_rollout_ref.model.path is not set in the launch: --model {model_fallback} is planned")
    return model_fallback


def _critic_workload(v: _Values, dp: int, actor_dynamic: bool, notes: list[str]) -> dict[str, Any]:
    """PPO: the algorithm and the critic's settings (verl_families.py); nothing for a critic-free estimator."""
    if not needs_critic(v):
        return {}
    critic = critic_settings(v, dp=max(1, dp), actor_dynamic=actor_dynamic, notes=notes)
    return {"algorithm": "ppo", "critic": critic}


def _family_knobs(v: _Values, megatron: bool, has_adapter: bool, notes: list[str]) -> dict[str, Any]:
    """The knobs of the Megatron backend, activation offload, LoRA's sync and the critic's offloads."""
    strategy = str(v.get(ARR + "actor.strategy"))
    knobs = family_knob_values(v, strategy=strategy, has_adapter=has_adapter, notes=notes)
    if megatron:
        knobs.update(megatron_knob_values(v, notes), ulysses_sp=1, fsdp_size=None)
    if needs_critic(v):
        knobs.update(critic_knob_values(v))
    return knobs


def _adapter(v: _Values) -> AdapterSettings | None:
    """`model.lora_rank` (FSDP), or `model.lora.rank` (Megatron-Bridge LoRA) when given."""
    if v.raw.get(ARR + "model.lora.rank"):
        rank = v.integer(ARR + "model.lora.rank")
        return verl_adapter(rank, v.raw.get(ARR + "model.lora.alpha"), v.raw.get(ARR + "model.lora.target_modules"))
    if not v.get(ARR + "model.lora_rank"):
        return None
    rank = v.integer(ARR + "model.lora_rank")
    return verl_adapter(rank, v.raw.get(ARR + "model.lora_alpha"), v.raw.get(ARR + "model.target_modules"))


def _entropy(v: _Values, win: VerlWindow, notes: list[str]) -> float:
    key = ARR + "actor.entropy_coeff"
    coeff = v.number(key, low=0.0, high=1e6) if v.get(key) is not None else 0.0
    entropy_change = change_named("entropy")
    if coeff == 0.0 and win.side(entropy_change) == "before":
        notes.append(
            "entropy_coeff=0, but this verl computes the entropy in every update anyway "
            f"(before {entropy_change.source}): planned with its gradient (entropy_every_pass)"
        )
    return coeff


def _batch_settings(v: _Values, world: int, megatron_divisor: int | None = None) -> BatchSettings:
    """The batch keys as written, typed (verl_batches.py applies the version's semantics). Under Megatron a
    data-parallel rank spans TP × PP × CP GPUs (`megatron_divisor`), the divisor of verl's global keys."""

    def optional(key: str) -> int | None:
        return None if v.raw.get(key) is None else v.integer(key, v.raw[key])

    lp = {p: ARR + p + "." for p in ("rollout", "ref")}
    return BatchSettings(
        world=world,
        sp=megatron_divisor or v.integer(ARR + "actor.ulysses_sequence_parallel_size"),
        prompts_per_step=v.integer("data.train_batch_size"),
        mini_batch_prompts=v.integer(ARR + "actor.ppo_mini_batch_size"),
        n=v.integer(ARR + "rollout.n"),
        dynamic=v.flag(ARR + "actor.use_dynamic_bsz"),
        budget=v.integer(ARR + "actor.ppo_max_token_len_per_gpu"),
        micro_per_gpu=optional(ARR + "actor.ppo_micro_batch_size_per_gpu"),
        micro_global=optional(ARR + "actor.ppo_micro_batch_size"),
        lp_dynamic=tuple(
            v.flag(p + "log_prob_use_dynamic_bsz") if v.raw.get(p + "log_prob_use_dynamic_bsz") is not None else None
            for p in lp.values()
        ),
        lp_budget=tuple(optional(p + "log_prob_max_token_len_per_gpu") for p in lp.values()),
        lp_micro_per_gpu=tuple(optional(p + "log_prob_micro_batch_size_per_gpu") for p in lp.values()),
        lp_micro_global=tuple(optional(p + "log_prob_micro_batch_size") for p in lp.values()),
        agents=optional(ARR + "rollout.n_agent") or 1,  # Search-R1's group size (verl_batches.py)
    )


def _knobs(v: _Values, env: Mapping[str, str], batches: Any, notes: list[str]) -> dict[str, Any]:
    backend = str(v.get(ARR + "rollout.name"))
    if backend not in ("vllm", "sglang", "hf"):
        notes.append(f"rollout.name={backend[:40]} is modelled as vLLM (same colocated budget semantics assumed)")
        backend = "vllm"
    if v.get(ARR + "hybrid_engine") is False:
        notes.append("hybrid_engine=False is not modelled: planned as colocated")
    engine = "v1"
    if str(env.get("VLLM_USE_V1", "")) == "0" or str(env.get("VLLM_ATTENTION_BACKEND", "")).upper() == "XFORMERS":
        engine = "v0"
        notes.append("vLLM V0 engine (VLLM_USE_V1=0 or VLLM_ATTENTION_BACKEND=XFORMERS, which V1 does not support)")
    elif BEFORE_V1_DEFAULT.match(str(env.get(VLLM_VERSION_WORD, "")).strip()) and env.get("VLLM_USE_V1") != "1":
        engine = "v0"
        notes.append(f"vLLM V0 engine ({VLLM_VERSION_WORD}={env[VLLM_VERSION_WORD]}: V1 is the default from vLLM 0.8)")
    return {
        "rollout_tp": v.integer(ARR + "rollout.tensor_model_parallel_size"),
        "gpu_memory_utilization": v.number(ARR + "rollout.gpu_memory_utilization", low=0.0, high=1.0, low_open=True),
        "micro_batch_size_per_gpu": batches.micro,
        "max_token_len_per_gpu": batches.budget if batches.dynamic else None,
        "log_prob_max_token_len_per_gpu": batches.lp_budget,
        "log_prob_micro_batch_size_per_gpu": batches.lp_micro,
        "param_offload": v.flag(ARR + "actor.fsdp_config.param_offload"),
        "optimizer_offload": v.flag(ARR + "actor.fsdp_config.optimizer_offload"),
        "ref_param_offload": v.flag(ARR + "ref.fsdp_config.param_offload"),
        "gradient_checkpointing": v.flag(ARR + "model.enable_gradient_checkpointing"),
        "ulysses_sp": batches.sp,
        "fsdp_size": _fsdp_size(v.get(ARR + "actor.fsdp_config.fsdp_size")),
        "fused_logprob": v.flag(ARR + "model.use_fused_kernels"),
        "remove_padding": v.flag(ARR + "model.use_remove_padding"),
        "enforce_eager": v.flag(ARR + "rollout.enforce_eager"),
        "max_num_seqs": v.integer(ARR + "rollout.max_num_seqs"),
        "max_num_batched_tokens": v.integer(ARR + "rollout.max_num_batched_tokens"),
        "rollout_backend": backend,
        "vllm_engine": engine,
        "placement": "colocated",
        "split_rollout_gpus_per_node": 0,
    }


_ENV_WORD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def read_verl(
    text: str,
    extra_overrides: list[str] | None = None,
    *,
    script_args: Sequence[str] = (),
    model_fallback: str | None = None,
    gpu: GPUSpec | None = None,
) -> VerlLaunch:
    """`launch_words` (the script run with `script_args`) + `--override` words on top + `verl_launch`.

    An extra word without a dot, `NAME=value`, is an environment variable set before the script runs
    (e.g. `VLLM_USE_V1=0` for a run on vLLM < 0.8, whose only engine is V0); the script's own
    assignments and exports still win, as in bash. `VERL_VERSION=<release or date>` pins the verl;
    `VLLM_VERSION=<version>` names the installed vLLM (its engine and `vllm_memory`)."""
    words = [w.strip() for w in extra_overrides or []]
    environment = {m.group(1): m.group(2) for m in map(_ENV_WORD.match, words) if m}
    version = environment.pop(VERSION_WORD, None)
    read = launch_words(text, environment, script_args)
    overrides, added = dict(read.overrides), set(read.added)
    for word in words:
        if _ENV_WORD.match(word):
            continue
        parsed = _override(word)
        if not parsed:
            raise InputError(f"--override '{word[:80]}' is not key=value.", "Write e.g. --override trainer.nnodes=2.")
        _apply(overrides, added, parsed)
    launch = verl_launch(
        overrides,
        read.env,
        added=tuple(added),
        version=version,
        model_fallback=model_fallback,
        config_name=read.config_name,
        gpu=gpu,
    )
    return launch.model_copy(update={"notes": tuple(read.notes) + launch.notes})
