"""LoRA / QLoRA training memory: a frozen (possibly quantized) base, trainable adapters only.

Adapters (peft `LoraConfig`, src/peft/tuners/lora/layer.py, huggingface/peft 5d602fdb): each targeted
linear (in → out) gains A (r × in) and B (out × r): r·(in + out) parameters; forward
`base(x) + B(A(dropout(x))) · alpha/r` (L1035–L1063). Target sets:
- verl `actor_rollout_ref.model.target_modules: all-linear` (its default) and peft's "all-linear"
  (tuners_utils.py `_maybe_include_all_linear_layers` L2382–L2440): every nn.Linear except the output
  embedding (lm_head): q, k, v, o, gate, up, down.
- peft's default when `target_modules` is None (utils/constants.py
  TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING L67–L105): q_proj, v_proj for llama, mistral, mixtral,
  qwen2, qwen3 (and most decoder LMs).
- Megatron-Bridge (verl `model.lora.target_modules`, docs/advance/ppo_lora.rst): fused linear_qkv,
  linear_proj, linear_fc1 (gate + up), linear_fc2 — one A per fused module (r × h for linear_qkv instead
  of three), B as wide as the fused output.

Frozen base (bitsandbytes 95f9af30, functional.py and autograd/_functions.py):
- 16/32-bit: every parameter at its storage width. verl's FSDP actor keeps the base in fp32
  (`model_dtype` defaults to fp32 for the actor, fsdp_workers.py; FSDP MixedPrecision gathers it in bf16)
  and shards it over the FSDP ranks; TRL loads fp32 unless `model_init_kwargs` sets a dtype.
- LLM.int8 (`load_in_8bit`, `Int8Params` → `int8_vectorwise_quant`, nn/modules.py L719–L760): int8
  weights (1 byte) + one fp32 scale per output row (SCB). Outliers (`llm_int8_threshold`, 6.0 in
  transformers) are handled on the activation side: columns above the threshold run in fp16
  (`int8_mixed_scaled_mm`); data-dependent and small, not counted.
- NF4/FP4 (`load_in_4bit`, `quantize_4bit` L884–L960): 4 bits per weight packed two per byte + one
  absmax per block of 64; fp32 absmax (0.5 bit/param), or with double quantization
  (`bnb_4bit_use_double_quant`, `compress_statistics`) uint8 absmax + an fp32 absmax per 256 blocks and
  an fp32 offset: 8/64 + 32/(64·256) = 0.127 bit/param — QLoRA (Dettmers et al. 2023, arXiv 2305.14314,
  §3 "Double Quantization"). Each tensor also carries its 16-entry fp32 code.
- Quantization covers the decoder layers' linears only: transformers' bitsandbytes integration skips
  the output embedding (`get_keys_to_not_convert`), and nn.Embedding / norms are not Linear. Those stay
  at `unquantized_bytes`: the load dtype (bf16 in Axolotl, which casts norms/embeddings back to
  torch_dtype after `prepare_model_for_kbit_training`), or fp32 after peft's
  `prepare_model_for_kbit_training` alone ("cast all non INT8 parameters to fp32", peft utils/other.py
  L197–L208). TRL 1.16's GRPOTrainer does not call it (grpo_trainer.py L432–L541).

Adapter states: params, grads and Adam (exp_avg, exp_avg_sq in the parameter dtype, torch.optim.AdamW)
for the adapters only. Dtype: fp32 in verl (the actor is fp32); fp32 in TRL for a 16-bit base (peft's
`autocast_adapter_dtype=True` upcasts adapters) and bf16 for a quantized base (TRL casts adapters to
bf16 "following the QLoRA paper", grpo_trainer.py L530–L541).

Activations (verified on CPU with saved-tensor hooks on a tiny Qwen2, fp32, one LoRA per linear; the
script is described in docs/families.md): relative to a full fine-tune of the same layers
- + c·r per token per adapted module: A's output, saved by B (exactly 4·Δr bytes per module per token
  when r changes);
- + (c + 1)·in per token per adapted module with lora_dropout > 0: the dropout output (saved by A) and
  its bool mask (CUDA `native_dropout`; on cpu the bernoulli noise is saved in the compute dtype, 2c);
- − c·h twice per layer and twice at the head: a frozen norm weight and a frozen lm_head need not save
  their inputs (autograd saves an operand only when the other operand needs a gradient);
- − c·q when o_proj is not adapted and − c·I when down_proj is not adapted (their inputs are saved only
  by the adapter's A). Other frozen inputs may also go unsaved; not counted (an upper bound).
Dequantization transient (bitsandbytes `MatMul4Bit`: the dequant + F.linear path for more than 512 rows,
backends/cuda/ops.py `_gemm_4bit_use_custom_cuda`; backward dequantizes again; `MatMul8bitLt.backward`
builds `CB.to(dtype_A) · SCB / 127`): one linear's weight in the compute dtype at a time, c·in·out for
the largest quantized matrix. The int8 forward also casts the input to fp16 and quantizes it (2 + 1
bytes per input element, one linear at a time).

Reference model: none. verl sets `ref_in_actor = lora_rank > 0` (trainer/ppo/ray_trainer.py L298–L302)
and computes reference log-probs with `actor_module.disable_adapter()` (fsdp_workers.py L990–L1044);
TRL uses `ref_model = None` for a PEFT model and disables the adapter — or, when handed a PeftModel with
a pretrained adapter and beta ≠ 0, adds a frozen "ref" adapter copy (grpo_trainer.py L478–L506): one more
set of adapter weights.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.errors import InputError
from grpo_pilot.planner.memory.shape import TransformerShape
from grpo_pilot.units import FP32_BYTES

LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
# peft TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (utils/constants.py, 5d602fdb L67–L105)
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
}
# Megatron-Bridge fused modules (verl docs/advance/ppo_lora.rst) → the HF linears each one fuses
MEGATRON_FUSED_MODULES: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
NF4_BLOCK = 64  # quantize_4bit default blocksize
NF4_NESTED_BLOCK = 256  # double quantization: quantize_blockwise(absmax, blocksize=256)
NF4_CODE_BYTES = 16 * FP32_BYTES  # the 16-entry fp32 code each QuantState holds
BASE_BITS = (32, 16, 8, 4)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def linear_dims(shape: TransformerShape) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear of one decoder layer (Llama/Qwen naming)."""
    h, q, kv, f = shape.hidden, shape.q_dim, shape.kv_dim, shape.ffn
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, f),
        "up_proj": (h, f),
        "down_proj": (f, h),
    }


