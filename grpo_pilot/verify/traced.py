"""The traced method: byte-exact tensor accounting of our engine's own GRPO step on CPU — no GPU, no memory.

Recipe (reference/memory-model.md §7), run through the engine's actor (`engine.actor.Actor`):
the real HF model is built on the `meta` device; `Actor(...)` shards it with FSDP2 exactly as a
training worker does (one unit per decoder layer and the `ScoredLogProbs` root, MixedPrecisionPolicy
bf16/fp32 under CUDA numerics) over a `"fake"` process group of `world_size` ranks; inside a
FakeTensorMode the shards are materialised on the `cpu` device (`to_empty`) and the actor then runs

  1. its optimizer's first step on zero gradients (the AdamW states a real step 1 creates),
  2. the old-policy log-prob pass and the reference pass (`actor.log_probs`), when the step has them,
  3. one update (`actor.update`): its own micro-batching, log-prob kernel (plain logits or the fused
     chunked head), GRPO loss with KL and entropy terms, backward, grad clipping and AdamW step,

under `torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`, reading each phase's peak (rank 0).
`numerics="cuda"` makes the actor compute as on a GPU (bf16 mixed precision, bf16 reference, foreach
AdamW) on the fake cpu tensors; `"cpu"` as on the cpu pseudo-device (fp32, fused AdamW).

The update is fed at most two micro-batches' worth of sequences: with two, the second one's backward
runs with every sharded gradient resident — the update's peak whatever the number of micro-batches.
The log-prob passes are fed one micro-batch (a forward-only pass peaks inside one).

The adjustments torch 2.13 needs and the host-sync placeholder live in `verify/fake_trace.py`;
`verify/compare.py` sets a trace beside the analytic estimate. One training rank without offload is
not sharded by the engine: its fp32 weights are used in place under bf16 autocast. That rank is traced
without FSDP (`verify/single_rank.py`: the model built in the fake mode, torch's unsharded `MemTracker`
with autocast's parameter casts labelled apart) and, under CUDA numerics, with CUDA's autocast cast
policy applied to the cpu tensors (`verify/cuda_autocast.py`). Samples come in GRPO groups of
`group_size` completions of one prompt, as the step loop hands them over, so the unsharded actor's
shared-prompt forward (engine/shared_prefix.py) runs where the engine's would. torch is imported inside
the functions: importing this module (and `grpo_pilot.planner`) never imports torch.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, Literal, NamedTuple

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.verify.cuda_autocast import cuda_autocast_policy
from grpo_pilot.verify.fake_trace import (
    fake_process_group,
    gpu_attention_masks,
    hf_config_from_spec,
    host_sync_fake_mode,
    instrument_extra_root,
    reset_module_stats_on_root_forward,
    reset_peak,
    rounded_storage_bytes,
    snapshot_labels,
    tracker_adjustments,
)
from grpo_pilot.verify.single_rank import build_fake_model, cast_labelling_tracker, fake_module_moves

Numerics = Literal["cuda", "cpu"]
# The FSDP2 warning about a view returned by the root (the actor's flat log-prob tensor): harmless here.
_VIEW_WARNING = "FSDP2-wrapped module"


class PassTrace(Frozen):
    """Rank 0's tensor bytes at the peak of one pass, by memory-tracker label."""

    peak_bytes: int = Field(ge=0, description="Peak tensor bytes of the pass.")
    labels: dict[str, int] = Field(description="FSDPMemTracker label -> bytes at the peak; sums to peak_bytes.")


class UpdateTrace(PassTrace):
    """The update's peak, and the peaks before and during the optimizer step."""

    peak_at: Literal["forward_backward", "optimizer_step"]
    forward_backward_labels: dict[str, int] = Field(description="Labels at the forward/backward peak.")
    optimizer_step_labels: dict[str, int] = Field(description="Labels at the optimizer-step peak.")


