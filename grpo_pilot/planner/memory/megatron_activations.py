"""Megatron-Core activation memory per pipeline stage (1F1B, interleaved VPP, SP, CP, recompute).

Per token per layer, bytes saved for backward with Transformer Engine layers and flash attention
(verl `override_transformer_config.attention_backend: flash`), compute dtype c (bf16: 2). Split as
Korthikanti et al. 2022 (arXiv 2205.05198, §4 and Table 2) into the part sequence parallelism shards
and the part tensor parallelism shards:

  replicated without SP (sharded by TP only with SP):
    4·c·h     the two LayerNorm inputs and their outputs (= the QKV and fc1 inputs)
    2·h       the attention-output and MLP-output dropout masks (1 byte each), only with dropout
  sharded by TP:
    c·(q + 2·kv)                    Q, K, V as the attention kernel saves them (GQA: kv < q)
    c·q                             the attention output (input of the output projection)
    c·(2·I + I) gated / c·(I + I)   fc1 output (gate and up: 2·I wide when gated) and the activation
                                    output (input of fc2)
    core attention: flash 4·a (fp32 log-sum-exp per head); unfused c·a·S (+ (c + 1)·a·S with attention
                    dropout), S the attended row length; 0 when `core_attn` is recomputed (selective)
For a GPT shape (MHA q = kv = h, GeLU I = 4h, dropout) and c = 2 this is exactly Megatron-LM's own
per-layer formula: with SP (18 + 4·I/h)·s·b·h / t (theoretical_memory_usage.py `compute_activation_memory`,
NVIDIA/Megatron-LM d98e8a64 L317–L319 — Table 2's 34/t with I = 4h), without SP (10 + 24/t)·s·b·h
(`compute_activation_memory_without_sp` L386). Differences by design, tested explicitly in
tests/planner/test_megatron_memory.py: Megatron's formula ignores GQA (K, V as wide as Q) and the
SwiGLU gate (it counts a GeLU MLP), always counts dropout masks, and has no term for flash's log-sum-exp;
Llama/Qwen have no dropout, GQA and SwiGLU, and we count what they save.

Selective recompute (`recompute_granularity: selective`, mcore `recompute_modules`, verl default
["core_attn"]): "core_attn" drops the core-attention term, "mlp" the fc1/activation outputs, "layernorm"
the two LayerNorm outputs (transformer_config.py `recompute_modules` docstring, d98e8a64 L560–L572).
Full recompute (megatron/core/recompute.py L157–L183, d98e8a64): `uniform` checkpoints the input of
every group of `recompute_num_layers` layers of a model chunk, `block` checkpoints the first
`recompute_num_layers` layers of a chunk one by one and stores the rest in full; a checkpointed layer
keeps only its input (c·h per token, / t with SP). During backward one group (uniform) or one layer
(block) is recomputed in full for the micro-batch being back-propagated.

Pipeline in flight (megatron/core/pipeline_parallel/schedules.py d98e8a64):
- PP = 1: one micro-batch at a time (forward_backward_no_pipelining).
- 1F1B without interleaving (L2276–L2279): stage r runs PP − r − 1 warm-up forwards, then holds one
  more in steady state: min(PP − r, m) micro-batches of ceil(L / PP) layers each.
- interleaved (VPP = v, `get_pp_rank_microbatches` L929–L987): warm-up (PP − r − 1)·2 + (v − 1)·g
  chunk-forwards (g = microbatch_group_size_per_vp_stage, default PP — model_parallel_config.py L567),
  plus one, capped at m·v; each chunk holds L / (PP·v) layers. For stage 0 and m·v large this is
  L·(1 + (PP − 1)/(PP·v)) layer-micro-batches: Megatron's "interleaved schedule memory penalty" (L341–L355).
The first stage also keeps, per in-flight micro-batch, the int64 input ids (8 bytes per token) and with
dropout the embedding-dropout mask (h bytes per token, / t with SP) (L329–L339). Context parallelism
splits a micro-batch's tokens over CP ranks (each rank holds T / CP; verl multiplies the per-GPU token
budget by CP, megatron_actor.py L223, so a rank sees the budget).

Logits on the last stage (verl unfused path, megatron_actor.py `logits_processor` b178a3cd L636–L660,
and mcore tensor_parallel/cross_entropy.py `calculate_logits_max`): the output layer's bf16 vocab-
parallel logits [T, V/t] and the fp32 copy `vocab_parallel_cross_entropy` makes (`.float()`), which it
keeps (exp'd and normalised in place) for backward: (c + 4)·T·V/t in forward and backward alike. With
entropy (`calculate_entropy`: old-log-prob passes, and updates with entropy_coeff ≠ 0) verl clones the
logits (c) and `_VocabParallelEntropy` keeps the logits and a softmax (c each; verl/utils/megatron/
tensor_parallel.py L109–L139): 3c + 4. Fused (`use_fused_kernels`, verl/utils/kernel/kernels.py
`efficient_entropy_forward` L599–L623): fp32 per-token statistics 20 bytes + 3 fp32 per 1024-vocab split;
backward (`_Split_Dlogits_N`, L1557–L1664): d_hidden and d_weight in the compute dtype and a [T, 9504]
d_logits chunk.
Forward-only passes (log-prob, reference; `forward_only=True`: every micro-batch "warm-up", nothing
saved) hold one layer's forward transient plus, on the last stage, the logits.
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.planner.memory.megatron import MegatronParallel, layers_on_stage
from grpo_pilot.planner.memory.shape import TransformerShape
from grpo_pilot.units import FP32_BYTES

FLASH_LSE_BYTES_PER_HEAD = FP32_BYTES  # flash attention's saved fp32 log-sum-exp per head and token
INPUT_ID_BYTES = 8  # int64 token ids the embedding keeps per in-flight micro-batch
DROPOUT_MASK_BYTES = 1  # a bool mask element
VERL_FUSED_VOCAB_SPLIT = 1024  # kernels.py efficient_entropy_forward: vocab_per_split
VERL_FUSED_DLOGITS_CHUNK = 9504  # kernels.py efficient_entropy_backward, _Split_Dlogits_N: vocab_per_split
VERL_FUSED_STAT_BYTES_PER_TOKEN = 5 * FP32_BYTES  # logprobs, entropy, maximum, accumulate + entropy_b
RECOMPUTE_GRANULARITIES = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
SELECTIVE_MODULES = ("core_attn", "mlp", "layernorm")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Recompute(NamedTuple):
    """verl `override_transformer_config.recompute_*` (defaults: none; modules ["core_attn"])."""

    granularity: str = "none"  # none | selective | full
    method: str = "uniform"  # uniform | block (full only)
    num_layers: int = 1  # recompute_num_layers (full only)
    modules: tuple[str, ...] = ("core_attn",)  # recompute_modules (selective only)

    def validated(self) -> "Recompute":
        if self.granularity not in RECOMPUTE_GRANULARITIES:
            raise ValueError(f"recompute granularity must be one of {RECOMPUTE_GRANULARITIES}")
        if self.granularity == "full" and (self.method not in RECOMPUTE_METHODS or self.num_layers < 1):
            raise ValueError("full recompute needs method uniform|block and recompute_num_layers >= 1")
        if self.granularity == "selective" and not set(self.modules) <= set(SELECTIVE_MODULES):
            raise ValueError(f"selective recompute modules must be among {SELECTIVE_MODULES}")
        return self


class LayerSplit(NamedTuple):
    """Bytes per token of one layer's saved activations, before any parallel division."""

    replicated_bytes: int  # sharded by TP only under sequence parallelism
    parallel_bytes: int  # always sharded by TP

    def per_rank_bytes(self, tokens: int, tp: int, sequence_parallel: bool) -> int:
        """Bytes one TP rank holds for `tokens` tokens."""
        sp = tp if (sequence_parallel and tp > 1) else 1
        return _ceil_div(self.replicated_bytes * tokens, sp) + _ceil_div(self.parallel_bytes * tokens, tp)