def resolve_targets(target_modules: str | tuple[str, ...], model_type: str) -> tuple[str, ...]:
    """The HF linears adapted: "all-linear", None/"default" (peft's per-model default), or explicit names
    (HF names, or Megatron-Bridge fused names, expanded to the HF linears they fuse)."""
    if isinstance(target_modules, str):
        key = target_modules.lower()
        if key == "all-linear":
            return LINEAR_MODULES
        if key in ("default", "none", ""):
            if model_type not in PEFT_DEFAULT_TARGETS:
                raise InputError(
                    f"peft has no default LoRA target modules for model_type '{model_type}' in this tool's table.",
                    "Pass target_modules explicitly (e.g. all-linear or q_proj,v_proj).",
                )
            return PEFT_DEFAULT_TARGETS[model_type]
        target_modules = tuple(m.strip() for m in target_modules.split(",") if m.strip())
    names: list[str] = []
    for name in target_modules:
        expanded = MEGATRON_FUSED_MODULES.get(name, (name,))
        unknown = [m for m in expanded if m not in LINEAR_MODULES]
        if unknown:
            raise InputError(
                f"LoRA target module '{name}' is not a linear layer of a Llama/Qwen decoder.",
                f"Use all-linear, or names among {', '.join(LINEAR_MODULES)} / {', '.join(MEGATRON_FUSED_MODULES)}.",
            )
        names += [m for m in expanded if m not in names]
    return tuple(m for m in LINEAR_MODULES if m in names)


def adapter_params_per_layer(
    shape: TransformerShape, targets: tuple[str, ...], rank: int, *, fused: bool = False
) -> int:
    """LoRA parameters of one layer: r·(in + out) per adapted module; `fused` (Megatron-Bridge) gives a
    fused group (qkv, gate+up) one A and one B as wide as the group's output."""
    dims = linear_dims(shape)
    if not fused:
        return sum(rank * (dims[m][0] + dims[m][1]) for m in targets)
    total = 0
    for group in MEGATRON_FUSED_MODULES.values():
        members = [m for m in group if m in targets]
        if members:
            total += rank * (dims[members[0]][0] + sum(dims[m][1] for m in members))
    return total


def adapter_params(shape: TransformerShape, targets: tuple[str, ...], rank: int, *, fused: bool = False) -> int:
    """All LoRA parameters of the model."""
    return shape.num_layers * adapter_params_per_layer(shape, targets, rank, fused=fused)


class AdapterStates(NamedTuple):
    """Trainable adapter states on one rank (bytes)."""

    params_bytes: int
    grads_bytes: int
    adam_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.adam_bytes


def adapter_state_bytes(num_adapter_params: int, adapter_bytes: int, shard_degree: int = 1) -> AdapterStates:
    """Adapter params, grads and both Adam moments in the adapter dtype, sharded over `shard_degree` ranks."""
    shard = _ceil_div(num_adapter_params, shard_degree)
    return AdapterStates(shard * adapter_bytes, shard * adapter_bytes, 2 * shard * adapter_bytes)


class FrozenBase(NamedTuple):
    """The frozen base model on one rank (bytes)."""

    linear_bytes: int  # the decoder layers' linears, quantized or not (with their quantization constants)
    other_bytes: int  # embeddings, lm_head, norms, biases (never quantized)

    @property
    def total_bytes(self) -> int:
        return self.linear_bytes + self.other_bytes


