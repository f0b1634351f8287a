"""The traced method: byte-exact tensor accounting of one GRPO update step on CPU, no GPU, no real memory.

Recipe (reference/memory-model.md §7): build the real HF model on the `meta` device, shard it with FSDP2
(`fully_shard` per decoder layer, then the root; MixedPrecisionPolicy param bf16 / reduce fp32) over a
`"fake"` process group of `world_size` ranks, `to_empty(device="cpu")` inside `FakeTensorMode`, and run
two training steps (forward, GRPO token log-prob loss, backward, AdamW step) under
`torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`. The peaks of the *second* step are read
(the first one creates the optimizer states). Every number is rank 0's.

The two adjustments torch 2.13 needs (DTensor shape propagation must not be counted; 512-B allocator
rounding on fake `cpu` tensors) and the rest of the torch plumbing live in `verify/fake_trace.py`.
`verify/compare.py` sets a trace beside the analytic update phase (`planner/estimate.py`).

`trace_update_step` is a function of plain values (a ModelSpec, the shard degree, the micro-batch's
sequences and tokens, checkpointing, dtypes, optimizer, entropy mode, layout) and knows nothing of plans.
torch is imported inside the functions: importing this module (and `grpo_pilot.planner`) never imports
torch.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.verify.fake_trace import (
    CUDA_MIN_BLOCK_BYTES,
    fake_process_group,
    hf_config_from_spec,
    reset_peak,
    snapshot_labels,
    torch_dtype,
    tracker_adjustments,
)
from grpo_pilot.profiles.spec import ModelSpec

OptimizerName = Literal["adamw", "adamw_fused"]
EntropyMode = Literal["none", "metric", "loss"]
# GRPO clip range of the surrogate (DeepSeekMath GRPO / PPO default epsilon 0.2, verl clip_ratio).
CLIP_EPS = 0.2

# Tracker label (FSDPMemTracker `_FSDPRefType` values) -> our category. Items of a category sum to it.
CATEGORY_OF_LABEL: dict[str, str] = {
    "Sharded Param": "parameters",
    "Buffer": "parameters",
    "Unsharded Param": "gathered_parameters",
    "All Gather": "gathered_parameters",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "Reduce Scatter": "gradients",
    "OptState": "optimizer",
    "Activation": "activations",
    "Inputs": "activations",
    "Temp": "temporaries",
}
CATEGORIES: tuple[str, ...] = (
    "parameters",
    "gathered_parameters",
    "gradients",
    "optimizer",
    "activations",
    "temporaries",
)


class TracedMemory(Frozen):
    """Rank 0's tensor bytes during the second update step, as the FSDP2 memory tracker saw them."""

    model_name: str = Field(description="ModelSpec.name of the traced model.")
    num_params: int = Field(gt=0, description="Parameters of the traced HF model (equals ModelSpec.num_params).")
    world_size: int = Field(ge=1, description="FSDP shard degree D (fake process group size).")
    micro_batch_seqs: int = Field(ge=1, description="Sequences in the traced micro-batch.")
    micro_batches_per_step: int = Field(
        ge=1, description="Micro-batches whose gradients accumulate before each optimizer step."
    )
    seq_len_tokens: int = Field(ge=1, description="Tokens per sequence (prompt + response).")
    scored_positions_per_seq: int = Field(
        ge=1, description="Positions per sequence whose logits are computed (logits_to_keep)."
    )
    packed: bool = Field(
        description="One packed row with per-sequence position ids (block-causal mask under SDPA) "
        "instead of [B, S] rows."
    )
    gradient_checkpointing: bool = Field(description="HF activation checkpointing on every decoder layer.")
    param_dtype: str = Field(description="Compute dtype of gathered parameters (MixedPrecisionPolicy.param_dtype).")
    master_dtype: str = Field(description="Dtype of the sharded master parameters, gradients and Adam states.")
    optimizer: OptimizerName = Field(description="'adamw' (foreach, PyTorch's CUDA default) or 'adamw_fused'.")
    entropy: EntropyMode = Field(description="Entropy of the logits: 'none', 'metric' (no grad) or 'loss' (with grad).")
    peak_bytes: int = Field(ge=0, description="Peak of step 2 (max of the forward/backward and optimizer-step peaks).")
    peak_at: Literal["forward_backward", "optimizer_step"] = Field(description="Where the peak happened.")
    peak_labels: dict[str, int] = Field(description="Tracker label -> bytes at the peak; sums to peak_bytes.")
    forward_backward_labels: dict[str, int] = Field(description="Tracker label -> bytes at the forward/backward peak.")
    optimizer_step_labels: dict[str, int] = Field(description="Tracker label -> bytes at the optimizer-step peak.")
    optimizer_state_bytes: int = Field(
        ge=0, description="Optimizer states resident after the step (Adam m, v, step counters)."
    )
    optimizer_step_counter_bytes: int = Field(
        ge=0, description="Of which AdamW's scalar `step` tensors (host-side on CUDA unless fused)."
    )
    trace_s: float = Field(ge=0.0, description="Wall time of the trace.")

    @property
    def tokens(self) -> int:
        return self.micro_batch_seqs * self.seq_len_tokens

    @property
    def forward_backward_peak_bytes(self) -> int:
        return sum(self.forward_backward_labels.values())

    @property
    def optimizer_step_peak_bytes(self) -> int:
        return sum(self.optimizer_step_labels.values())

    def categories(self, labels: dict[str, int] | None = None) -> dict[str, int]:
        """Group tracker labels (default: those at the peak) into CATEGORIES; the sum is unchanged."""
        out = dict.fromkeys(CATEGORIES, 0)
        for label, value in (self.peak_labels if labels is None else labels).items():
            out[CATEGORY_OF_LABEL.get(label, "temporaries")] += value
        return out


