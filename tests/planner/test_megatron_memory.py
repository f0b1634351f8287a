"""Megatron leaves: hand-computed numbers, verl's offload semantics, and a cross-check against Megatron-LM's
own theoretical memory accounting re-implemented here as the independent reference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo_pilot.planner.memory.megatron import (
    MegatronParallel,
    StageParams,
    megatron_host_items,
    megatron_resident_items,
    megatron_state_bytes,
    megatron_weight_export_bytes,
    stage_params,
)
from grpo_pilot.planner.memory.megatron_activations import (
    Recompute,
    forward_only_bytes,
    in_flight,
    layer_split,
    megatron_logits_bytes,
    stage_activation_bytes,
    update_peak_items,
)
from grpo_pilot.planner.memory.shape import TransformerShape, shape_of
from tests.planner.conftest import spec

# ---------------------------------------------------------------------------------------------------------------
# The reference: Megatron-LM's theoretical memory accounting, re-implemented from
# NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553
# (dense models only; no MoE, MTP or MLA branches):
#   compute_weight_and_optimizer_memory  L12–L305 (parameter split L82–L103, most loaded shard L247–L267,
#                                        bytes per parameter L293–L296)
#   compute_activation_memory            L308–L379 (SP + selective recompute, used when both are on: L466)
#   compute_activation_memory_without_sp L382–L453 (every other case; ×1.05 "miscellaneous" at L449–L451)
# ---------------------------------------------------------------------------------------------------------------


def ref_weight_and_optimizer_bytes(a: SimpleNamespace) -> float:
    """Bytes of the most loaded shard (first stage) as Megatron-LM computes them."""
    groups = a.num_query_groups if a.group_query_attention else a.num_attention_heads
    q_over_h = a.kv_channels * a.num_attention_heads / a.hidden_size
    attention = 2 * a.hidden_size * a.hidden_size * (1 + groups / a.num_attention_heads) * q_over_h
    mlp = 2 * a.hidden_size * a.ffn_hidden_size * (1.5 if a.swiglu else 1)
    norm_size = 1 if a.normalization == "RMSNorm" else 2
    layernorms = 2 * a.hidden_size * norm_size
    embedding = a.hidden_size * a.padded_vocab_size
    tp_block = (attention + mlp) * a.num_layers
    replicated_block = layernorms * a.num_layers + norm_size * a.hidden_size
    tp_shard = (tp_block / a.pipeline_model_parallel_size + embedding) / a.tensor_model_parallel_size
    replicated_shard = replicated_block / a.pipeline_model_parallel_size
    if a.untie_embeddings_and_output_weights and a.pipeline_model_parallel_size == 1:
        tp_shard += embedding / a.tensor_model_parallel_size
    per_param = 6 + 12 / a.data_parallel_size if a.use_distributed_optimizer else 18
    return (tp_shard + replicated_shard) * per_param


def _ref_pipeline_scale(a: SimpleNamespace, num_microbatches: int) -> float:
    p, v = a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size
    if v is not None:
        return 1 + (p - 1) / (p * v)
    if p > 1:
        return min(1, num_microbatches / p)
    return 1.0


def ref_activation_bytes_sp(a: SimpleNamespace, num_microbatches: int, with_output_layer: bool = True) -> float:
    """`compute_activation_memory`: first stage, SP + selective recompute (Table 2, 34/t with I = 4h)."""
    sbh = a.seq_length * a.micro_batch_size * a.hidden_size
    total = sbh * (18 + 4 * a.ffn_hidden_size / a.hidden_size) * a.num_layers
    total += 8 * a.seq_length * a.micro_batch_size * a.pipeline_model_parallel_size  # input ids
    total += sbh * a.pipeline_model_parallel_size  # embedding dropout mask
    total *= _ref_pipeline_scale(a, num_microbatches)
    if a.pipeline_model_parallel_size == 1 and with_output_layer:
        total += sbh * 4 * (1 + a.padded_vocab_size / a.hidden_size)
    return total / a.tensor_model_parallel_size


def ref_activation_bytes_without_sp(a: SimpleNamespace, num_microbatches: int) -> float:
    """`compute_activation_memory_without_sp`: first stage, no SP, selective (10 + 24/t); × 1.05."""
    sbh = a.seq_length * a.micro_batch_size * a.hidden_size
    total = sbh * (10 + 24 / a.tensor_model_parallel_size) * a.num_layers
    total += 8 * a.seq_length * a.micro_batch_size * a.pipeline_model_parallel_size
    total += sbh * a.pipeline_model_parallel_size
    total *= _ref_pipeline_scale(a, num_microbatches)
    if a.pipeline_model_parallel_size == 1:
        logits = a.seq_length * a.micro_batch_size * a.padded_vocab_size / a.tensor_model_parallel_size
        total += (logits + sbh) * 2
    return total * 1.05


REF_MISC_OVERHEAD = 1.05  # the without-SP formula's "optimizer and miscellaneous temporaries" factor (L449–L451)


def megatron_args(shape: TransformerShape, par: MegatronParallel, seq: int, head_dim: int) -> SimpleNamespace:
    """Megatron-LM arguments describing the same model and layout."""
    heads = shape.q_dim // head_dim
    return SimpleNamespace(
        hidden_size=shape.hidden,
        kv_channels=head_dim,
        num_attention_heads=heads,
        group_query_attention=shape.kv_dim != shape.q_dim,
        num_query_groups=shape.kv_dim // head_dim,
        ffn_hidden_size=shape.ffn,
        swiglu=shape.gated_mlp,
        normalization="RMSNorm" if shape.norm_params == 1 else "LayerNorm",
        padded_vocab_size=shape.vocab,
        untie_embeddings_and_output_weights=not shape.tied_embeddings,
        num_layers=shape.num_layers,
        tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp,
        virtual_pipeline_model_parallel_size=par.vpp if par.vpp > 1 else None,
        use_distributed_optimizer=par.distributed_optimizer,
        data_parallel_size=par.dp,
        seq_length=seq,
        micro_batch_size=1,
    )


def gpt(hidden: int, layers: int, heads: int, vocab: int = 51200) -> TransformerShape:
    """A GPT-3-style shape as Megatron's formula assumes it: MHA, GeLU with I = 4h, LayerNorm, dropout."""
    return TransformerShape(
        hidden=hidden,
        q_dim=hidden,
        kv_dim=hidden,
        ffn=4 * hidden,
        num_heads=heads,
        num_layers=layers,
        vocab=vocab,
        gated_mlp=False,
        norm_params=2,
        dropout=True,
    )