def quantized_tensor_bytes(numel: int, out_rows: int, bits: int, *, double_quant: bool = True) -> int:
    """Storage of one weight matrix quantized by bitsandbytes (module docstring)."""
    if bits == 8:
        return numel + FP32_BYTES * out_rows  # int8 CB + fp32 SCB per row
    if bits != 4:
        raise ValueError(f"bitsandbytes quantizes to 8 or 4 bits, got {bits}")
    blocks = _ceil_div(numel, NF4_BLOCK)
    packed = _ceil_div(numel, 2)
    if double_quant:
        stats = blocks + FP32_BYTES * _ceil_div(blocks, NF4_NESTED_BLOCK) + FP32_BYTES  # uint8 absmax, absmax2, offset
    else:
        stats = FP32_BYTES * blocks
    return packed + stats + NF4_CODE_BYTES


def frozen_base_bytes(
    shape: TransformerShape,
    *,
    base_bits: int,
    unquantized_bytes: int,
    double_quant: bool = True,
    shard_degree: int = 1,
) -> FrozenBase:
    """The frozen base: linears at `base_bits` (32/16: plain; 8: LLM.int8; 4: NF4), the rest at
    `unquantized_bytes` per parameter (for a 32/16-bit base pass the same width), sharded over
    `shard_degree` ranks (FSDP); 1 for a replicated base."""
    if base_bits not in BASE_BITS:
        raise ValueError(f"base_bits must be one of {BASE_BITS}, got {base_bits}")
    dims = linear_dims(shape)
    linear_numel = sum(i * o for i, o in dims.values())
    if base_bits >= 16:
        per_layer = linear_numel * base_bits // 8
    else:
        per_layer = sum(
            quantized_tensor_bytes(i * o, o, base_bits, double_quant=double_quant) for i, o in dims.values()
        )
    linear = shape.num_layers * per_layer
    other_params = shape.num_params - shape.num_layers * linear_numel
    return FrozenBase(_ceil_div(linear, shard_degree), _ceil_div(other_params * unquantized_bytes, shard_degree))


def base_bits_per_param(bits: int, *, double_quant: bool = True) -> float:
    """Storage bits per quantized weight for a large matrix (the QLoRA paper's 4.127 with double quantization)."""
    n = NF4_BLOCK * NF4_NESTED_BLOCK * 1024
    fixed = (NF4_CODE_BYTES + (FP32_BYTES if double_quant else 0)) if bits == 4 else 0  # per-tensor constants
    return 8 * (quantized_tensor_bytes(n, 1, bits, double_quant=double_quant) - fixed) / n


class LoraActivationDelta(NamedTuple):
    """Per token, per layer: how LoRA changes a full fine-tune's saved activations (bytes)."""

    adapter_bytes: int  # + A's outputs (c·r per adapted module)
    dropout_bytes: int  # + dropout outputs and masks (lora_dropout > 0)
    frozen_savings_bytes: int  # − inputs a frozen weight no longer needs

    @property
    def net_bytes(self) -> int:
        return self.adapter_bytes + self.dropout_bytes - self.frozen_savings_bytes


def lora_activation_delta(
    shape: TransformerShape,
    targets: tuple[str, ...],
    rank: int,
    compute_bytes: int,
    *,
    dropout: bool = False,
    on_cpu: bool = False,
) -> LoraActivationDelta:
    """The per-layer, per-token change of saved activations (module docstring)."""
    c, dims = compute_bytes, linear_dims(shape)
    adapter = c * rank * len(targets)
    mask = c if on_cpu else 1  # CUDA native_dropout keeps a bool mask; cpu keeps the noise tensor
    drop = sum((c + mask) * dims[m][0] for m in targets) if dropout else 0
    savings = 2 * c * shape.hidden
    if "o_proj" not in targets:
        savings += c * shape.q_dim
    if "down_proj" not in targets:
        savings += c * shape.ffn
    return LoraActivationDelta(adapter, drop, savings)


def lora_head_savings_bytes(tokens: int, hidden: int, compute_bytes: int) -> int:
    """Saved head-side activations a frozen final norm and lm_head do without: 2·c·h per token."""
    return 2 * compute_bytes * hidden * tokens


def dequant_transient_bytes(shape: TransformerShape, base_bits: int, compute_bytes: int, tokens: int = 0) -> int:
    """Largest transient of a quantized linear: its weight dequantized to the compute dtype, plus for int8
    the fp16 cast and int8 copy of the input (3 bytes per input element) of `tokens` rows. 0 for 16/32 bits."""
    if base_bits >= 16:
        return 0
    dims = linear_dims(shape).values()
    weight = compute_bytes * max(i * o for i, o in dims)
    if base_bits == 8:
        weight += tokens * (3 * max(i for i, _ in dims) + FP32_BYTES)
    return weight


def reference_bytes(num_adapter_params: int, adapter_bytes: int, *, ref_adapter_copy: bool) -> int:
    """The reference under LoRA: the base with adapters disabled (0), or TRL's frozen "ref" adapter copy."""
    return num_adapter_params * adapter_bytes if ref_adapter_copy else 0