def grpo_token_loss(logits: Any, target_ids: Any, *, entropy: EntropyMode) -> Any:
    """GRPO surrogate on the scored positions, through our engine's unfused log-prob path.

    logits [B, k, V] (param dtype) -> `engine.algos.logprobs.token_logprobs` (fp32 logits / temperature,
    gather of the target minus logsumexp) -> logp [B, k]; ratio = exp(logp - old_logp) with
    old_logp = logp.detach() (first PPO epoch, on-policy); loss = token-mean of
    -min(ratio·A, clip(ratio, 1±eps)·A) with A = 1 (any A gives the same memory) plus the k3 KL estimator
    against a reference log-prob (use_kl_loss). `entropy`: "none"; "metric" = the entropy computed
    without a gradient, as our engine's update always does for its metrics (a forward transient of
    fp32 copies of the logits); "loss" = the entropy bonus with a gradient (entropy_coeff > 0).
    """
    import torch

    from grpo_pilot.engine.algos.logprobs import entropy_from_logits, token_logprobs

    logp = token_logprobs(logits, target_ids)
    ratio = torch.exp(logp - logp.detach())
    surrogate = torch.minimum(ratio, torch.clamp(ratio, 1.0 - CLIP_EPS, 1.0 + CLIP_EPS))
    ref_logp = (
        logp.detach() - 0.01
    )  # stand-in reference log-probs: [B, k] like the real ones; values do not change memory
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1.0
    loss = (kl - surrogate).mean()
    if entropy == "metric":
        with torch.no_grad():
            entropy_from_logits(logits)
    elif entropy == "loss":
        loss = loss - 0.01 * entropy_from_logits(logits).mean()  # any coefficient > 0: same graph, same memory
    return loss


def _micro_batch(vocab_size: int, seqs: int, seq_len: int, scored: int, packed: bool) -> tuple[dict[str, Any], Any]:
    """Model keyword inputs of one micro-batch and the target ids of its scored positions (fake tensors).

    [B, S] rows: `logits_to_keep = scored` (the last positions of every row) -> targets [B, scored].
    Packed: input_ids [1, B·S], position_ids restarting every S tokens, `logits_to_keep` = the index of
    the last `scored` positions of each sequence (what the engine's actor passes) -> targets [1, B·scored].
    """
    import torch

    if not packed:
        input_ids = torch.randint(0, vocab_size, (seqs, seq_len))
        return {"input_ids": input_ids, "logits_to_keep": scored}, input_ids[:, seq_len - scored :]
    tokens = seqs * seq_len
    input_ids = torch.randint(0, vocab_size, (1, tokens))
    position_ids = (torch.arange(tokens) % seq_len).unsqueeze(0)
    starts = torch.arange(seqs) * seq_len + (seq_len - scored - 1)
    keep = (starts.unsqueeze(1) + torch.arange(scored).unsqueeze(0)).reshape(-1).clamp(min=0)
    return {"input_ids": input_ids, "position_ids": position_ids, "logits_to_keep": keep}, input_ids[:, keep + 1]