# (name, shape, head_dim, parallel layout, sequence length, micro-batches)
GPT_CASES = [
    ("gpt-7b tp8 pp1 sp do", gpt(4096, 32, 32), 128, MegatronParallel(tp=8, pp=1, dp=4), 4096, 8),
    (
        "gpt-175b tp8 pp8 sp no-do",
        gpt(12288, 96, 96),
        128,
        MegatronParallel(tp=8, pp=8, dp=2, distributed_optimizer=False),
        2048,
        64,
    ),
    ("gpt-13b tp4 pp4 vpp2 sp do", gpt(5120, 40, 40), 128, MegatronParallel(tp=4, pp=4, vpp=2, dp=2), 4096, 16),
    ("gpt-1.3b tp2 pp2 vpp3 sp", gpt(2048, 24, 16), 128, MegatronParallel(tp=2, pp=2, vpp=3, dp=8), 2048, 12),
]
NO_SP_CASES = [
    (
        "gpt-7b tp2 pp4 no-sp m=2",
        gpt(4096, 32, 32),
        128,
        MegatronParallel(tp=2, pp=4, dp=1, sequence_parallel=False),
        4096,
        2,
    ),
    (
        "gpt-2.7b tp4 pp1 no-sp",
        gpt(2560, 32, 32),
        80,
        MegatronParallel(tp=4, pp=1, dp=2, sequence_parallel=False),
        2048,
        4,
    ),
]


def _within(ours: float, ref: float, rel: float = 0.05) -> bool:
    return abs(ours - ref) <= rel * ref


@pytest.mark.parametrize(("name", "shape", "head_dim", "par", "seq", "m"), GPT_CASES + NO_SP_CASES)
def test_weights_and_optimizer_match_megatron_formula(name, shape, head_dim, par, seq, m) -> None:
    ours = megatron_state_bytes(stage_params(shape, par, 0), par).total_bytes
    ref = ref_weight_and_optimizer_bytes(megatron_args(shape, par, seq, head_dim))
    assert _within(ours, ref, 0.01), (name, ours, ref)