def layer_split(
    shape: TransformerShape,
    compute_bytes: int,
    *,
    attention: str = "flash",
    row_tokens: int = 0,
    recomputed_modules: tuple[str, ...] = (),
) -> LayerSplit:
    """Per-token bytes one layer saves for backward (module docstring), minus selectively recomputed modules."""
    c, h, q, kv = compute_bytes, shape.hidden, shape.q_dim, shape.kv_dim
    layernorm = 0 if "layernorm" in recomputed_modules else 2 * c * h
    replicated = 2 * c * h + layernorm + (2 * h * DROPOUT_MASK_BYTES if shape.dropout else 0)
    # fc1 output ((m − 1)·I wide: gate and up when gated) + the activation output (I) = m·I for m matrices
    mlp = 0 if "mlp" in recomputed_modules else c * shape.mlp_matrices * shape.ffn
    parallel = c * (q + 2 * kv) + c * q + mlp
    if "core_attn" not in recomputed_modules:
        parallel += _core_attention_bytes(shape, c, attention, row_tokens)
    return LayerSplit(replicated, parallel)


def _core_attention_bytes(shape: TransformerShape, c: int, attention: str, row_tokens: int) -> int:
    if attention == "flash":
        return FLASH_LSE_BYTES_PER_HEAD * shape.num_heads
    if attention == "unfused":
        per_score = c + ((c + DROPOUT_MASK_BYTES) if shape.dropout else 0)
        return per_score * shape.num_heads * row_tokens
    raise ValueError(f"attention must be 'flash' or 'unfused', got {attention!r}")


