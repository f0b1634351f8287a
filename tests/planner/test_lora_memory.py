"""LoRA / QLoRA leaves: adapter counts, quantized base storage, activation deltas, vLLM slots, adapter sync."""

from __future__ import annotations

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.planner.memory.lora import (
    LINEAR_MODULES,
    adapter_params,
    adapter_params_per_layer,
    adapter_state_bytes,
    base_bits_per_param,
    dequant_transient_bytes,
    frozen_base_bytes,
    lora_activation_delta,
    lora_head_savings_bytes,
    quantized_tensor_bytes,
    reference_bytes,
    resolve_targets,
)
from grpo_pilot.planner.memory.lora_rollout import (
    cpu_adapter_cache_bytes,
    lora_sync_bytes,
    punica_buffer_bytes,
    vllm_lora_slot_bytes,
    vllm_max_lora_rank,
)
from grpo_pilot.planner.memory.shape import TransformerShape, shape_of
from tests.planner.conftest import spec

TINY = TransformerShape(hidden=8, q_dim=8, kv_dim=4, ffn=16, num_heads=2, num_layers=4, vocab=32)
QV = ("q_proj", "v_proj")


def test_target_sets() -> None:
    assert resolve_targets("all-linear", "qwen2") == LINEAR_MODULES
    assert resolve_targets("default", "llama") == QV and resolve_targets("", "qwen3") == QV
    assert resolve_targets(("v_proj", "q_proj"), "qwen2") == QV  # canonical order
    assert resolve_targets("q_proj, k_proj,v_proj,o_proj", "qwen2") == LINEAR_MODULES[:4]
    fused = resolve_targets(("linear_qkv", "linear_fc1"), "qwen2")
    assert fused == ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    with pytest.raises(InputError):
        resolve_targets(("lm_head",), "qwen2")
    with pytest.raises(InputError):
        resolve_targets("default", "gpt_oss_unknown")


def test_adapter_params_by_hand() -> None:
    # r·(in + out): q 16, k 12, v 12, o 16, gate 24, up 24, down 24 → 128 per unit rank
    assert adapter_params_per_layer(TINY, LINEAR_MODULES, 2) == 256
    assert adapter_params(TINY, LINEAR_MODULES, 2) == 1024
    assert adapter_params_per_layer(TINY, QV, 2) == 2 * (16 + 12)
    # Megatron-Bridge fused: qkv A r×8 + B (8+4+4)×r; proj 16r; fc1 A r×8 + B 32×r; fc2 24r → 104r
    assert adapter_params_per_layer(TINY, LINEAR_MODULES, 2, fused=True) == 2 * 104
    assert adapter_params_per_layer(TINY, LINEAR_MODULES, 2, fused=True) < adapter_params_per_layer(
        TINY, LINEAR_MODULES, 2
    )


def test_qwen25_7b_rank64_all_linear_adapter_count() -> None:
    shape = shape_of(spec("qwen2.5-7b"))
    h, q, kv, f = 3584, 3584, 512, 18944
    per_layer = 64 * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + f) + (f + h))
    assert adapter_params(shape, LINEAR_MODULES, 64) == 28 * per_layer == 161_480_704
    states = adapter_state_bytes(161_480_704, 4, shard_degree=8)
    assert states.params_bytes == 4 * 161_480_704 // 8 and states.adam_bytes == 2 * states.params_bytes
    assert states.total_bytes == 16 * 161_480_704 // 8


def test_quantized_storage_by_hand() -> None:
    # 64-element NF4 tensor with double quantization: 32 packed + 1 uint8 absmax + 4 absmax2 + 4 offset + 64 code
    assert quantized_tensor_bytes(64, 8, 4) == 105
    assert quantized_tensor_bytes(64, 8, 4, double_quant=False) == 32 + 4 + 64
    assert quantized_tensor_bytes(64, 8, 8) == 64 + 4 * 8  # int8 + fp32 scale per row
    base = frozen_base_bytes(TINY, base_bits=4, unquantized_bytes=2)
    # per layer q 105, k 89, v 89, o 105, gate/up/down 138 each = 802; non-linear params 584 at 2 bytes
    assert base == (4 * 802, 584 * 2)
    bf16 = frozen_base_bytes(TINY, base_bits=16, unquantized_bytes=2)
    assert bf16.total_bytes == 2 * TINY.num_params
    assert frozen_base_bytes(TINY, base_bits=32, unquantized_bytes=4, shard_degree=4).total_bytes == TINY.num_params
    with pytest.raises(ValueError):
        frozen_base_bytes(TINY, base_bits=3, unquantized_bytes=2)