@pytest.mark.parametrize(("name", "shape", "head_dim", "par", "seq", "m"), GPT_CASES)
def test_first_stage_activations_match_megatron_formula_with_sp(name, shape, head_dim, par, seq, m) -> None:
    acts = stage_activation_bytes(
        shape,
        par,
        tokens_per_microbatch=seq,
        num_microbatches=m,
        compute_bytes=2,
        recompute=Recompute("selective", modules=("core_attn",)),
    )
    ref = ref_activation_bytes_sp(megatron_args(shape, par, seq, head_dim), m, with_output_layer=False)
    assert acts.recompute_bytes == 0  # selective recompute keeps no recompute buffer
    assert _within(acts.saved_bytes, ref), (name, acts.saved_bytes, ref)


@pytest.mark.parametrize(("name", "shape", "head_dim", "par", "seq", "m"), NO_SP_CASES)
def test_first_stage_activations_match_megatron_formula_without_sp(name, shape, head_dim, par, seq, m) -> None:
    acts = stage_activation_bytes(
        shape, par, tokens_per_microbatch=seq, num_microbatches=m, compute_bytes=2, recompute=Recompute("selective")
    )
    ref = ref_activation_bytes_without_sp(megatron_args(shape, par, seq, head_dim), m)
    ours = acts.saved_bytes
    if par.pp == 1:  # their formula adds the output layer's logits and final-norm output (bf16) here
        ours += (seq * shape.vocab // par.tp + seq * shape.hidden) * 2
    # their ×1.05 miscellaneous buffer is not an activation: our overheads carry fragmentation separately
    assert _within(ours, ref / REF_MISC_OVERHEAD), (name, ours, ref)


def test_gpt_shape_per_layer_split_is_table2_exactly() -> None:
    # MHA, GeLU I = 4h, dropout, bf16: replicated 10·h (4 LayerNorm in/out + 2 dropout masks... as 2·2 + 2·2 + 2)
    # and 24·h sharded by TP (Korthikanti et al. Table 2: sbh(10 + 24/t)); selective drops the 5as² core term.
    h = 1024
    split = layer_split(gpt(h, 2, 16), 2, recomputed_modules=("core_attn",))
    assert split.replicated_bytes == 10 * h and split.parallel_bytes == 24 * h


@pytest.mark.parametrize("alias", ["llama-3.1-8b", "qwen2.5-7b", "qwen3-8b"])
def test_llama_qwen_shapes_differ_from_megatron_formula_by_gqa_swiglu_and_dropout(alias: str) -> None:
    # By design: Megatron's formula counts K and V as wide as Q, a GeLU MLP (4·I bytes) and dropout masks; a
    # Llama/Qwen layer saves K, V at kv width, a SwiGLU (6·I bytes) and no masks. The gap is exactly that.
    m = spec(alias)
    shape = shape_of(m)
    par = MegatronParallel(tp=4, pp=2, dp=1)
    seq, mb = 8192, 8
    acts = stage_activation_bytes(
        shape, par, tokens_per_microbatch=seq, num_microbatches=mb, compute_bytes=2, recompute=Recompute("selective")
    )
    ref = ref_activation_bytes_sp(megatron_args(shape, par, seq, m.head_dim), mb, with_output_layer=False)
    h, q, kv, ffn, t, p, L = shape.hidden, shape.q_dim, shape.kv_dim, shape.ffn, par.tp, par.pp, shape.num_layers
    theirs_layer = 18 * h + 4 * ffn  # bytes per token per layer before / t
    ours_layer = 8 * h + 2 * (q + 2 * kv) + 2 * q + 6 * ffn
    gap_layers = L * seq * (theirs_layer - ours_layer) / t
    gap_embedding = p * seq * h / t + 8 * seq * p * (1 / t - 1)  # their dropout mask; their input ids are / t
    assert acts.saved_bytes == pytest.approx(ref - gap_layers - gap_embedding, rel=1e-6)
    # and the difference is real: SwiGLU costs more than GeLU at the same I, GQA saves K/V bytes
    assert ours_layer != theirs_layer


def test_pp1_logits_differ_from_megatron_output_term_by_verls_bf16_copy() -> None:
    # Megatron's PP = 1 term counts 4 bytes per logits element (its fp32 CE); verl's logits_processor keeps the
    # bf16 logits beside the fp32 copy `vocab_parallel_cross_entropy` makes: (2 + 4) per element.
    m = spec("qwen2.5-7b")
    t, seq = 2, 4096
    ours = megatron_logits_bytes(seq, m.vocab_size, m.hidden_size, t, compute_bytes=2, training=True)
    theirs = seq * m.vocab_size * 4 / t
    assert ours - theirs == seq * m.vocab_size * 2 / t


# ---------------------------------------------------------------------------------------------------------------
# Hand-computed small configuration
# ---------------------------------------------------------------------------------------------------------------

TINY = TransformerShape(hidden=8, q_dim=8, kv_dim=4, ffn=16, num_heads=2, num_layers=4, vocab=32)


def test_tiny_stage_params_by_hand() -> None:
    par = MegatronParallel(tp=2, pp=2, dp=2)
    # per layer: attention 8·8 + 2·8·4 + 8·8 = 192, MLP 3·8·16 = 384 → 576 TP-sharded; norms 2·8 = 16 replicated
    # stage 0: 2 layers → 2·576/2 + 2·16 = 608, + embedding 32·8/2 = 128 → 736
    assert stage_params(TINY, par, 0) == StageParams(736, 0)
    # stage 1: 608 + final norm 8 + untied output layer 128 = 744
    assert stage_params(TINY, par, 1) == StageParams(744, 0)
    tied = TINY._replace(tied_embeddings=True)
    assert stage_params(tied, par, 1) == StageParams(744, 0)  # the tied copy lives on the last stage
    assert stage_params(tied, MegatronParallel(tp=2), 0) == StageParams(4 * 288 + 4 * 16 + 128 + 8, 0)


def test_tiny_states_by_hand() -> None:
    par = MegatronParallel(tp=2, pp=2, dp=2)
    states = megatron_state_bytes(StageParams(736, 0), par)
    # bf16 2·736, fp32 grads 4·736, fp32 master 4·368 and Adam 8·368 (distributed over dp = 2)
    assert states == (1472, 2944, 1472, 2944)
    assert states.total_bytes == 736 * (6 + 12 / 2)
    plain = megatron_state_bytes(StageParams(736, 0), par._replace(distributed_optimizer=False))
    assert plain.total_bytes == 18 * 736
    assert megatron_state_bytes(StageParams(736, 0), par, trainable=False) == (1472, 0, 0, 0)


def test_tiny_activations_by_hand() -> None:
    # per token per layer (bf16, flash, no dropout): replicated 4·2·8 = 64; sharded 2·(8 + 8) + 2·8 + 3·2·16
    # + 4·2 (lse) = 32 + 16 + 96 + 8 = 152
    split = layer_split(TINY, 2)
    assert split == (64, 152)
    par = MegatronParallel(tp=2, pp=2, dp=1)
    acts = stage_activation_bytes(TINY, par, tokens_per_microbatch=10, num_microbatches=4, compute_bytes=2)
    # stage 0 holds min(pp, m) = 2 micro-batches of 2 layers; SP: (64 + 152)·10/2 = 1080 per layer-micro-batch
    # + input ids 8·10 per micro-batch
    assert acts.saved_bytes == 4 * 1080 + 2 * 80
    assert acts.backward_bytes == 2 * (3 * 16 * 10 // 2 + 8 * 10)
    assert acts.sp_gather_bytes == 2 * 8 * 10
    last = stage_activation_bytes(TINY, par, tokens_per_microbatch=10, num_microbatches=4, compute_bytes=2, stage=1)
    assert last.saved_bytes == 2 * 1080  # one micro-batch in flight on the last stage, no embedding


def test_full_recompute_uniform_and_block_by_hand() -> None:
    par = MegatronParallel(tp=2, pp=1, dp=1)
    kw = dict(tokens_per_microbatch=10, num_microbatches=1, compute_bytes=2)
    layer, layer_in = 1080, 2 * 8 * 10 // 2  # full layer and checkpointed input (SP-sharded) per micro-batch
    uni = stage_activation_bytes(TINY, par, recompute=Recompute("full", "uniform", 2), **kw)
    assert uni.saved_bytes == 2 * layer_in + 80 and uni.recompute_bytes == 2 * layer
    block = stage_activation_bytes(TINY, par, recompute=Recompute("full", "block", 1), **kw)
    assert block.saved_bytes == layer_in + 3 * layer + 80 and block.recompute_bytes == layer
    none = stage_activation_bytes(TINY, par, **kw)
    assert none.saved_bytes == 4 * layer + 80 and none.recompute_bytes == 0
    assert uni.saved_bytes < block.saved_bytes < none.saved_bytes


def test_interleaved_in_flight_is_megatrons_penalty() -> None:
    for p, v in ((2, 2), (4, 2), (8, 3), (4, 5)):
        L = p * v * 4
        flight = in_flight(L, MegatronParallel(pp=p, vpp=v), num_microbatches=10 * p)
        assert flight.chunk_microbatches * flight.layers_per_chunk == pytest.approx(L * (1 + (p - 1) / (p * v)))
    # fewer micro-batches than warm-up slots: everything is in flight, never more than m·v chunks
    few = in_flight(16, MegatronParallel(pp=4, vpp=2), num_microbatches=1)
    assert few.chunk_microbatches == 2
    # non-interleaved: stage r holds min(pp − r, m)
    assert [in_flight(16, MegatronParallel(pp=4), 8, r).chunk_microbatches for r in range(4)] == [4, 3, 2, 1]
    assert in_flight(16, MegatronParallel(pp=4), 2, 0).chunk_microbatches == 2


# ---------------------------------------------------------------------------------------------------------------
# Monotonicity and sharding
# ---------------------------------------------------------------------------------------------------------------


def test_more_tokens_more_bytes_more_sharding_fewer() -> None:
    shape = shape_of(spec("qwen2.5-7b"))
    base = dict(num_microbatches=8, compute_bytes=2)
    par = MegatronParallel(tp=2, pp=2)
    small = stage_activation_bytes(shape, par, tokens_per_microbatch=4096, **base)
    big = stage_activation_bytes(shape, par, tokens_per_microbatch=8192, **base)
    assert big.saved_bytes > small.saved_bytes and big.backward_bytes > small.backward_bytes
    wider = stage_activation_bytes(shape, par._replace(tp=4), tokens_per_microbatch=8192, **base)
    assert wider.saved_bytes < big.saved_bytes
    cp2 = stage_activation_bytes(shape, par._replace(cp=2), tokens_per_microbatch=8192, **base)
    assert cp2.saved_bytes == pytest.approx(big.saved_bytes / 2, rel=1e-3)
    no_sp = stage_activation_bytes(shape, par._replace(sequence_parallel=False), tokens_per_microbatch=8192, **base)
    assert no_sp.saved_bytes > big.saved_bytes
    selective = stage_activation_bytes(
        shape, par, tokens_per_microbatch=8192, recompute=Recompute("selective", modules=("core_attn", "mlp")), **base
    )
    full = stage_activation_bytes(
        shape, par, tokens_per_microbatch=8192, recompute=Recompute("full", "uniform", 1), **base
    )
    assert full.saved_bytes < selective.saved_bytes < big.saved_bytes
    for tp in (1, 2, 4, 8):
        states = [
            megatron_state_bytes(
                stage_params(shape, MegatronParallel(tp=tp, pp=pp, dp=2), 0), MegatronParallel(tp=tp, pp=pp, dp=2)
            )
            for pp in (1, 2, 4)
        ]
        assert states[0].total_bytes > states[1].total_bytes > states[2].total_bytes
    one = megatron_state_bytes(stage_params(shape, MegatronParallel(tp=2, dp=1), 0), MegatronParallel(tp=2, dp=1))
    eight = megatron_state_bytes(stage_params(shape, MegatronParallel(tp=2, dp=8), 0), MegatronParallel(tp=2, dp=8))
    assert eight.params_bytes == one.params_bytes and eight.grads_bytes == one.grads_bytes
    assert eight.adam_bytes == pytest.approx(one.adam_bytes / 8, rel=1e-6)


def test_moe_experts_split_over_ep_and_their_own_dp() -> None:
    moe = TransformerShape(
        hidden=64,
        q_dim=64,
        kv_dim=16,
        ffn=128,
        num_heads=4,
        num_layers=4,
        vocab=256,
        num_experts=8,
        moe_ffn=32,
        moe_topk=2,
    )
    ep1 = stage_params(moe, MegatronParallel(tp=1, dp=8), 0)
    ep4 = stage_params(moe, MegatronParallel(tp=1, ep=4, dp=8), 0)
    assert ep1.expert == 4 * 8 * 3 * 64 * 32 and ep4.expert == ep1.expert // 4 and ep4.dense == ep1.dense
    par = MegatronParallel(tp=1, ep=4, dp=8)
    states = megatron_state_bytes(ep4, par)
    # expert optimizer states shard over world / (etp·ep·pp) = 8 / 4 = 2; dense over dp = 8
    assert states.adam_bytes == 8 * (-(-ep4.dense // 8) + ep4.expert // 2)


# ---------------------------------------------------------------------------------------------------------------
# verl's offload semantics, logits, items
# ---------------------------------------------------------------------------------------------------------------


def test_verl_offload_loads_states_back_per_phase() -> None:
    states = megatron_state_bytes(StageParams(1000, 0), MegatronParallel(dp=2))
    kw = dict(param_offload=True, optimizer_offload=True, ref_param_offload=True)
    rollout = megatron_resident_items(states, 500, "rollout", **kw)
    assert sum(rollout.values()) == 0
    lp = megatron_resident_items(states, 500, "log_prob", **kw)
    assert lp["actor_params"] == 2000 and lp["actor_grads"] == 0  # load_grad=False
    ref = megatron_resident_items(states, 500, "ref_log_prob", **kw)
    assert ref == {
        "actor_params": 0,
        "actor_grads": 0,
        "optimizer_master_params": 0,
        "optimizer_states": 0,
        "ref_params": 500,
    }
    upd = megatron_resident_items(states, 500, "update", **kw)
    assert upd["actor_grads"] == 4000 and upd["optimizer_master_params"] == 2000 and upd["optimizer_states"] == 4000
    # without offload the DDP grad buffer is resident in every phase, unlike FSDP
    plain = megatron_resident_items(
        states, 500, "rollout", param_offload=False, optimizer_offload=False, ref_param_offload=False
    )
    assert plain["actor_grads"] == 4000 and sum(plain.values()) == states.total_bytes + 500
    host = megatron_host_items(states, 500, 8, **kw)
    assert host == {
        "actor_params_offloaded_pinned": 8 * 2000,
        "optimizer_offloaded": 8 * 6000,
        "ref_params_offloaded": 8 * 500,
    }
    with pytest.raises(ValueError):
        megatron_resident_items(states, 0, "generate", **kw)


def test_logits_variants() -> None:
    T, V, h = 1000, 1024, 64
    plain = megatron_logits_bytes(T, V, h, 1, compute_bytes=2, training=True)
    assert plain == T * V * 6
    assert megatron_logits_bytes(T, V, h, 4, compute_bytes=2, training=True) == T * V // 4 * 6
    assert megatron_logits_bytes(T, V, h, 1, compute_bytes=2, training=False, entropy=True) == T * V * 10
    assert megatron_logits_bytes(T, V, h, 1, compute_bytes=2, training=True, entropy=True) == T * V * 12
    fused = megatron_logits_bytes(T, V, h, 1, compute_bytes=2, training=False, fused=True)
    assert fused == T * (20 + 12 * 1)
    assert megatron_logits_bytes(0, V, h, 1, compute_bytes=2, training=True) == 0
    assert megatron_logits_bytes(2 * T, V, h, 1, compute_bytes=2, training=True) > plain


def test_update_peak_items_pick_the_larger_moment_and_sum() -> None:
    acts = stage_activation_bytes(
        TINY, MegatronParallel(tp=2, pp=2), tokens_per_microbatch=10, num_microbatches=4, compute_bytes=2, stage=1
    )
    first = update_peak_items(acts, logits_bytes=10_000, head_bytes=50, last_stage=True)
    assert first["logits"] == 10_000 and first["recompute_activations"] == 0
    small = update_peak_items(acts, logits_bytes=1, head_bytes=0, last_stage=True)
    assert small["logits"] == 0 and small["layer_backward_temporaries"] == acts.backward_bytes
    mid = update_peak_items(acts, logits_bytes=10_000, head_bytes=50, last_stage=False)
    assert mid["logits"] == 0 and sum(mid.values()) == sum(acts)


def test_forward_only_and_weight_export() -> None:
    par = MegatronParallel(tp=2, pp=1)
    # residual + LayerNorm output 2·2·8·10 / 2 = 160; (2·8 + 2·4 + 3·16)·2·10 / 2 = 720
    assert forward_only_bytes(TINY, par, tokens_per_microbatch=10, compute_bytes=2) == 160 + 720
    assert megatron_weight_export_bytes(1000, MegatronParallel(tp=1), 2) == 0
    assert megatron_weight_export_bytes(1000, MegatronParallel(tp=4), 2) == 4000
    assert megatron_weight_export_bytes(1000, MegatronParallel(tp=4, pp=2), 2) == 4000 + 500


def test_recompute_validation() -> None:
    with pytest.raises(ValueError):
        Recompute("everything").validated()
    with pytest.raises(ValueError):
        Recompute("full", "sideways", 1).validated()
    with pytest.raises(ValueError):
        Recompute("selective", modules=("moe_act",)).validated()
