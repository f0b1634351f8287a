"""The hf rollout's memory (estimate.py builds the phases from it): which module decodes, the decode loop's working
set (memory/hf_generate.py), and — for our engine's replica — the replica's weights and its weight-sync transient.

Which module (planner/hf_decode_mode.py `hf_replica`): the trainer's own (one unsharded rank, or verl's / TRL's
HF rollout on their gathered module), or our engine's replica, built once per rollout worker and never freed:
- its weights: engine/worker.py `_build_rollout` builds the model and moves it with
  `.to(device=self.device, dtype=torch.bfloat16 if self.device.type == "cuda" else torch.float32)`, so
  `hf_replica_weights` = P × (2 on a GPU, 4 on the cpu device) bytes (tied embeddings are one parameter:
  `ModelSpec.num_params`). `HFRollout.sleep` drops only the static loop's weight copy, and `close` (end of run)
  the module: the replica stays resident through every phase. Colocated, it sits beside the trainer's states in
  weight_sync, rollout, log_prob and update (`resident_replica`); split, on the rollout GPU, which reports
  rollout and weight_sync only (estimate.py module docstring);
- its decode: unsharded, in its own dtype — no FSDP gathers, no autocast weight cast (the weights already are bf16;
  on the cpu device there is no autocast), a KV cache in that dtype (the eager loop's and the prefill's: bf16
  keys and values from bf16 weights), and no static-loop weight copy (engine/rollout/static_step.py
  `DecodeWeights` aliases a parameter already in the step dtype, `rollout_dtype`: bf16 on CUDA, the module's own
  on the CPU; `HFRollout.weight_copy_bytes` = 0), so `hf_decode_weight_copy` is 0;
- its weight sync (`replica_transfer`): `HFRollout.sync_weights` copies each (name, tensor) into the replica in
  place (`target.copy_(tensor)`). Colocated, every training rank walks `weight_sync.policy_weights` through
  `buckets`: each parameter gathered in full in the master dtype (`DTensor.full_tensor()`; tied parameters under
  each name, `named_parameters(remove_duplicate=False)`, so gathered twice), held in a bucket until the bucket
  would pass `weight_sync_bucket_bytes`, at which point the bucket and the parameter just gathered are live
  (`weight_sync.buckets`): at most min(all gathered bytes, bucket + largest tensor). An unsharded trainer's
  `param.detach()` allocates nothing. The same-device fp32 → bf16 `copy_` casts in its kernel. Split, the
  training rank puts each bucket into the Ray object store (`to_host`: host copies) and the rollout worker loads it
  from host memory: PyTorch's blocking host-to-device `copy_` converts the dtype on the host ("For blocking
  transfers conversions are performed on CPU to avoid allocating extra GPU memory": aten/src/ATen/native/cuda/
  Copy.cu `copy_kernel_cuda`), so the rollout GPU holds only the replica. Not counted: a LoRA policy's merge
  temporaries (engine/lora.py `merged_linear_weight`: B·A and the sum, one linear at a time).
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.planner.hf_decode_mode import planned_decode_mode
from grpo_pilot.planner.memory.autocast import head_weight_cast
from grpo_pilot.planner.memory.context import MemoryContext
from grpo_pilot.planner.memory.hf_generate import HfGenerate, hf_generate_memory, static_decode_memory
from grpo_pilot.planner.memory.kv_cache import kv_bytes_per_token_per_gpu
from grpo_pilot.planner.memory.shared_prompts import groups_spanned
from grpo_pilot.planner.memory.tokens import sequences_per_sp_group
from grpo_pilot.planner.memory.vllm_budget import forward_bytes_per_token
from grpo_pilot.planner.memory.weight_sync import largest_param_elements
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import BF16_BYTES, FP32_BYTES

REPLICA_ITEM = "hf_replica_weights"


def decode_mode(ctx: MemoryContext) -> str:
    """The loop the plan's hf rollout runs (planner/hf_decode_mode.py)."""
    return planned_decode_mode(
        knobs=ctx.knobs,
        device=ctx.device,
        model_type=ctx.model.model_type,
        executor=ctx.executor,
        sharded=ctx.sharded,
        adapters=ctx.lora is not None,
        replica=ctx.hf_replica_bytes > 0,
    )


class _Dtypes(NamedTuple):
    """Element sizes of one decode: the static step's weights and buffers, the eager loop's and the prefill's KV
    cache, whether autocast casts the LM head, and the static loop's weight copy."""

    step_bytes: int
    cache_bytes: int
    head_cast: bool
    weight_copy_bytes: int


