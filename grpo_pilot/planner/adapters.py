"""Adapter (LoRA / QLoRA) settings a launch asks for, read into one structure for every framework.

A launch with adapters must never be planned as a full fine-tune (a QLoRA 7B run on a 16 GB T4 would show
142 GiB). The readers build an `AdapterSettings` from the keys below; it is `Workload.adapter`, the one home of
the adapter settings, which the planner models (memory/lora_plan.py) and our engine reads. Defaults are each
framework's own:
- TRL `ModelConfig` (trl 1.16 trl/trainer/model_config.py): `use_peft` (False), `lora_r` (16),
  `lora_alpha` (32), `lora_dropout` (0.05), `lora_target_modules` (None: peft's per-architecture
  default), `lora_modules_to_save`, `use_rslora`, `use_dora`, `load_in_4bit` / `load_in_8bit` (False),
  `bnb_4bit_quant_type` (nf4), `use_bnb_nested_quant` (False); `trl.trainer.utils.get_peft_config` /
  `get_quantization_config` turn them into peft's `LoraConfig` and a `BitsAndBytesConfig`. A `peft_config`
  mapping (LoraConfig's own names: r, lora_alpha, lora_dropout, target_modules) is read the same way.
- Axolotl: `adapter: lora | qlora`, `lora_r`, `lora_alpha`, `lora_dropout`, `lora_target_modules`,
  `lora_target_linear: true` (every linear layer), `load_in_4bit` / `load_in_8bit`.
- verl: `actor_rollout_ref.model.lora_rank` (0 = off), `lora_alpha` (16), `target_modules` (all-linear)
  (reference/verl-config.md).
"""

from __future__ import annotations

import math
import reprlib
from typing import Any, Literal, Mapping

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 60, 60


def show(value: Any) -> str:
    """A value for an error message, bounded whatever it is (a YAML alias bomb has a huge repr)."""
    return _SHORT.repr(value)


class AdapterSettings(Frozen):
    """What a launch asks of adapters. `keys` names the settings as the launch wrote them."""

    framework: Literal["trl", "axolotl", "verl", "grpo-pilot"] = Field(
        description="Whose settings these are: a launch's framework, or grpo-plan's own --lora-* flags."
    )
    method: Literal["lora", "dora", "none"] = Field(description="none: a quantized base without adapters.")
    rank: int | None = Field(default=None, ge=1, description="LoRA rank r.")
    alpha: float | None = Field(default=None, description="LoRA alpha (scaling alpha / r, or / sqrt(r) with rslora).")
    dropout: float | None = Field(default=None, ge=0.0, le=1.0)
    target_modules: tuple[str, ...] | None = Field(
        default=None, description="Modules adapted ('all-linear' for every linear layer); None: the default."
    )
    modules_to_save: tuple[str, ...] = Field(default=(), description="Modules trained in full beside the adapters.")
    rslora: bool = False
    base_quantization: Literal["4bit", "8bit"] | None = Field(default=None, description="bitsandbytes base weights.")
    quant_type: str | None = Field(default=None, description="4-bit type (nf4, fp4).")
    double_quant: bool = False
    keys: tuple[str, ...] = Field(default=(), description="The launch's keys these come from.")

    def describe(self) -> str:
        parts = [self.method if self.method != "none" else "no adapters"]
        if self.rank is not None:
            parts.append(f"r={self.rank}")
        if self.base_quantization:
            parts.append(f"{self.base_quantization} base ({self.quant_type or 'bitsandbytes'})")
        if self.target_modules:
            parts.append("targets " + ",".join(self.target_modules)[:80])
        return ", ".join(parts)


