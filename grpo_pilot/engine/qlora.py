"""8-bit / 4-bit base weights through bitsandbytes (QLoRA): CUDA only, one training worker.

    check_quantized_run(adapter, device_type=, train_world=, offload=, shares_policy=)   refusals, before start
    quantization_config(adapter) -> transformers.BitsAndBytesConfig
    load_quantized(source, adapter, ...) -> the base loaded quantized on the current CUDA device, prepared

What it does: the base is loaded with transformers' `BitsAndBytesConfig` — 4-bit (`bnb_4bit_quant_type`
nf4 or fp4, `bnb_4bit_use_double_quant`, bf16 compute as in the QLoRA paper and TRL's
`get_quantization_config`) or LLM.int8 — and prepared with peft's `prepare_model_for_kbit_training`
(norms and the unquantized embeddings / head cast to fp32, inputs made to require grad, gradient
checkpointing as the plan says), the recipe peft documents for k-bit training; the adapters then go on
as for LoRA (engine/lora.py). A model without weights on disk (a random init of a config) is written to
a temporary directory first: bitsandbytes quantizes at `from_pretrained`.

What it refuses, and why:
- a CPU run: bitsandbytes' 8/4-bit layers run CUDA kernels; this engine's CPU path has none (the
  bitsandbytes CPU backend is a separate, partial build: not supported here);
- several training workers or offload: FSDP2's `fully_shard` chunks each parameter's storage, and a
  bitsandbytes `Params4bit` keeps its quantization state (absmax, code) beside the data, so a shard would
  not be dequantizable (FSDP-QLoRA needs FSDP1 with `bnb_4bit_quant_storage` set to the compute dtype);
- a rollout that does not generate on the trainer's module (vLLM, an hf replica on another worker): it
  would need the merged weights of a quantized base (dequantize + B·A per layer), which grpo-run does not
  implement.
Nothing here can run on this project's CPU machines: tests check the refusals and that the right
configuration and calls are built (with stand-ins for transformers' loader).
"""

from __future__ import annotations

import importlib.util
import tempfile
from typing import Any

from grpo_pilot.engine.model_factory import build_model, weights_directory
from grpo_pilot.errors import InputError
from grpo_pilot.planner.adapters import AdapterSettings

COMPUTE_DTYPE = "bfloat16"  # QLoRA paper (arXiv 2305.14314) §3; TRL get_quantization_config passes model dtype


def check_quantized_run(
    adapter: AdapterSettings, *, device_type: str, train_world: int, offload: bool, shares_policy: bool
) -> None:
    what = f"The plan loads the base in {adapter.base_quantization} ({adapter.describe()})"
    if device_type != "cuda":
        raise InputError(
            f"{what}, which needs bitsandbytes' CUDA kernels; this run is on the CPU, where grpo-run has no 8-bit "
            "or 4-bit base.",
            "Run on a CUDA GPU, or re-plan without base quantization (LoRA on a full-precision base runs on CPU).",
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise InputError(f"{what}, but bitsandbytes is not installed.", "pip install bitsandbytes (CUDA build).")
    if train_world > 1 or offload:
        raise InputError(
            f"{what} with {'offload' if offload else f'{train_world} training workers'}: FSDP2 cannot shard "
            "bitsandbytes' quantized weights (their quantization state lives beside the data).",
            "Plan QLoRA on one GPU without offload (--gpus 1x...), or drop base quantization to shard.",
        )
    if not shares_policy:
        raise InputError(
            f"{what}, and its rollout does not generate on the trainer's module (vLLM, or an hf replica): merged "
            "weights of a quantized base are not implemented.",
            "Use the hf rollout backend on one worker (--backend hf), or drop base quantization.",
        )


def quantization_config(adapter: AdapterSettings) -> Any:
    """transformers' `BitsAndBytesConfig` for the adapter's base quantization."""
    import torch
    from transformers import BitsAndBytesConfig

    if adapter.base_quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    if adapter.base_quantization != "4bit":
        raise ValueError(f"no base quantization in {adapter.describe()}")
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=adapter.quant_type or "nf4",  # trl ModelConfig.bnb_4bit_quant_type default
        bnb_4bit_use_double_quant=adapter.double_quant,
        bnb_4bit_compute_dtype=getattr(torch, COMPUTE_DTYPE),
    )


def is_quantized(model: Any) -> bool:
    """Whether transformers loaded `model` with a quantizer (bitsandbytes here)."""
    return getattr(model, "hf_quantizer", None) is not None


def load_quantized(
    source: str, adapter: AdapterSettings, *, seed: int, vocab_size: int | None, gradient_checkpointing: bool
) -> Any:
    """The base of `source` (model_factory's model reference) quantized on the current CUDA device, prepared
    for k-bit training (module docstring)."""
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    kwargs = dict(
        quantization_config=quantization_config(adapter),
        dtype=getattr(torch, COMPUTE_DTYPE),
        device_map={"": torch.cuda.current_device()},
    )
    directory = weights_directory(source)
    if directory is not None:
        model = AutoModelForCausalLM.from_pretrained(directory, **kwargs)
    else:
        with tempfile.TemporaryDirectory(prefix="grpo-pilot-qlora-") as tmp:
            build_model(source, seed=seed, vocab_size=vocab_size).save_pretrained(tmp)
            model = AutoModelForCausalLM.from_pretrained(tmp, **kwargs)
    return prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