def test_qlora_bits_per_param_match_the_paper() -> None:
    # Dettmers et al. 2023 §3: double quantization takes the constants from 0.5 to 0.127 bits per parameter
    assert base_bits_per_param(4) == pytest.approx(4.127, abs=5e-4)
    assert base_bits_per_param(4, double_quant=False) == pytest.approx(4.5, abs=1e-9)
    assert base_bits_per_param(8) == pytest.approx(8.0, abs=1e-5)  # one fp32 scale per row
    shape = shape_of(spec("qwen2.5-7b"))
    linear = 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944)
    nf4 = frozen_base_bytes(shape, base_bits=4, unquantized_bytes=2)
    assert nf4.linear_bytes == pytest.approx(linear * 4.127 / 8, rel=2e-3)
    int8 = frozen_base_bytes(shape, base_bits=8, unquantized_bytes=2)
    assert (
        nf4.linear_bytes < int8.linear_bytes < frozen_base_bytes(shape, base_bits=16, unquantized_bytes=2).linear_bytes
    )
    # embeddings, lm_head and norms stay unquantized: fp32 after peft's prepare_model_for_kbit_training doubles them
    assert frozen_base_bytes(shape, base_bits=4, unquantized_bytes=4).other_bytes == 2 * nf4.other_bytes


def test_activation_delta_by_hand() -> None:
    all_lin = lora_activation_delta(TINY, LINEAR_MODULES, 2, 2)
    assert all_lin == (2 * 2 * 7, 0, 2 * 2 * 8)
    drop = lora_activation_delta(TINY, LINEAR_MODULES, 2, 2, dropout=True)
    assert drop.dropout_bytes == 3 * (8 * 6 + 16)  # (c + 1 mask byte) · Σ in
    assert lora_activation_delta(TINY, LINEAR_MODULES, 2, 4, dropout=True, on_cpu=True).dropout_bytes == 8 * 64
    qv = lora_activation_delta(TINY, QV, 2, 2)
    assert qv.frozen_savings_bytes == 32 + 2 * 8 + 2 * 16 and qv.net_bytes == 8 - 80
    # measured (docs/families.md): going from r to r + 8 adds 4·8 bytes per adapted module per token in fp32
    assert (
        lora_activation_delta(TINY, LINEAR_MODULES, 16, 4).net_bytes
        - lora_activation_delta(TINY, LINEAR_MODULES, 8, 4).net_bytes
        == 4 * 8 * 7
    )
    assert lora_head_savings_bytes(10, 8, 2) == 320


def test_dequant_transient_and_reference() -> None:
    # the largest quantized matrix (gate/up/down: 8·16) in bf16
    assert dequant_transient_bytes(TINY, 4, 2) == 256
    assert dequant_transient_bytes(TINY, 8, 2, tokens=10) == 256 + 10 * (3 * 16 + 4)
    assert dequant_transient_bytes(TINY, 16, 2) == 0
    assert reference_bytes(1000, 2, ref_adapter_copy=False) == 0
    assert reference_bytes(1000, 2, ref_adapter_copy=True) == 2000


def test_vllm_slots() -> None:
    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 64, 100, 300, 512)] == [1, 8, 8, 16, 64, 128, 320, 512]
    with pytest.raises(ValueError):
        vllm_max_lora_rank(513)
    # rank 2 → 8-wide slots; TP 2: q 8·8 + 4·8, k/v 8·8 + 2·8 each, o 8·4 + 8·8, gate/up 8·8 + 8·8, down 8·8 + 8·8
    assert vllm_lora_slot_bytes(TINY, 2, 2, head_dim=2) == 2 * 4 * 736
    shape = shape_of(spec("qwen2.5-7b"))
    # TP 1, an allowed rank, one slot: the slots hold exactly one all-linear adapter in bf16
    assert vllm_lora_slot_bytes(shape, 64, 1, head_dim=128) == 2 * adapter_params(shape, LINEAR_MODULES, 64)
    tp2 = vllm_lora_slot_bytes(shape, 64, 2, head_dim=128)
    sharded = vllm_lora_slot_bytes(shape, 64, 2, head_dim=128, fully_sharded=True)
    assert sharded < tp2 < 2 * adapter_params(shape, LINEAR_MODULES, 64)
    assert vllm_lora_slot_bytes(shape, 64, 1, head_dim=128, max_loras=4) == 4 * vllm_lora_slot_bytes(
        shape, 64, 1, head_dim=128
    )
    assert punica_buffer_bytes(8192, 64) == 4 * 3 * 8192 * 64
    assert cpu_adapter_cache_bytes(1000, 2) == 4000


def test_adapter_sync_modes() -> None:
    kw = dict(
        model_params=1000,
        layer_params=100,
        largest_param_elements=80,
        num_adapter_params=10,
        largest_adapter_elements=3,
        storage_bytes=4,
    )
    whole = lora_sync_bytes(fsdp_version=1, layered_summon=False, base_sync_done=True, **kw)
    layered = lora_sync_bytes(fsdp_version=1, layered_summon=True, base_sync_done=True, **kw)
    fsdp2 = lora_sync_bytes(fsdp_version=2, layered_summon=False, base_sync_done=True, **kw)
    assert whole == (4000, 40) and layered == (400, 40) and fsdp2 == (12, 40)
    first = lora_sync_bytes(fsdp_version=2, layered_summon=False, base_sync_done=False, **kw)
    assert first == (320, 40 + 4000)
    sleep2 = lora_sync_bytes(fsdp_version=1, layered_summon=True, base_sync_done=True, resend_base=True, **kw)
    assert sleep2 == (400, 4040)
