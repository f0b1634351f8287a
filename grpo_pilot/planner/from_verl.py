"""Read a verl launch script (or a list of Hydra overrides) into the planner's inputs (`--from-verl`).

The reverse of `export.verl_overrides`: `grpo-plan --from-verl run.sh` evaluates exactly the
configuration a verl user already has. The script is read as published (`shell_words.py` expands its
variables); the words after `verl.trainer.main_ppo` (or any `*main_ppo` / `*main_dapo` entry point) that look like Hydra
overrides (`key=value`, `+key=value`, `++key=value`) are collected, later ones winning as in Hydra, then
extra overrides (`--override`, like the script's `$@`) on top. A file without such a command is read
as a plain list of overrides.

Keys not given take verl's defaults (reference/verl-config.md, verl 0.9.x); defaults that changed
between verl versions (rollout.enforce_eager, model.enable_gradient_checkpointing, ...) are the current
ones, and an older run's values are passed as overrides. Keys that do not change memory or time
(paths, logging, learning rate, clip ratios, ...) are read and ignored; settings the planner does not
model (Megatron, LoRA, a critic) are errors that say so.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.planner.shell_words import read_script

ARR = "actor_rollout_ref."
# verl's PPO entry point and the recipes built on it that take the same Hydra keys (recipe/dapo main_dapo)
LAUNCH_ENTRY_POINTS = ("main_ppo", "main_dapo")
# Hydra override grammar: key=value, +key=value (add), ++key=value (force), ~key or ~key=value (delete)
_OVERRIDE = re.compile(r"^(\+{0,2}|~)([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)+)(?:=(.*))?$", re.S)


def _override(word: str) -> tuple[str, str, str | None] | None:
    """(prefix, key, value) of a Hydra override word, or None (a deletion may omit the value)."""
    match = _OVERRIDE.match(word)
    if not match or (match.group(3) is None and match.group(1) != "~"):
        return None
    return match.group(1), match.group(2), match.group(3)


# Advantage estimators without a critic (verl core_algos); `gae` trains a value model.
CRITIC_FREE = (
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "grpo_passk",
    "gpg",
)

# verl's defaults for the keys the planner reads (reference/verl-config.md).
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
}


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
    notes: tuple[str, ...] = Field(default=(), description="Assumptions and ignored settings, for the user.")


def parse_value(text: str) -> Any:
    """A Hydra override value: booleans, null, integers, floats, else the string."""
    raw = text.strip()
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~", ""):
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def overrides_from_text(text: str, environment: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict, list]:
    """(overrides, the script's variables and command environment, notes) of a launch script or override list."""
    script = read_script(text, {"HOME": "$HOME", **(environment or {})})
    notes: list[str] = []
    env = dict(script.variables)
    words: list[str] = []
    launch = next((c for c in script.commands if any(w.endswith(LAUNCH_ENTRY_POINTS) for w in c.words)), None)
    if launch is not None:
        env.update(launch.env)
        start = next(i for i, w in enumerate(launch.words) if w.endswith(LAUNCH_ENTRY_POINTS)) + 1
        words = list(launch.words[start:])
    else:
        words = [w for c in script.commands for w in c.words]
    overrides: dict[str, str] = {}
    for word in words:
        if not word:
            continue
        if word.startswith("--config-name"):
            name = word.split("=", 1)[1] if "=" in word else ""
            if "megatron" in name:
                raise InputError(
                    f"The script uses verl's Megatron trainer (--config-name={name}).",
                    "grpo-plan models verl's FSDP trainer; plan the FSDP equivalent instead.",
                )
            continue
        parsed = _override(word)
        if parsed:
            prefix, key, value = parsed
            if prefix == "~":
                overrides.pop(key, None)
            else:
                overrides[key] = value or ""
        elif launch is not None and not word.startswith("--config-path"):
            notes.append(f"ignored argument '{word}'")
    if not overrides:
        raise InputError(
            "No verl overrides (key=value after verl.trainer.main_ppo) were found.",
            "Pass a verl launch script as published, or a file of Hydra overrides, one key=value per word or line.",
        )
    if script.unset:
        notes.append("unset variables expanded to nothing: " + ", ".join(script.unset))
    if script.substitutions:
        notes.append("command substitutions not run: " + ", ".join(script.substitutions))
    return overrides, env, notes


def _fsdp_size(value: Any) -> int | None:
    """verl's fsdp_config.fsdp_size: -1 (its default) shards over every GPU; a positive size makes HSDP groups."""
    size = int(value)
    return None if size <= 0 else size


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{key}={value!r} is not a positive integer.", "Fix the override or the script variable.")
    return value


def verl_launch(overrides: Mapping[str, str], env: Mapping[str, str] | None = None) -> VerlLaunch:
    """Map verl keys (defaults for the rest) to planner inputs; see the module docstring."""
    env = dict(env or {})
    notes: list[str] = []
    raw = {k: parse_value(v) for k, v in overrides.items()}

    def get(key: str) -> Any:
        value = raw.get(key, DEFAULTS.get(key))
        return DEFAULTS.get(key) if value is None and key in DEFAULTS else value

    estimator = str(get("algorithm.adv_estimator"))
    if estimator not in CRITIC_FREE:
        raise InputError(
            f"algorithm.adv_estimator={estimator} trains a critic (PPO), which grpo-plan does not model.",
            "Plan a critic-free estimator (grpo, rloo, reinforce_plus_plus, ...); verl's default is gae.",
        )
    if str(get(ARR + "actor.strategy")) == "megatron":
        raise InputError("actor.strategy=megatron is not modelled.", "grpo-plan models verl's FSDP/FSDP2 trainer.")
    lora = get(ARR + "model.lora_rank") or 0
    if lora:
        raise InputError(
            f"model.lora_rank={lora}: LoRA training is not modelled (grpo-plan plans full fine-tuning).",
            "Plan the full fine-tune, or drop the LoRA settings.",
        )
    model = raw.get(ARR + "model.path")
    if not model:
        raise InputError("actor_rollout_ref.model.path is not set.", "Add the override, or pass --model.")

    nnodes = _positive_int(get("trainer.nnodes"), "trainer.nnodes")
    per_node = _positive_int(get("trainer.n_gpus_per_node"), "trainer.n_gpus_per_node")
    world = nnodes * per_node
    sp = _positive_int(get(ARR + "actor.ulysses_sequence_parallel_size"), "ulysses_sequence_parallel_size")
    dp = max(1, world // sp)

    def per_gpu(per_gpu_key: str, global_key: str) -> int | None:
        """verl normalises a deprecated global micro-batch by the data-parallel size (fsdp_workers)."""
        if raw.get(per_gpu_key) is not None:
            return _positive_int(raw[per_gpu_key], per_gpu_key)
        if raw.get(global_key) is not None:
            notes.append(
                f"{global_key} (global, deprecated) = {raw[global_key]}: {max(1, raw[global_key] // dp)} per GPU"
            )
            return max(1, _positive_int(raw[global_key], global_key) // dp)
        return None

    dynamic = bool(get(ARR + "actor.use_dynamic_bsz"))
    budget = _positive_int(get(ARR + "actor.ppo_max_token_len_per_gpu"), "ppo_max_token_len_per_gpu")
    micro = per_gpu(ARR + "actor.ppo_micro_batch_size_per_gpu", ARR + "actor.ppo_micro_batch_size")
    if not dynamic and micro is None:
        raise InputError(
            "Neither actor.ppo_micro_batch_size_per_gpu nor use_dynamic_bsz is set (verl refuses to start).",
            "Set one of them.",
        )

    # log-prob passes: the old-policy pass (rollout.*) and the reference pass (ref.*) share one knob here:
    # the larger micro-batch / budget of the two is kept (it sets the memory peak).
    lp_dynamic_keys = (ARR + "rollout.log_prob_use_dynamic_bsz", ARR + "ref.log_prob_use_dynamic_bsz")
    lp_dynamic = [bool(raw[k]) if raw.get(k) is not None else dynamic for k in lp_dynamic_keys]
    lp_budgets = [raw.get(p + "log_prob_max_token_len_per_gpu") or budget for p in (ARR + "rollout.", ARR + "ref.")]
    lp_micros = [
        per_gpu(p + "log_prob_micro_batch_size_per_gpu", p + "log_prob_micro_batch_size")
        for p in (ARR + "rollout.", ARR + "ref.")
    ]
    if any(lp_dynamic):
        lp_budget, lp_micro = max(b for b, d in zip(lp_budgets, lp_dynamic) if d), None
    else:
        given = [m for m in lp_micros if m is not None]
        if not given:
            raise InputError(
                "log_prob_micro_batch_size_per_gpu is not set for rollout/ref and dynamic batching is off "
                "(verl refuses to start).",
                "Set actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu (and ref's).",
            )
        lp_budget, lp_micro = budget, max(given)
        if len(set(given)) > 1:
            notes.append(f"rollout and ref log-prob micro-batches differ ({given}); the larger is planned")

    backend = str(get(ARR + "rollout.name"))
    if backend not in ("vllm", "hf"):
        notes.append(f"rollout.name={backend} is modelled as vLLM (same colocated budget semantics assumed)")
        backend = "vllm"
    if get(ARR + "hybrid_engine") is False:
        notes.append("hybrid_engine=False is not modelled: planned as colocated")
    engine = "v1"
    if str(env.get("VLLM_USE_V1", "")) == "0" or str(env.get("VLLM_ATTENTION_BACKEND", "")).upper() == "XFORMERS":
        engine = "v0"
        notes.append("vLLM V0 engine (VLLM_USE_V1=0 or VLLM_ATTENTION_BACKEND=XFORMERS, which V1 does not support)")

    knobs = {
        "rollout_tp": _positive_int(get(ARR + "rollout.tensor_model_parallel_size"), "tensor_model_parallel_size"),
        "gpu_memory_utilization": float(get(ARR + "rollout.gpu_memory_utilization")),
        "micro_batch_size_per_gpu": micro,
        "max_token_len_per_gpu": budget if dynamic else None,
        "log_prob_max_token_len_per_gpu": int(lp_budget),
        "log_prob_micro_batch_size_per_gpu": lp_micro,
        "param_offload": bool(get(ARR + "actor.fsdp_config.param_offload")),
        "optimizer_offload": bool(get(ARR + "actor.fsdp_config.optimizer_offload")),
        "ref_param_offload": bool(get(ARR + "ref.fsdp_config.param_offload")),
        "gradient_checkpointing": bool(get(ARR + "model.enable_gradient_checkpointing")),
        "ulysses_sp": sp,
        "fsdp_size": _fsdp_size(get(ARR + "actor.fsdp_config.fsdp_size")),
        "fused_logprob": bool(get(ARR + "model.use_fused_kernels")),
        "enforce_eager": bool(get(ARR + "rollout.enforce_eager")),
        "max_num_seqs": _positive_int(get(ARR + "rollout.max_num_seqs"), "max_num_seqs"),
        "max_num_batched_tokens": _positive_int(get(ARR + "rollout.max_num_batched_tokens"), "max_num_batched_tokens"),
        "rollout_backend": backend,
        "vllm_engine": engine,
        "placement": "colocated",
        "split_rollout_gpus_per_node": 0,
    }
    workload = {
        "prompts_per_step": _positive_int(get("data.train_batch_size"), "data.train_batch_size"),
        "mini_batch_prompts": _positive_int(get(ARR + "actor.ppo_mini_batch_size"), "ppo_mini_batch_size"),
        "n": _positive_int(get(ARR + "rollout.n"), "rollout.n"),
        "prompt_len_tokens": _positive_int(get("data.max_prompt_length"), "data.max_prompt_length"),
        "response_len_tokens": _positive_int(get("data.max_response_length"), "data.max_response_length"),
        # the reference model exists for the KL loss and for KL in the reward
        "use_kl_loss": bool(get(ARR + "actor.use_kl_loss")) or bool(get("algorithm.use_kl_in_reward")),
        "ppo_epochs": _positive_int(get(ARR + "actor.ppo_epochs"), "ppo_epochs"),
        "entropy_coeff": float(get(ARR + "actor.entropy_coeff") or 0.0),
    }
    remove_padding = bool(get(ARR + "model.use_remove_padding"))
    if not remove_padding:
        notes.append(
            "use_remove_padding=False: verl pads every row to max prompt + max response (planned at the maxima)"
        )
    return VerlLaunch(
        model=str(model),
        num_nodes=nnodes,
        gpus_per_node=per_node,
        workload=workload,
        knobs=knobs,
        overrides=dict(overrides),
        remove_padding=remove_padding,
        notes=tuple(notes),
    )


_ENV_WORD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def read_verl(text: str, extra_overrides: list[str] | None = None) -> VerlLaunch:
    """`overrides_from_text` + `--override` words on top + `verl_launch`.

    An extra word without a dot, `NAME=value`, is an environment variable set before the script runs
    (e.g. `VLLM_USE_V1=0` for a run on vLLM < 0.8, whose only engine is V0); the script's own
    assignments and exports still win, as in bash."""
    words = [w.strip() for w in extra_overrides or []]
    environment = {m.group(1): m.group(2) for m in map(_ENV_WORD.match, words) if m}
    overrides, env, notes = overrides_from_text(text, environment)
    for word in words:
        if _ENV_WORD.match(word):
            continue
        parsed = _override(word)
        if not parsed:
            raise InputError(f"--override '{word}' is not key=value.", "Write e.g. --override trainer.nnodes=2.")
        prefix, key, value = parsed
        if prefix == "~":
            overrides.pop(key, None)
        else:
            overrides[key] = value or ""
    launch = verl_launch(overrides, env)
    return launch.model_copy(update={"notes": tuple(notes) + launch.notes})