class ActorTrace(Frozen):
    """What the traced GRPO step held on rank 0, phase by phase."""

    model_name: str
    num_params: int = Field(gt=0, description="Parameters of the traced HF model (equals ModelSpec.num_params).")
    world_size: int = Field(ge=1, description="FSDP shard degree (fake process group size); 1: unsharded.")
    numerics: Numerics = Field(description="Whose numerics the actor followed (cuda: bf16 mixed precision).")
    prompt_len_tokens: int = Field(ge=1)
    response_len_tokens: int = Field(ge=1)
    update_seqs: int = Field(ge=1, description="Sequences fed to the traced update (at most two micro-batches).")
    update_micro_batches: int = Field(ge=1, description="Micro-batches the actor made of them.")
    log_prob_seqs: int = Field(ge=0, description="Sequences fed to each log-prob pass (one micro-batch).")
    group_size: int = Field(ge=1, description="Completions per prompt among the samples (GRPO's n).")
    shared_forwards: int = Field(ge=0, description="Forwards that ran the shared-prompt layout (unsharded).")
    gradient_checkpointing: bool
    fused_logprob: bool
    entropy_grad: bool = Field(description="The entropy bonus carries a gradient (entropy_coeff > 0).")
    with_ref: bool = Field(description="A reference model was built (KL loss).")
    policy_shard_bytes: int = Field(ge=0, description="The policy's fp32 shard on this rank.")
    ref_shard_bytes: int = Field(ge=0, description="The reference model's shard on this rank.")
    optimizer_state_bytes: int = Field(ge=0, description="AdamW states after the step (m, v, step counters).")
    update: UpdateTrace
    old_log_prob: PassTrace | None = Field(default=None, description="The old-policy pass (None: not run).")
    ref_log_prob: PassTrace | None = Field(default=None, description="The reference pass (None: no KL loss).")
    trace_s: float = Field(ge=0.0, description="Wall time of the trace.")

    @property
    def update_tokens_per_micro_batch(self) -> int:
        """Tokens the actor fed per update micro-batch (each sequence's last token is not fed)."""
        seqs = -(-self.update_seqs // self.update_micro_batches)
        return seqs * (self.prompt_len_tokens + self.response_len_tokens - 1)

    @property
    def log_prob_tokens(self) -> int:
        """Tokens fed to each log-prob pass (one micro-batch)."""
        return self.log_prob_seqs * (self.prompt_len_tokens + self.response_len_tokens - 1)

    @property
    def log_prob(self) -> PassTrace | None:
        """The larger of the log-prob passes (what the log_prob phase peaks at)."""
        passes = [p for p in (self.old_log_prob, self.ref_log_prob) if p is not None]
        return max(passes, key=lambda p: p.peak_bytes) if passes else None


def _samples(*, count: int, prompt_len: int, response_len: int, vocab: int, offset: int, group: int = 1) -> list[Any]:
    """`count` full-length samples in groups of `group` completions of one prompt (the step loop's order:
    a group's samples are consecutive); prompts and completions otherwise distinct (values do not change
    memory, which prompts repeat does: the unsharded actor computes a repeated prompt once)."""
    from grpo_pilot.engine.actor import Sample

    out = []
    for i in range(count):
        g = (offset + i) // group
        prompt = [(g * prompt_len + j) % vocab for j in range(prompt_len)]
        base = (offset + i) * response_len + 7
        out.append(Sample(tuple(prompt), tuple((base + j) % vocab for j in range(response_len))))
    return out


def _pass(tracker: Any, run: Any) -> PassTrace:
    reset_peak(tracker)
    run()
    labels = snapshot_labels(tracker.get_tracker_snapshot("peak"))
    return PassTrace(peak_bytes=sum(labels.values()), labels=labels)


def _check(spec: ModelSpec, world_size: int, settings: Any, counts: tuple[int, int, int, int]) -> None:
    if world_size < 1 or min(counts[:3]) < 1 or counts[3] < 0:
        raise InputError(
            f"The trace needs a world size, lengths and an update batch >= 1 (got {world_size}, {counts}).",
            "Pass positive sizes.",
        )
    if settings.offload:
        raise InputError(
            "The traced method does not follow offloaded states (FSDP2 CPUOffloadPolicy moves them to host RAM).",
            "Compare a plan without param_offload / optimizer_offload.",
        )


class _Step(NamedTuple):
    """What one traced GRPO step feeds the actor (see `trace_actor_step`)."""

    loss: Any
    prompt: int
    response: int
    vocab: int
    update_seqs: int
    log_prob_seqs: int
    old_pass: bool
    group: int


def trace_actor_step(
    model_spec: ModelSpec,
    *,
    world_size: int,
    settings: Any,
    loss: Any,
    prompt_len_tokens: int,
    response_len_tokens: int,
    update_seqs: int,
    log_prob_seqs: int = 0,
    old_pass: bool = False,
    numerics: Numerics = "cuda",
    group_size: int = 1,
) -> ActorTrace:
    """Trace one GRPO step of the engine's actor on rank 0 of `world_size` (module docstring).

    `settings` is the actor's `ActorSettings` (micro-batching, checkpointing, log-prob kernel; `with_ref`
    builds the reference model and runs its pass), `loss` its `LossSettings`. Every sample is
    `prompt_len_tokens` + `response_len_tokens` long, in groups of `group_size` completions of one prompt;
    the update gets `update_seqs` of them (give at most two micro-batches' worth), each log-prob pass
    `log_prob_seqs` (one micro-batch; 0 = no pass). `old_pass` runs the old-policy pass (the step has
    several mini-batches or epochs). One rank (`world_size` 1) is traced unsharded, as the engine runs it.
    """
    _check(model_spec, world_size, settings, (prompt_len_tokens, response_len_tokens, update_seqs, log_prob_seqs))
    started = time.perf_counter()
    step = _Step(
        loss,
        prompt_len_tokens,
        response_len_tokens,
        model_spec.vocab_size,
        update_seqs,
        log_prob_seqs,
        old_pass,
        max(1, group_size),
    )
    config = hf_config_from_spec(model_spec)
    with warnings.catch_warnings(), gpu_attention_masks():
        warnings.filterwarnings("ignore", message=_VIEW_WARNING)
        warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
        if world_size == 1:
            num_params, result, shards = _trace_unsharded(
                model_spec, config, settings=settings, step=step, numerics=numerics
            )
        else:
            num_params, result, shards = _trace_sharded(
                model_spec, config, world_size=world_size, settings=settings, step=step, numerics=numerics
            )
    return ActorTrace(
        model_name=model_spec.name,
        num_params=num_params,
        world_size=world_size,
        numerics=numerics,
        prompt_len_tokens=prompt_len_tokens,
        response_len_tokens=response_len_tokens,
        update_seqs=update_seqs,
        log_prob_seqs=log_prob_seqs if (old_pass or settings.with_ref) else 0,
        group_size=step.group,
        gradient_checkpointing=settings.gradient_checkpointing,
        fused_logprob=settings.fused_logprob,
        entropy_grad=loss.entropy_coeff != 0.0,
        with_ref=settings.with_ref,
        policy_shard_bytes=shards[0],
        ref_shard_bytes=shards[1],
        trace_s=time.perf_counter() - started,
        **result,
    )


def _counted(spec: ModelSpec, model: Any) -> int:
    """The built model's parameter count, which must be the spec's."""
    num_params = sum(p.numel() for p in model.parameters())
    if num_params != spec.num_params:
        raise InputError(
            f"transformers built {num_params} parameters for '{spec.name}' but its spec counts {spec.num_params}.",
            f"The spec's flags (qkv_bias={spec.qkv_bias}, qk_norm={spec.qk_norm}) do not match "
            f"what the '{spec.model_type}' class builds.",
        )
    return num_params


def _shards(actor: Any) -> tuple[int, int]:
    ref = rounded_storage_bytes(actor.ref.parameters()) if actor.ref is not None else 0
    return rounded_storage_bytes(actor.policy.parameters()), ref


def _trace_sharded(
    spec: ModelSpec, config: Any, *, world_size: int, settings: Any, step: _Step, numerics: Numerics
) -> tuple[int, dict[str, Any], tuple[int, int]]:
    """FSDP2 over a fake process group: the model on `meta`, its shards materialised in the fake mode."""
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from transformers import AutoModelForCausalLM

    from grpo_pilot.engine.actor import Actor

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    num_params = _counted(spec, model)
    with tracker_adjustments(), fake_process_group(world_size):
        actor = Actor(
            model, device=torch.device("cpu"), settings=settings, world_size=world_size, rank=0, numerics=numerics
        )
        roots = tuple(r for r in (actor.scorer, actor.ref_scorer) if r is not None)
        with host_sync_fake_mode():
            for root in roots:
                root.to_empty(device="cpu")  # FSDP2 swaps the shards in place: the optimizer keeps its params
            tracker = FSDPMemTracker(actor.scorer, actor.optimizer)
            hook = reset_module_stats_on_root_forward(tracker, roots)
            try:
                with tracker:
                    if actor.ref_scorer is not None:
                        instrument_extra_root(tracker, actor.ref_scorer)
                    result = _run_step(actor, tracker, settings, step)
            finally:
                hook.remove()
            shards = _shards(actor)
        actor.close()
    return num_params, result, shards


def _trace_unsharded(
    spec: ModelSpec, config: Any, *, settings: Any, step: _Step, numerics: Numerics
) -> tuple[int, dict[str, Any], tuple[int, int]]:
    """One rank, weights in place (verify/single_rank.py), CUDA's autocast policy under CUDA numerics."""
    import torch

    from grpo_pilot.engine.actor import Actor

    policy = cuda_autocast_policy() if numerics == "cuda" else contextlib.nullcontext()
    with tracker_adjustments(), host_sync_fake_mode(), policy:
        model = build_fake_model(config)
        num_params = _counted(spec, model)
        with fake_module_moves():
            actor = Actor(model, device=torch.device("cpu"), settings=settings, world_size=1, rank=0, numerics=numerics)
        roots = tuple(r for r in (actor.scorer, actor.ref_scorer) if r is not None)
        tracker = cast_labelling_tracker()
        tracker.track_external(*roots, actor.optimizer)
        hook = reset_module_stats_on_root_forward(tracker, roots)
        try:
            with tracker:
                result = _run_step(actor, tracker, settings, step)
        finally:
            hook.remove()
        shards = _shards(actor)
    return num_params, result, shards


def _run_step(actor: Any, tracker: Any, settings: Any, step: _Step) -> dict[str, Any]:
    """Steps 1–3 of the module docstring inside the tracker; the peaks and what stays resident."""
    import torch

    optim = actor.optimizer
    for p in actor.policy.parameters():  # step 1: the states AdamW creates at its first step
        p.grad = torch.zeros_like(p)
    optim.step()
    optim.zero_grad(set_to_none=True)
    out: dict[str, Any] = {"old_log_prob": None, "ref_log_prob": None}
    prompt, response = step.prompt, step.response
    lp_samples = _samples(
        count=step.log_prob_seqs, prompt_len=prompt, response_len=response, vocab=step.vocab, offset=0, group=step.group
    )
    if step.old_pass and step.log_prob_seqs:
        out["old_log_prob"] = _pass(tracker, lambda: actor.log_probs(lp_samples))
    if settings.with_ref and step.log_prob_seqs:
        out["ref_log_prob"] = _pass(tracker, lambda: actor.log_probs(lp_samples, ref=True))
    offset = -(-step.log_prob_seqs // step.group) * step.group  # the update's groups start afresh
    samples = _samples(
        count=step.update_seqs,
        prompt_len=prompt,
        response_len=response,
        vocab=step.vocab,
        offset=offset,
        group=step.group,
    )
    # what the step loop hands the update: one advantage per sample, fp32 [r] log-probs per sample (the
    # old pass's with several mini-batches, the reference pass's with the KL loss); values do not matter
    advantages = torch.ones(len(samples))
    old = [torch.zeros(response) for _ in samples] if step.old_pass else None
    ref = [torch.zeros(response) for _ in samples] if settings.with_ref else None
    peaks: dict[str, dict[str, int]] = {}

    def before_step(*_: Any) -> None:
        peaks["forward_backward"] = snapshot_labels(tracker.get_tracker_snapshot("peak"))
        reset_peak(tracker)

    def after_step(*_: Any) -> None:
        peaks["optimizer_step"] = snapshot_labels(tracker.get_tracker_snapshot("peak"))

    handles = (optim.register_step_pre_hook(before_step), optim.register_step_post_hook(after_step))
    metrics: dict[str, float] = {}
    try:
        reset_peak(tracker)
        metrics = actor.update(samples, advantages, step.loss, old_logprobs=old, ref_logprobs=ref)
    finally:
        for handle in handles:
            handle.remove()
    after = snapshot_labels(tracker.get_tracker_snapshot("current"))
    fb, opt = peaks["forward_backward"], peaks["optimizer_step"]
    at: Literal["forward_backward", "optimizer_step"] = (
        "forward_backward" if sum(fb.values()) >= sum(opt.values()) else "optimizer_step"
    )
    labels = fb if at == "forward_backward" else opt
    out["update"] = UpdateTrace(
        peak_bytes=sum(labels.values()),
        labels=labels,
        peak_at=at,
        forward_backward_labels=fb,
        optimizer_step_labels=opt,
    )
    out["update_micro_batches"] = int(metrics.get("num_micro_batches", 1))
    out["optimizer_state_bytes"] = after.get("OptState", after.get("Optstate", 0))
    out["shared_forwards"] = actor.shared_forwards
    return out