def layer_input_bytes(shape: TransformerShape, compute_bytes: int) -> LayerSplit:
    """A checkpointed layer's saved input: the hidden state, c·h per token (SP-sharded)."""
    return LayerSplit(compute_bytes * shape.hidden, 0)


class InFlight(NamedTuple):
    """Micro-batches a pipeline stage holds activations for at its peak."""

    chunk_microbatches: int  # outstanding (model-chunk, micro-batch) pairs
    layers_per_chunk: int
    embedding_microbatches: int  # micro-batches whose embedding inputs stage 0 still holds (0 elsewhere)


def in_flight(num_layers: int, par: MegatronParallel, num_microbatches: int, stage: int = 0) -> InFlight:
    """In-flight micro-batches of one stage under Megatron's schedules (module docstring)."""
    m, p, v = max(1, num_microbatches), par.pp, max(1, par.vpp)
    if p == 1:
        return InFlight(1, num_layers, 1)
    embed = min(p, m) if stage == 0 else 0
    if v == 1:
        return InFlight(min(p - stage, m), layers_on_stage(num_layers, p), embed)
    warmup = (p - stage - 1) * 2 + (v - 1) * p  # microbatch_group_size_per_vp_stage defaults to PP
    return InFlight(min(warmup + 1, m * v), _ceil_div(num_layers, p * v), embed)


class StageActivations(NamedTuple):
    """Activation items of one stage's update (bytes on one rank)."""

    saved_bytes: int  # activations of every in-flight micro-batch (and embedding inputs)
    recompute_bytes: int  # one group/layer recomputed during backward (full recompute)
    backward_bytes: int  # gradients flowing through the layer being back-propagated
    sp_gather_bytes: int  # the all-gathered LayerNorm output a TP linear works on (SP only)


def stage_activation_bytes(
    shape: TransformerShape,
    par: MegatronParallel,
    *,
    tokens_per_microbatch: int,
    num_microbatches: int,
    compute_bytes: int,
    recompute: Recompute = Recompute(),
    stage: int = 0,
    attention: str = "flash",
    row_tokens: int = 0,
) -> StageActivations:
    """Saved activations of one pipeline stage at its peak during the update (module docstring).

    `tokens_per_microbatch`: tokens of one micro-batch of one data-parallel rank before the CP split."""
    rc = recompute.validated()
    c, tp, sp = compute_bytes, par.tp, par.sequence_parallel
    tokens = _ceil_div(tokens_per_microbatch, par.cp)
    modules = rc.modules if rc.granularity == "selective" else ()
    full = layer_split(shape, c, attention=attention, row_tokens=row_tokens, recomputed_modules=modules)
    full_layer = full.per_rank_bytes(tokens, tp, sp)
    layer_in = layer_input_bytes(shape, c).per_rank_bytes(tokens, tp, sp)
    flight = in_flight(shape.num_layers, par, num_microbatches, stage)
    per_chunk, recompute_bytes = _chunk_bytes(flight.layers_per_chunk, full_layer, layer_in, rc)
    saved = flight.chunk_microbatches * per_chunk
    if flight.embedding_microbatches:
        mask = _ceil_div(shape.hidden * tokens, tp if (sp and tp > 1) else 1) if shape.dropout else 0
        saved += flight.embedding_microbatches * (INPUT_ID_BYTES * tokens + mask)
    backward = c * (_ceil_div(shape.mlp_matrices * shape.ffn * tokens, tp) + shape.hidden * tokens)
    gather = c * shape.hidden * tokens if (sp and tp > 1) else 0
    return StageActivations(saved, recompute_bytes, backward, gather)