def _bool(cfg: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(f"{key}: {show(value)} is not true or false.", "Fix the config.")
    return value


def _int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{key}: {show(value)} is not a positive integer.", "Fix the config.")
    return value


def _float(cfg: Mapping[str, Any], key: str) -> float | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{key}: {show(value)} is not a finite number >= 0.", "Fix the config.")
    return float(value)


def _modules(cfg: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise InputError(f"{key}: {show(value)} is not a module name or a list of them.", "Fix the config.")
    return tuple(value)


def trl_adapter(cfg: Mapping[str, Any], axolotl: bool = False) -> AdapterSettings | None:
    """The adapter settings of a TRL (or Axolotl, renamed by the caller's `_axolotl`) config, or None."""
    peft = cfg.get("peft_config")
    if peft is not None and not isinstance(peft, Mapping):
        raise InputError(f"peft_config: {show(peft)} is not a mapping of LoraConfig settings.", "Fix the config.")
    adapter = cfg.get("adapter") if axolotl else None
    if adapter is not None and adapter not in ("lora", "qlora"):
        raise InputError(f"adapter: {show(adapter)} is not lora or qlora.", "Fix the config.")
    use_peft = _bool(cfg, "use_peft") or peft is not None or adapter is not None
    four, eight = _bool(cfg, "load_in_4bit") or adapter == "qlora", _bool(cfg, "load_in_8bit")
    if not (use_peft or four or eight):
        return None
    source = dict(peft or {})
    names = {
        "rank": ("lora_r", "r"),
        "alpha": ("lora_alpha", "lora_alpha"),
        "dropout": ("lora_dropout", "lora_dropout"),
    }
    names["targets"] = ("lora_target_modules", "target_modules")
    picked = {k: (source if v[1] in source else cfg, v[1] if v[1] in source else v[0]) for k, v in names.items()}
    targets = _modules(*picked["targets"])
    if axolotl and _bool(cfg, "lora_target_linear"):
        targets = ("all-linear",)
    keys = [k for k in ("use_peft", "peft_config", "adapter", "load_in_4bit", "load_in_8bit") if cfg.get(k)]
    keys += [k for k in ("lora_r", "lora_alpha", "lora_target_modules", "lora_target_linear") if k in cfg]
    return AdapterSettings(
        framework="axolotl" if axolotl else "trl",
        method=("dora" if _bool(cfg, "use_dora") else "lora") if use_peft else "none",
        rank=_int(*picked["rank"]) or (16 if not axolotl else None),  # trl ModelConfig.lora_r default
        alpha=_float(*picked["alpha"]) or (32.0 if not axolotl else None),  # trl ModelConfig.lora_alpha default
        dropout=_float(*picked["dropout"]),
        target_modules=targets,
        modules_to_save=_modules(cfg, "lora_modules_to_save") or (),
        rslora=_bool(cfg, "use_rslora"),
        base_quantization="4bit" if four else ("8bit" if eight else None),
        quant_type=str(cfg.get("bnb_4bit_quant_type") or "nf4") if four else None,
        double_quant=_bool(cfg, "use_bnb_nested_quant") if four else False,
        keys=tuple(keys),
    )


def verl_adapter(rank: int, alpha: Any, targets: Any) -> AdapterSettings:
    """verl's `model.lora_rank` / `lora_alpha` / `target_modules`."""
    cfg = {"lora_alpha": alpha, "target_modules": targets}
    return AdapterSettings(
        framework="verl",
        method="lora",
        rank=rank,
        alpha=_float(cfg, "lora_alpha") or 16.0,  # verl model.lora_alpha default
        target_modules=_modules(cfg, "target_modules") or ("all-linear",),  # verl model.target_modules default
        keys=(f"model.lora_rank={rank}",),
    )


# Item names by which a plan's memory model shows it counted adapters (docs/families.md §6: adapter states, the
# frozen base): until the planner's LoRA model is wired into the estimate, a plan with workload.adapter carries
# full-fine-tuning items only (actor_params, actor_grads, optimizer_states, ref_params).
ADAPTER_ITEM_MARKERS = ("adapter", "lora", "frozen_base")


def adapters_modelled(plan: Any) -> bool:
    """Whether a plan's memory items model adapters (`ADAPTER_ITEM_MARKERS` in an item name of some phase)."""
    return any(m in item for phase in plan.phases.values() for item in phase.items for m in ADAPTER_ITEM_MARKERS)


def flag_adapter(
    rank: int, *, alpha: float | None = None, targets: str = "all-linear", base_bits: str | None = None
) -> AdapterSettings:
    """grpo-plan's `--lora-rank R [--lora-alpha A] [--lora-targets all-linear|q_proj,v_proj] [--quantize-base B]`.

    Unset alpha keeps peft's `LoraConfig.lora_alpha` default (8; peft 0.21 tuners/lora/config.py); targets default to
    every linear layer but the head (verl's `model.target_modules` default, all-linear). A 4-bit base is NF4 with
    double quantization (the QLoRA paper's recipe, arXiv 2305.14314 §3)."""
    names = tuple(t.strip() for t in targets.split(",") if t.strip())
    if not names:
        raise InputError(f"--lora-targets '{targets}' names no module.", "e.g. all-linear or q_proj,v_proj.")
    if base_bits not in (None, "4bit", "8bit"):
        raise InputError(f"--quantize-base '{base_bits}' is not 4bit or 8bit.", "Use 4bit (NF4) or 8bit (LLM.int8).")
    keys = [f"--lora-rank={rank}"] + ([f"--lora-alpha={alpha:g}"] if alpha is not None else [])
    keys += [f"--lora-targets={','.join(names)}"] + ([f"--quantize-base={base_bits}"] if base_bits else [])
    return AdapterSettings(
        framework="grpo-pilot",
        method="lora",
        rank=rank,
        alpha=alpha,
        target_modules=names,
        base_quantization=base_bits,  # type: ignore[arg-type]
        quant_type="nf4" if base_bits == "4bit" else None,
        double_quant=base_bits == "4bit",
        keys=tuple(keys),
    )
