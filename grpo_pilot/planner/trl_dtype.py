"""The dtype a TRL launch loads its policy and reference in (`Knobs.model_dtype`, planned by memory/precision.py).

Where a GRPO launch says it: `model_init_kwargs` (a mapping, or the JSON string transformers' HfArgumentParser
takes) wins over the script's `ModelConfig.dtype` (`torch_dtype` before trl 0.24): trl 1.16 trl/scripts/grpo.py
L112-L119 builds `model_init_kwargs = dict(..., dtype=model_args.dtype)` and then `.update(training_args.
model_init_kwargs)`. TRL accepts 'bfloat16', 'float16', 'float32' and 'auto' (trl 1.16 trainer/utils.py
`create_model_from_path` L1332-L1341 raises on anything else).

When the launch names none, by version (huggingface/trl tags):
- trl >= 0.27 (to 1.16): float32 — `ModelConfig.dtype` defaults to "float32" (trainer/model_config.py) and
  `create_model_from_path` reads `kwargs.get("dtype", "float32")`; the GRPOTrainer docstring says it differs from
  transformers v5's own default ('auto').
- trl 0.26: `create_model_from_path` defaulted to 'auto', but `ModelConfig.dtype` defaulted to None and the
  script passed it, so a script launch still got `from_pretrained(dtype=None)`.
- trl <= 0.25: GRPOTrainer passed the key through (`torch_dtype` / `dtype`, default None) to `from_pretrained`,
  which loads fp32 under transformers 4 (the checkpoint's dtype only with "auto").
So a launch without a dtype is planned as fp32 (a note names the override), 'auto' as the checkpoint's
config `torch_dtype` / `dtype` (transformers `from_pretrained(dtype="auto")`; bf16 for every bundled model,
profiles/configs/*.json), fp32 where the config records none.

Under DeepSpeed ZeRO-3 transformers loads both models inside `deepspeed.zero.Init`, which partitions them in bf16
when bf16 is on (memory/precision.py): such a launch is planned with `model_dtype="bf16"` whatever it names.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from grpo_pilot.errors import InputError
from grpo_pilot.planner.adapters import show

# TRL's accepted names -> `Knobs.model_dtype` ("auto" resolves from the checkpoint: `checkpoint_model_dtype`)
TRL_DTYPES: dict[str, str] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
AUTO = "auto"


def _init_kwargs(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """`model_init_kwargs` as a mapping (GRPOConfig takes a dict or its JSON string)."""
    raw = cfg.get("model_init_kwargs")
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise InputError(f"model_init_kwargs: {show(raw)} is not a JSON mapping.", "Fix the config.") from None
    if not isinstance(raw, Mapping):
        raise InputError(f"model_init_kwargs: {show(raw)} is not a mapping.", "Fix the config.")
    return raw


def launch_dtype(cfg: Mapping[str, Any]) -> str | None:
    """The dtype name the launch loads the model in ('bfloat16', 'float16', 'float32', 'auto'), None if unnamed
    (module docstring: `model_init_kwargs` first, then `dtype` / `torch_dtype`)."""
    kwargs = _init_kwargs(cfg)
    for where, source in (("model_init_kwargs.", kwargs), ("", cfg)):
        for key in ("dtype", "torch_dtype"):
            value = source.get(key)
            if value is None:
                continue
            text = value.strip().lower().removeprefix("torch.") if isinstance(value, str) else None
            if text not in (*TRL_DTYPES, AUTO):
                raise InputError(
                    f"{where}{key}: {show(value)} is not a dtype TRL loads a model in "
                    "('bfloat16', 'float16', 'float32' or 'auto').",
                    "Fix the config.",
                )
            return text
    return None


def model_dtype_knob(name: str | None, *, zero_stage: int | None, state_sharding: str, notes: list[str]) -> str | None:
    """`Knobs.model_dtype` for the launch's dtype `name` (None: resolve 'auto' from the checkpoint,
    `checkpoint_model_dtype`), with a note saying what the launcher makes of it."""
    if zero_stage == 3:
        if name != "bfloat16":
            notes.append(
                "DeepSpeed ZeRO-3: transformers loads the policy and the reference inside deepspeed.zero.Init, which "
                "partitions them in bf16 (the optimizer keeps fp32 master partitions): planned as bf16"
            )
        return "bf16"
    if name == AUTO:
        return None
    if name is None:
        if state_sharding not in ("zero1", "zero2"):
            notes.append(
                "no dtype / torch_dtype: the model is loaded in fp32 (TRL's default since 0.27; older TRL passed None, "
                "fp32 under transformers 4) — --override dtype=bfloat16 if the launch loads it in bf16"
            )
        return "fp32"
    knob = TRL_DTYPES[name]
    if knob != "fp32":
        notes.append(_half_note(knob, state_sharding))
    return knob


def _half_note(knob: str, state_sharding: str) -> str:
    """What a 16-bit load becomes under the launcher (memory/precision.py)."""
    what = f"the model is loaded in {knob}" + (" (planned with bf16's 2-byte elements)" if knob == "fp16" else "")
    if state_sharding == "ddp":
        return (
            f"{what} and trained as loaded (DDP / one process: nothing upcasts it): parameters, gradients and AdamW "
            "moments 2 bytes each, no fp32 master copy; the reference in the same dtype"
        )
    if state_sharding == "full":
        return (
            f"{what}: accelerate's FSDP upcasts the trained parameters to fp32 (mixed precision on); "
            f"the reference stays {knob}"
        )
    return f"{what}; DeepSpeed holds bf16 weights with fp32 master and Adam partitions whatever the load dtype"


def checkpoint_model_dtype(checkpoint_dtype: str | None, *, state_sharding: str, notes: list[str]) -> str:
    """`Knobs.model_dtype` of `dtype: auto`: the checkpoint config's dtype (module docstring), fp32 without one."""
    name = str(checkpoint_dtype or "").strip().lower().removeprefix("torch.")
    if name not in TRL_DTYPES:
        notes.append("dtype auto: the model's config records no dtype; planned as fp32 (transformers reads weights)")
        return "fp32"
    knob = TRL_DTYPES[name]
    notes.append(f"dtype auto: the checkpoint's config records {name}")
    if knob != "fp32":
        notes.append(_half_note(knob, state_sharding))
    return knob