def _chunk_bytes(layers: int, full_layer: int, layer_in: int, rc: Recompute) -> tuple[int, int]:
    """(saved bytes of one model chunk for one micro-batch, the recompute buffer in backward)."""
    if rc.granularity != "full":
        return layers * full_layer, 0
    n = min(rc.num_layers, layers)
    if rc.method == "uniform":
        return _ceil_div(layers, rc.num_layers) * layer_in, n * full_layer
    return n * layer_in + (layers - n) * full_layer, full_layer if n else 0


def megatron_logits_bytes(
    tokens: int,
    vocab: int,
    hidden: int,
    tp: int,
    *,
    compute_bytes: int,
    training: bool,
    entropy: bool = False,
    fused: bool = False,
) -> int:
    """Peak bytes of the last stage's log-prob (and entropy) computation for `tokens` tokens (module docstring)."""
    if tokens <= 0:
        return 0
    c, v_shard = compute_bytes, _ceil_div(vocab, tp)
    if fused:
        splits = _ceil_div(v_shard, VERL_FUSED_VOCAB_SPLIT)
        forward = tokens * (VERL_FUSED_STAT_BYTES_PER_TOKEN + 3 * FP32_BYTES * splits)
        if not training:
            return forward
        backward = c * tokens * hidden + c * v_shard * hidden + c * tokens * min(v_shard, VERL_FUSED_DLOGITS_CHUNK)
        return forward + backward
    per_element = (3 * c + FP32_BYTES) if entropy else (c + FP32_BYTES)
    if entropy and training:
        per_element += c  # the entropy gradient beside the saved softmax
    return tokens * v_shard * per_element


def forward_only_bytes(
    shape: TransformerShape, par: MegatronParallel, *, tokens_per_microbatch: int, compute_bytes: int
) -> int:
    """One layer's forward transient of a no-grad pass on one rank: the residual and LayerNorm output
    (c·h each, SP-sharded), Q/K/V and the attention output (TP-sharded), the MLP's fc1 and activation
    outputs (TP-sharded) — `vllm_budget.forward_bytes_per_token` with Megatron's SP."""
    tokens = _ceil_div(tokens_per_microbatch, par.cp)
    c, tp = compute_bytes, par.tp
    sp = tp if (par.sequence_parallel and tp > 1) else 1
    hidden = _ceil_div(2 * c * shape.hidden * tokens, sp)
    mlp = (3 if shape.gated_mlp else 2) * shape.ffn
    sharded = _ceil_div(c * (2 * shape.q_dim + 2 * shape.kv_dim + mlp) * tokens, tp)
    return hidden + sharded


def update_peak_items(
    activations: StageActivations, logits_bytes: int, head_bytes: int, *, last_stage: bool
) -> dict[str, int]:
    """Working-set items at the stage's update peak: on the last stage the larger of the logits moment
    (everything saved + logits + the final norm's tensors) and the layer-backward moment (saved +
    recompute + backward + SP gather); other stages have only the latter."""
    layer = {
        "activations": activations.saved_bytes,
        "recompute_activations": activations.recompute_bytes,
        "layer_backward_temporaries": activations.backward_bytes,
        "sp_all_gather": activations.sp_gather_bytes,
        "logits": 0,
    }
    if not last_stage:
        return layer
    logits = {
        "activations": activations.saved_bytes + head_bytes,
        "recompute_activations": 0,
        "layer_backward_temporaries": 0,
        "sp_all_gather": activations.sp_gather_bytes,
        "logits": logits_bytes,
    }
    return max((logits, layer), key=lambda m: sum(m.values()))