def _dtypes(ctx: MemoryContext) -> _Dtypes:
    """The replica's (module docstring), or the trainer's module: on a GPU the fp32 policy under autocast (an fp32
    cache: memory/hf_generate.py) and a bf16 step on a copy of the weights (engine/rollout/hf.py `rollout_dtype`);
    on the cpu device the weights' own dtype, without a copy."""
    if ctx.hf_replica_bytes:
        own = ctx.hf_replica_bytes // ctx.model.num_params
        return _Dtypes(own, own, False, 0)
    master, c = ctx.precision.master_bytes, ctx.precision.compute_bytes
    step = BF16_BYTES if ctx.device.kind == "cuda" else master
    return _Dtypes(
        step_bytes=step,
        cache_bytes=FP32_BYTES if ctx.autocast else c,
        head_cast=ctx.autocast,
        weight_copy_bytes=step * ctx.model.num_params if master != step else 0,
    )


class HfDecode(NamedTuple):
    generate: HfGenerate  # the decode call's peak moment, by item
    weight_copy_bytes: int  # the static loop's weight copy (weight_sync and rollout phases; 0: none)
    graph_pool_bytes: int  # CUDA graphs' private pool, reserved through the call (0 without graphs)


def hf_decode(ctx: MemoryContext, batch: int) -> HfDecode:
    """One decode call over `batch` rows: the static loop's memory or the eager loop's (memory/hf_generate.py), in
    the decoding module's dtypes (`_dtypes`)."""
    m, w, c = ctx.model, ctx.workload, ctx.precision.compute_bytes
    d, mode = _dtypes(ctx), decode_mode(ctx)
    shape = dict(
        batch_seqs=batch,
        prompt_seqs=groups_spanned(batch, w.n),
        prompt_tokens=w.prompt_len_tokens,
        response_tokens=w.response_len_tokens,
        prefill_bytes_per_token=_unsharded_forward_bytes_per_token(m, c),
        vocab=m.vocab_size,
        head_cast_bytes=head_weight_cast(m, c) if d.head_cast else 0,
    )
    cache = kv_bytes_per_token_per_gpu(m, 1, d.cache_bytes)
    if mode == "eager":  # buffers sized for the maximum lengths
        return HfDecode(hf_generate_memory(kv_bytes_per_token=cache, compute_bytes=c, **shape), 0, 0)  # type: ignore[arg-type]
    static = static_decode_memory(
        kv_bytes_per_token=kv_bytes_per_token_per_gpu(m, 1, d.step_bytes),
        prefill_kv_bytes_per_token=cache,  # the prefill runs the module itself, as the eager loop does
        layers=m.num_layers,
        compute_bytes=d.step_bytes,
        weight_copy_bytes=d.weight_copy_bytes,
        graphs=mode == "cuda_graph",
        **shape,  # type: ignore[arg-type]
    )
    return HfDecode(static.generate, static.weight_copy_bytes, static.graph_pool_bytes)


def rollout_rows(ctx: MemoryContext) -> int:
    """Rows of one decode call: the GPU's share of the step's responses (`hf_decode_mode.hf_rollout_gpus`), capped
    by `max_num_seqs`."""
    share = sequences_per_sp_group(ctx.workload.responses_per_step, ctx.hf_rollout_gpus, 1)
    return min(ctx.knobs.max_num_seqs, share)


def resident_replica(ctx: MemoryContext) -> dict[str, int]:
    """The colocated replica on a training GPU, in every phase (module docstring); none split or without one."""
    return {REPLICA_ITEM: ctx.hf_replica_bytes} if ctx.hf_replica_bytes and not ctx.layout.split else {}


def replica_transfer(ctx: MemoryContext) -> dict[str, int]:
    """The training rank's weight-sync transient into the replica (module docstring): the gathered bucket, and the
    parameter gathered past it when the weights do not fit one bucket."""
    if not ctx.sharded:
        return {}
    m, master = ctx.model, ctx.precision.master_bytes
    tied = m.embedding_params if m.tie_word_embeddings else 0
    gathered = master * (m.num_params + tied)
    bucket = ctx.overheads.weight_sync_bucket_bytes
    largest = master * largest_param_elements(m.vocab_size, m.hidden_size, m.intermediate_size, m.q_dim)
    return {"weight_sync_bucket": min(bucket, gathered), "largest_gathered_tensor": largest if gathered > bucket else 0}


def _unsharded_forward_bytes_per_token(m: ModelSpec, compute_bytes: int) -> int:
    """A prefill's working bytes per token on one unsharded module (memory/vllm.py's formula)."""
    return forward_bytes_per_token(
        hidden=m.hidden_size,
        q_dim=m.q_dim,
        kv_dim=m.kv_dim,
        intermediate=m.intermediate_size,
        tensor_parallel=1,
        compute_bytes=compute_bytes,
    )
