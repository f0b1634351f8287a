"""The rollout engine under LoRA, and how verl moves adapters (or merged weights) to it.

vLLM `enable_lora` (verl vllm_async_server.py b178a3cd L342–L358: `enable_lora=True, max_loras=1,
max_lora_rank=get_vllm_max_lora_rank(rank)`, plus `fully_sharded_loras=True` for Megatron LoRA):
- `max_lora_rank` must be one of vLLM's `MaxLoRARanks` = 1, 8, 16, 32, 64, 128, 256, 320, 512
  (vllm/config/lora.py, 01230b40); verl rounds the rank up to the next one (rollout/vllm_rollout/utils.py
  L66–L82) and refuses ranks above 512.
- slot buffers: vLLM wraps every supported linear of the model — the model's own list, whatever modules
  the adapter targets (lora/model_manager.py `_create_lora_modules` / `_match_target_modules`, matching
  `supported_lora_modules`) — and each wrapper allocates, per slice of a packed layer (qkv: 3, gate_up: 2),
  `lora_a_stacked` [max_loras, 1, R_a, in] and `lora_b_stacked` [max_loras, 1, out, R] in the model dtype
  (lora/layers/base_linear.py `create_lora_weights`, 01235a49): column-parallel layers (qkv, gate_up)
  keep A's input whole and split B's output by TP (R_a = R / TP with fully_sharded_loras); row-parallel
  layers (o, down) split A's input by TP and keep B's output whole (split by TP with fully_sharded_loras).
  These are allocated with the model, before the profile run: inside the gpu_memory_utilization budget,
  taken from the KV cache.
- the punica shrink buffer: fp32 [slices, tokens, R] during a forward (`add_lora_linear`), part of the
  activation peak.
- CPU cache: `max_cpu_loras` (default max_loras) adapters held in host memory by the LRU manager.

verl's adapter sync (fsdp_workers.py `rollout_mode` L676–L752, utils/fsdp_utils.py `collect_lora_params`
L611–L666 and `layered_summon_lora_params` L569–L608):
- `rollout.load_format: safetensors` (required by verl's LoRA docs) lets vLLM load the base itself, so
  `base_sync_done` is true from the start and each step ships only the adapters; with `dummy` the first
  sync exports the whole base.
- FSDP1 without `layered_summon`: `FSDP.summon_full_params(module)` on the root gathers *every* flat
  parameter, the frozen base included, in its storage dtype (fp32 for verl's actor) on each GPU before
  the adapter state dict is taken: a whole-model transient. With `rollout.layered_summon: True` the
  gather runs per decoder layer: one layer at a time ("save memory (prevent OOM) but slower").
- FSDP2: tensors are gathered one by one with `full_tensor()` (the FSDP1 summon is a no-op there): the
  largest adapter, or the largest base tensor when the base ships.
- the gathered adapters are moved to host memory (`.cpu()`) and handed to vLLM as a tensor LoRA request.
- vLLM sleep level 2 (weights dropped between phases) makes verl re-send the base every step as well
  (L704–L745).
- merged-weights sync (Megatron-Bridge `model.lora.merge: True`): vLLM runs without LoRA and receives
  merged full weights, as a full fine-tune does (`weight_sync` / `megatron_weight_export_bytes`).
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.planner.memory.lora import linear_dims
from grpo_pilot.planner.memory.shape import TransformerShape
from grpo_pilot.units import FP32_BYTES

VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm/config/lora.py MaxLoRARanks
# vLLM packs q/k/v into one column-parallel layer of 3 slices and gate/up into one of 2 (packed_modules_mapping)
VLLM_PACKED_LAYERS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("q_proj", "k_proj", "v_proj"), True),  # (slices, column-parallel)
    (("o_proj",), False),
    (("gate_proj", "up_proj"), True),
    (("down_proj",), False),
)
PUNICA_MAX_SLICES = 3


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def vllm_max_lora_rank(rank: int) -> int:
    """The slot rank vLLM allocates for a LoRA of rank `rank` (verl get_vllm_max_lora_rank)."""
    for allowed in VLLM_MAX_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"vLLM supports LoRA ranks up to {VLLM_MAX_LORA_RANKS[-1]}, got {rank}")


def _slice_out(name: str, out: int, tp: int, head_dim: int) -> int:
    """A column-parallel slice's output per TP rank; k/v keep at least one (replicated) head."""
    if name in ("k_proj", "v_proj"):
        return max(head_dim, out // tp)
    return _ceil_div(out, tp)


def vllm_lora_slot_bytes(
    shape: TransformerShape,
    lora_rank: int,
    tensor_parallel: int,
    *,
    head_dim: int,
    max_loras: int = 1,
    fully_sharded: bool = False,
    weight_bytes: int = 2,
) -> int:
    """Bytes of vLLM's stacked LoRA A/B buffers on one GPU (every supported linear of every layer)."""
    r, t, dims = vllm_max_lora_rank(lora_rank), tensor_parallel, linear_dims(shape)
    per_layer = 0
    for names, column in VLLM_PACKED_LAYERS:
        for name in names:
            i, o = dims[name]
            if column:
                r_a = _ceil_div(r, t) if fully_sharded else r
                per_layer += r_a * i + _slice_out(name, o, t, head_dim) * r
            else:
                out = _ceil_div(o, t) if fully_sharded else o
                per_layer += r * _ceil_div(i, t) + out * r
    return max_loras * weight_bytes * shape.num_layers * per_layer


def punica_buffer_bytes(tokens: int, lora_rank: int) -> int:
    """The fp32 shrink buffer of one packed LoRA linear over `tokens` tokens (activation peak)."""
    return FP32_BYTES * PUNICA_MAX_SLICES * tokens * vllm_max_lora_rank(lora_rank)


def cpu_adapter_cache_bytes(num_adapter_params: int, max_cpu_loras: int = 1, weight_bytes: int = 2) -> int:
    """Host memory of vLLM's CPU LoRA cache (per engine process)."""
    return max_cpu_loras * num_adapter_params * weight_bytes


class LoraSync(NamedTuple):
    """GPU transient and host bytes of one trainer → engine adapter sync on one rank."""

    gathered_bytes: int  # parameters materialised on the GPU while the adapters are collected
    host_bytes: int  # adapter (or base) tensors staged in host memory


def lora_sync_bytes(
    *,
    model_params: int,
    layer_params: int,
    largest_param_elements: int,
    num_adapter_params: int,
    largest_adapter_elements: int,
    storage_bytes: int,
    fsdp_version: int,
    layered_summon: bool,
    base_sync_done: bool,
    resend_base: bool = False,
) -> LoraSync:
    """verl's adapter sync (module docstring). `storage_bytes`: the FSDP parameter dtype (4 for verl's fp32
    actor); `resend_base`: vLLM sleep level 2 (the base is exported every step)."""
    ship_base = resend_base or not base_sync_done
    if fsdp_version == 1:
        gathered = storage_bytes * (layer_params if layered_summon else model_params)
    else:
        # FSDP2: one `full_tensor()` at a time — the largest base tensor when the base ships, else an adapter
        gathered = storage_bytes * (largest_param_elements if ship_base else largest_adapter_elements)
    host = storage_bytes * num_adapter_params
    if ship_base:
        host += storage_bytes * model_params
    return LoraSync(gathered, host)