def trace_update_step(
    model_spec: ModelSpec,
    *,
    world_size: int,
    micro_batch_seqs: int,
    seq_len_tokens: int,
    gradient_checkpointing: bool,
    param_dtype: str = "bfloat16",
    master_dtype: str = "float32",
    optimizer: OptimizerName = "adamw",
    entropy: EntropyMode = "none",
    micro_batches_per_step: int = 2,
    scored_positions_per_seq: int | None = None,
    packed: bool = False,
) -> TracedMemory:
    """Trace two FSDP2 update steps of `model_spec` on rank 0 of `world_size` and return step 2's peaks.

    Each step accumulates gradients over `micro_batches_per_step` micro-batches of `micro_batch_seqs` ×
    `seq_len_tokens` tokens, then takes one AdamW step. Layout: `packed=False` = a [B, S] batch with
    no mask (SDPA causal) — our engine's SDPA layout for full-length sequences (right-padded rows,
    engine/actor.py) and TRL's without padding; `packed=True` = ONE row of B·S tokens with position
    ids restarting per sequence, so transformers builds a block-causal mask (the cost of packing
    without a varlen kernel; the engine packs only under flash-attention, which does not run on
    cpu). With 2 or more, the second micro-batch's backward runs with every sharded
    gradient resident — the usual GRPO peak (a PPO mini-batch holds several micro-batches).
    `scored_positions_per_seq`: positions per sequence whose logits are computed (HF `logits_to_keep`,
    the last k of each sequence): None = every position (verl scores the whole packed row), the response length for our
    engine and TRL. Seconds for a full-size 7B model; no real memory is used.
    """
    scored = seq_len_tokens if scored_positions_per_seq is None else scored_positions_per_seq
    if min(world_size, micro_batch_seqs, seq_len_tokens, micro_batches_per_step, scored) < 1 or scored > seq_len_tokens:
        raise InputError(
            "world_size, micro_batch_seqs, seq_len_tokens, micro_batches_per_step and "
            "scored_positions_per_seq must be >= 1 "
            f"(got {world_size}, {micro_batch_seqs}, {seq_len_tokens}, {micro_batches_per_step}, {scored}).",
            "Pass positive sizes, with scored_positions_per_seq <= seq_len_tokens.",
        )
    if entropy not in ("none", "metric", "loss"):
        raise InputError(f"Unknown entropy mode '{entropy}'.", "Use 'none', 'metric' or 'loss'.")
    if optimizer not in ("adamw", "adamw_fused"):
        raise InputError(f"Unknown optimizer '{optimizer}'.", "Use 'adamw' (foreach) or 'adamw_fused'.")
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    compute = torch_dtype(param_dtype, "param_dtype")
    master = torch_dtype(master_dtype, "master_dtype")
    started = time.perf_counter()
    config = hf_config_from_spec(model_spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=master, attn_implementation="sdpa")
    num_params = sum(p.numel() for p in model.parameters())
    if num_params != model_spec.num_params:
        raise InputError(
            f"transformers built {num_params} parameters for '{model_spec.name}' but its spec counts "
            f"{model_spec.num_params}.",
            f"The spec's flags (qkv_bias={model_spec.qkv_bias}, qk_norm={model_spec.qk_norm}) do not match "
            f"what the '{model_spec.model_type}' class builds.",
        )
    if gradient_checkpointing:
        # verl and TRL both pass use_reentrant=False.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    with tracker_adjustments(), fake_process_group(world_size) as mesh, FakeTensorMode(allow_non_fake_inputs=True):
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        model.to_empty(device="cpu")
        kind = {"fused": True} if optimizer == "adamw_fused" else {"foreach": True}
        optim = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01, **kind)
        inputs, targets = _micro_batch(model_spec.vocab_size, micro_batch_seqs, seq_len_tokens, scored, packed)
        tracker = FSDPMemTracker(model, optim)
        tracker.track_inputs((inputs,))

        def loss_of_step() -> Any:
            # a function, so the logits are not referenced from here during backward
            logits = model(**inputs, use_cache=False).logits
            return grpo_token_loss(logits, targets, entropy=entropy)

        with tracker:
            for _step in range(2):
                reset_peak(tracker)
                for _ in range(micro_batches_per_step):
                    tracker.reset_mod_stats()  # the tracker refuses a second forward of a module otherwise
                    loss_of_step().backward()
                fwd_bwd = snapshot_labels(tracker.get_tracker_snapshot("peak"))
                reset_peak(tracker)
                optim.step()
                opt_step = snapshot_labels(tracker.get_tracker_snapshot("peak"))
                optim.zero_grad(set_to_none=True)
            after = snapshot_labels(tracker.get_tracker_snapshot("current"))
        counters = sum(
            -(-v.untyped_storage().nbytes() // CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES
            for state in optim.state.values()
            for k, v in state.items()
            if k == "step" and isinstance(v, torch.Tensor)
        )
    fb_total, opt_total = sum(fwd_bwd.values()), sum(opt_step.values())
    peak_at: Literal["forward_backward", "optimizer_step"] = (
        "forward_backward" if fb_total >= opt_total else "optimizer_step"
    )
    return TracedMemory(
        model_name=model_spec.name,
        num_params=num_params,
        world_size=world_size,
        micro_batch_seqs=micro_batch_seqs,
        micro_batches_per_step=micro_batches_per_step,
        seq_len_tokens=seq_len_tokens,
        scored_positions_per_seq=scored,
        packed=packed,
        gradient_checkpointing=gradient_checkpointing,
        param_dtype=param_dtype,
        master_dtype=master_dtype,
        optimizer=optimizer,
        entropy=entropy,
        peak_bytes=max(fb_total, opt_total),
        peak_at=peak_at,
        peak_labels=fwd_bwd if peak_at == "forward_backward" else opt_step,
        forward_backward_labels=fwd_bwd,
        optimizer_step_labels=opt_step,
        optimizer_state_bytes=after.get("OptState", 0),
        optimizer_step_counter_bytes=counters,
        trace_s=time.perf_counter() - started,
    )
