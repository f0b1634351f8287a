"""The actor: policy + optimizer + frozen reference behind a small interface the step loop calls.

    actor.log_probs(samples, ref=False) -> list[Tensor[r_i]]      no grad; old-policy or reference pass
    actor.update(samples, advantages, ...) -> metrics             one optimizer step over a mini-batch
    actor.state_dict() / actor.load_state_dict(...)               checkpoints (engine/dist_checkpoint.py)

One rank or many. With `world_size` > 1 (the training ranks of engine/workers.py, the default
torch.distributed group) or with offload, the policy is sharded with FSDP2 (engine/sharding.py) and
each rank gets its share of a mini-batch (balanced by tokens, engine/partition.py): every micro-batch
loss uses the *whole* mini-batch's token and sequence counts (`global_num_tokens`,
`global_num_seqs`) and the gradients are summed across ranks (not averaged), so N ranks compute the
1-process update. FSDP2 forwards are collectives: every rank runs the same number of micro-batches
(`micro_batches.equalise_bins`), padding with zero-weight dummies; the metrics are summed across ranks.
Sharded, the shared-prompt forward is off (it calls the layers' pieces, not the FSDP units).

Micro-batch layout (`micro_batch_layout`), chosen from the model's attention implementation:
- "padded" (SDPA / eager attention, the default; CPU and GPU): each micro-batch is one [k, W] batch of
  its k sequences, RIGHT-padded to the longest of them (W = its length − 1, see below), no attention
  mask and default position ids. Padding sits after every real token, so plain causal attention
  (SDPA `is_causal`, no mask tensor at all) already keeps it out of every real position: the
  log-probs are those of the sequence alone. What runs on padding: every layer's forward and
  backward over the k·W − Σ(n_i − 1) pad positions (their outputs are never scored, so their
  gradient is zero, but the FLOPs are spent). To keep that small, sequences are sorted by length
  before they are grouped, so a micro-batch holds sequences of similar length; `update` reports the
  share as `padding_frac`. A token budget bounds k × the longest length (what memory sees).
  (Eager attention builds a [k, W, W] causal mask; SDPA and flash none.)
  Shared prompts: when a padded micro-batch holds several completions of one prompt (a GRPO group)
  and the model is Llama-family (`shared_prefix_unsupported`), the forward computes each distinct
  prompt once and lets its completions attend to it (engine/shared_prefix.py): U·P + k·R positions
  instead of k·W, the same log-probs and gradients (`share_prompts=False` turns it off).
- "packed" (flash-attention 2/3, which take variable-length sequences): every micro-batch is ONE
  row — the sequences concatenated, `position_ids` restarting at 0 for each, no attention mask;
  transformers' flash path turns the resets into varlen boundaries (`_is_packed_sequence`). No
  padding at all. (With SDPA this layout would make transformers build a block-causal [T, T] mask
  per layer — attention cost and memory quadratic in the micro-batch's tokens — hence "padded".)
Either way a sequence's last token is not fed to the model (its output predicts nothing we score),
and only the final hidden states at the positions that predict response tokens go through the LM
head (plain, or chunked when the plan says `fused_logprob`). With `max_token_len_per_gpu` (dynamic
batching) micro-batches hold at most that many tokens (padded: k·longest; packed: first-fit
decreasing); otherwise `micro_batch_size_per_gpu` sequences (padded: length-sorted; packed:
consecutive). A padded micro-batch is cut further where separate forwards save more padding than
they cost (`micro_batches.split_by_padding`); `num_micro_batches` counts the forwards that ran.

Gradient accumulation is exact: every micro-batch loss uses the mini-batch's token and sequence
counts as denominators (`policy_loss(global_num_tokens=, global_num_seqs=)`), so the summed
gradient equals the mini-batch gradient. Then grad-norm clipping and AdamW.

Adapters (`settings.adapter`, engine/lora.py): peft LoRA / DoRA layers are put into the policy in place;
only their parameters require grad and reach AdamW, the reference pass is the policy's own forward with
the adapters disabled (no reference copy), and checkpoints hold the adapters and their optimizer states
(`lora.checkpoint_states`). A bitsandbytes-quantized base (engine/qlora.py) stays where transformers loaded it.

Precision: fp32 master weights everywhere; on CUDA the forward computes in bf16 (autocast unsharded,
FSDP2 `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` sharded) and the reference model is
a bf16 copy; on CPU everything is fp32. AdamW runs the fused kernel on CUDA and on the host.

No host reads per micro-batch: index tensors reach the device through pinned, non-blocking copies
(engine/host_copy.py), the loss inputs are built by one scatter each, the decoder of a Llama-family
model is run without transformers' per-forward packed-sequence check (`padded_hidden`), and the
metrics accumulate on the device (`MetricSums`) and are read back once per mini-batch, with the
gradient norm.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from grpo_pilot.engine import sharding
from grpo_pilot.engine.algos.logprobs import chunked_token_logprobs, entropy_from_logits, token_logprobs
from grpo_pilot.engine.algos.policy_loss import policy_loss_terms
from grpo_pilot.engine.finite import FLOAT32_HINT, NonFiniteError
from grpo_pilot.engine.host_copy import to_device
from grpo_pilot.engine.lora import attach_adapters, checkpoint_states, load_states
from grpo_pilot.engine.loss_rows import MetricSums, loss_rows
from grpo_pilot.engine.micro_batches import equalise_bins, plan_micro_batches
from grpo_pilot.engine.qlora import is_quantized
from grpo_pilot.engine.rollout.llama_step import unsupported_reason
from grpo_pilot.engine.settings import ActorSettings
from grpo_pilot.engine.sharding import all_reduce_max, all_reduce_sum, release_process_group
from grpo_pilot.engine.shared_prefix import prefix_batch, shared_prefix_hidden, shared_prefix_unsupported
from grpo_pilot.kernels import FUSED_LOGPROB_CHUNK_TOKENS
from grpo_pilot.models import Frozen


@dataclass(frozen=True)
class Sample:
    """One completion with its prompt; `truncated` = cut at the length cap (DAPO overlong filtering)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    truncated: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


class LossSettings(Frozen):
    """The `policy_loss` keywords of a run (see grpo_pilot.engine.algos.policy_loss)."""

    loss_agg_mode: str = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_c: float | None = 3.0
    ratio_level: str = "token"
    kl_coef: float = 0.0
    kl_type: str = "k3"
    entropy_coeff: float = 0.0
    loss_scale_len: int | None = None
    mask_truncated: bool = False


def micro_batch_layout(model: torch.nn.Module) -> str:
    """'packed' when the model runs a flash-attention kernel (varlen from position-id resets), else 'padded'."""
    from transformers.utils.generic import is_flash_attention_requested

    config = getattr(model, "config", None)
    return "packed" if config is not None and is_flash_attention_requested(config) else "padded"


def per_sample(flat: Tensor, samples: Sequence[Sample]) -> list[Tensor]:
    """Split a sample-major [Σ r_i] tensor into one [r_i] tensor per sample."""
    return list(flat.split([len(s.response_ids) for s in samples]))


DUMMY = Sample((0,), (0,))  # what a rank without data feeds so that its collectives still run (zero weight)


def micro_batch_loss(rows: Any, loss: LossSettings, *, num_tokens: int, num_seqs: int) -> tuple[Tensor, Any]:
    """`policy_loss_terms` of one micro-batch's rows under the whole mini-batch's token and sequence counts."""
    return policy_loss_terms(
        rows.lp,
        rows.old,
        rows.adv,
        rows.mask,
        loss_agg_mode=loss.loss_agg_mode,
        clip_low=loss.clip_low,
        clip_high=loss.clip_high,
        clip_c=loss.clip_c,
        ref_logprobs=rows.ref,
        kl_coef=loss.kl_coef,
        kl_type=loss.kl_type,
        ratio_level=loss.ratio_level,
        entropy=rows.ent,
        entropy_coeff=loss.entropy_coeff,
        loss_scale_len=loss.loss_scale_len,
        global_num_tokens=max(num_tokens, 1),
        global_num_seqs=max(num_seqs, 1),
    )


def padded_hidden(model: torch.nn.Module, input_ids: Tensor) -> Tensor:
    """Final (normed) hidden states [k, W, h] of right-padded rows with default positions and causal attention.

    Llama-family models with SDPA run their decoder's modules in its own order (embeddings, rotary, each layer with
    no mask — SDPA's `is_causal` —, final norm): what `model.model(...)` computes, since for right padding, default
    positions and SDPA transformers' `create_causal_mask` returns None; but that call first asks, on the host, whether
    the default positions describe packed sequences (transformers masking_utils.find_packed_sequence_indices, an
    `.all()` read per forward), which made the host wait for the GPU at every micro-batch. The layers are still
    called as modules (their FSDP2 and checkpointing wrappers run); any other model runs its own forward."""
    decoder: Any = model.get_decoder()
    if unsupported_reason(model, allow_sharded=True, allow_adapters=True) is not None:
        return decoder(input_ids=input_ids, use_cache=False).last_hidden_state
    h = decoder.embed_tokens(input_ids)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    rotary = decoder.rotary_emb(h, positions)
    for layer in decoder.layers:
        h = layer(h, attention_mask=None, position_embeddings=rotary, position_ids=positions, use_cache=False)
    return decoder.norm(h)


class ScoredLogProbs(torch.nn.Module):
    """`forward(samples)` -> per-sample response log-probs (and entropies) of `model`, in one forward.

    A module so that, sharded, it is the FSDP2 root: its forward gathers the root's parameters
    (embeddings, final norm, LM head) around everything below, the decoder's own forward gathers
    each layer.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        device: torch.device,
        temperature: float,
        fused: bool,
        share_prompts: bool,
        autocast_dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        self.model = model
        self.device = device
        self.temperature = temperature
        self.fused = fused
        self.share_prompts = share_prompts and shared_prefix_unsupported(model) is None
        self.autocast_dtype = autocast_dtype
        self.shared_forwards = 0  # micro-batches that ran the shared-prompt forward

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def forward(  # type: ignore[override]
        self, samples: Sequence[Sample], with_entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[Tensor, Tensor | None, int, int]:
        """Response log-probs (and entropies) [Σ r_i], sample-major, from one forward of the micro-batch
        `samples`, in the layout of `micro_batch_layout(model)`; also the positions computed (padding
        included) and the real ones among them. (Flat tensors, not per-sample views: FSDP2 hooks the
        outputs of its root for backward, and a view's in-place use would drop that hook.)

        Entropies carry a gradient only with `entropy_grad` (else they are a metric and keep no graph).
        """
        entropy: Tensor | None = None
        with self._autocast():
            hidden, target_ids, computed, real = self._scored_hidden(samples)
            head = self.model.get_output_embeddings()
            if self.fused:
                logprobs, entropy = chunked_token_logprobs(
                    hidden,
                    head.weight.to(hidden.dtype),
                    target_ids,
                    temperature=self.temperature,
                    chunk_tokens=FUSED_LOGPROB_CHUNK_TOKENS,
                    with_entropy=with_entropy,
                )
            else:
                logits = head(hidden)
                logprobs = token_logprobs(logits, target_ids, temperature=self.temperature)
                if with_entropy:
                    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
                        entropy = entropy_from_logits(logits, temperature=self.temperature)
        return logprobs, entropy, computed, real

    def _scored_hidden(self, samples: Sequence[Sample]) -> tuple[Tensor, Tensor, int, int]:
        """Final hidden states [N, h] at the N = Σ r_i positions that predict response tokens, the target
        ids [N] (sample-major), the positions computed (k·W padded, Σ(n_i − 1) packed, U·P + k·R shared)
        and how many of them are real tokens (not padding).

        The logits at position t − 1 predict token t, so a sequence of n tokens feeds its first n − 1.
        """
        model, device = self.model, self.device
        layout = micro_batch_layout(model)
        if layout == "padded" and self.share_prompts and len({s.prompt_ids for s in samples}) < len(samples):
            shared = prefix_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples], device)
            self.shared_forwards += 1
            return shared_prefix_hidden(model, shared), shared.targets, shared.computed_positions, shared.real_positions
        fed = sum(s.num_tokens - 1 for s in samples)
        rows: list[int] = []
        cols: list[int] = []
        targets: list[int] = []
        if layout == "packed":
            ids: list[int] = []
            pos: list[int] = []
            for s in samples:
                n, p = s.num_tokens, len(s.prompt_ids)
                cols.extend(range(len(ids) + p - 1, len(ids) + n - 1))
                ids.extend((s.prompt_ids + s.response_ids)[:-1])
                pos.extend(range(n - 1))
                targets.extend(s.response_ids)
            input_ids = to_device([ids], dtype=torch.long, device=device)
            position_ids = to_device([pos], dtype=torch.long, device=device)
            out = model.get_decoder()(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
            computed = len(ids)
            hidden = out[0, to_device(cols, dtype=torch.long, device=device)]
        else:
            width = max(s.num_tokens for s in samples) - 1
            # right padding with id 0 (any valid id: causal attention keeps pads out of real positions)
            batch = [list((s.prompt_ids + s.response_ids)[:-1]) for s in samples]
            for b, (s, row) in enumerate(zip(samples, batch)):
                p = len(s.prompt_ids)
                rows.extend([b] * len(s.response_ids))
                cols.extend(range(p - 1, s.num_tokens - 1))
                targets.extend(s.response_ids)
                row.extend([0] * (width - len(row)))
            input_ids = to_device(batch, dtype=torch.long, device=device)
            out = padded_hidden(model, input_ids)
            computed = len(samples) * width
            hidden = out[
                to_device(rows, dtype=torch.long, device=device), to_device(cols, dtype=torch.long, device=device)
            ]
        return hidden, to_device(targets, dtype=torch.long, device=device), computed, fed


def _placed(policy: torch.nn.Module, device: torch.device, *, sharded: bool) -> torch.nn.Module:
    """The policy in fp32 master weights: on `device`, or (sharded) where it was built, `fully_shard` moving each
    rank's shards; a bitsandbytes-quantized base stays as loaded (on its device; transformers refuses `.to(dtype)`)."""
    if is_quantized(policy):
        return policy
    if sharded:
        return policy.to(dtype=torch.float32)
    return policy.to(device=device, dtype=torch.float32)


class Actor:
    """Owns the policy (fp32 master), its AdamW optimizer, and the frozen reference (initial policy).

    `world_size` / `rank`: this actor's place among the training ranks (the default torch.distributed
    group must already hold them when `world_size` > 1).
    `numerics`: the device type whose numerics the actor follows — compute dtype (bf16 autocast or FSDP2
    mixed precision on "cuda", fp32 on "cpu"), the reference copy's dtype and the AdamW kernel (fused on
    CUDA devices and the host; foreach for CUDA numerics on a cpu device); None = `device.type`. The traced
    method (grpo_pilot/verify) runs the CUDA numerics on fake cpu tensors.
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        *,
        device: torch.device,
        settings: ActorSettings,
        world_size: int = 1,
        rank: int = 0,
        numerics: str | None = None,
    ) -> None:

        self.device = device
        self.settings = settings
        self.world_size, self.rank = world_size, rank
        self.sharded = world_size > 1 or settings.offload
        # sharded: the full model stays where it was built (host RAM) and `fully_shard` moves each rank's
        # shards to the device (or keeps them on the host with offload): no full copy on the accelerator
        self.policy = _placed(policy, device, sharded=self.sharded)
        self.policy.config.use_cache = False
        # peft adapters, in place (self.policy is still the transformers model); None = full fine-tuning
        self.peft = attach_adapters(self.policy, settings.adapter) if settings.adapter is not None else None
        numerics = numerics or device.type
        compute_dtype = torch.bfloat16 if numerics == "cuda" else None
        ref: torch.nn.Module | None = None
        if settings.with_ref and self.peft is None:  # frozen copy of the initial policy; bf16 on GPU (as planned)
            ref = copy.deepcopy(self.policy).eval().requires_grad_(False)
            if compute_dtype is not None:
                ref = ref.to(compute_dtype)
            if settings.ref_param_offload and device.type == "cuda" and not self.sharded:
                ref = ref.to("cpu")
        if settings.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

        def scorer(model: torch.nn.Module) -> ScoredLogProbs:
            return ScoredLogProbs(
                model,
                device=device,
                temperature=settings.temperature,
                fused=settings.fused_logprob,
                share_prompts=settings.share_prompts and not self.sharded,
                autocast_dtype=None if self.sharded else compute_dtype,
            )

        self.scorer = scorer(self.policy)
        self.ref_scorer = scorer(ref) if ref is not None else None
        self._own_group = False
        if self.sharded:
            self._own_group = sharding.ensure_process_group(world_size, device)
            mixed = compute_dtype is not None
            sharding.shard(
                self.scorer, self.policy, device=device, offload=settings.offload, mixed_precision=mixed, train=True
            )
            if self.ref_scorer is not None:
                sharding.shard(
                    self.ref_scorer,
                    ref,
                    device=device,
                    offload=settings.ref_param_offload,
                    mixed_precision=mixed,
                    train=False,
                )
        # The fused kernel wherever the step really runs: on the host (cpu runs, offloaded states: one vectorised
        # in-place pass per tensor, no temporaries; ~3x faster than the default single-tensor loop for small
        # models) and on CUDA devices (`_fused_adamw_`: one kernel per dtype/device group instead of foreach's
        # several passes and its parameter-sized temporary lists; torchtitan's default optimizer implementation,
        # torchtitan/config/job_config.py Optimizer.implementation = "fused", works on FSDP2's DTensor shards).
        # The traced method (CUDA numerics on fake cpu tensors, grpo_pilot/verify) keeps foreach, the kernel the
        # planner's optimizer-step item still models for GPUs (planner/memory/optimizer.py): there the plan is an
        # upper bound by the foreach temporaries (profile.json notes it).
        on_host = numerics == "cpu" or settings.optimizer_offload or settings.param_offload
        self.fused_adamw = on_host or device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            self.trainable_parameters(),
            lr=settings.lr,
            betas=(settings.adam_beta1, settings.adam_beta2),
            weight_decay=settings.weight_decay,
            fused=True if self.fused_adamw else None,
            foreach=True if numerics == "cuda" and not self.fused_adamw else None,
        )

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What AdamW updates: every parameter, or the adapters only (peft froze the rest)."""
        return [p for p in self.policy.parameters() if p.requires_grad]

    @property
    def ref(self) -> torch.nn.Module | None:
        return self.ref_scorer.model if self.ref_scorer is not None else None

    @property
    def prompt_sharing(self) -> tuple[str, ...]:
        """Which models ("policy", "ref") run the shared-prompt forward on grouped micro-batches."""
        scorers = (("policy", self.scorer), ("ref", self.ref_scorer))
        return tuple(name for name, s in scorers if s is not None and s.share_prompts)

    @property
    def shared_forwards(self) -> int:
        """Training/log-prob micro-batches that ran the shared-prompt forward."""
        return sum(s.shared_forwards for s in (self.scorer, self.ref_scorer) if s is not None)

    # -- collectives (no-ops on one rank) ------------------------------------------------------------
    def _bins(
        self, lengths: list[int], *, max_tokens: int | None, max_seqs: int | None, padded: bool
    ) -> list[list[int]]:
        """Micro-batches of this rank; with several ranks, as many on each as the rank that needs most."""
        bins = plan_micro_batches(
            lengths, max_tokens=max_tokens, max_seqs=max_seqs, padded=padded, split_padding=padded
        )
        if self.world_size == 1:
            return bins

        return equalise_bins(bins, all_reduce_max(len(bins), self.device), lengths)

    def _all_reduce_sum(self, values: Tensor) -> Tensor:
        if self.world_size == 1:
            return values

        return all_reduce_sum(values)

    @contextlib.contextmanager
    def _ref_on_device(self) -> Iterator[ScoredLogProbs]:
        if self.peft is not None:  # the reference is the base: the policy's forward with its adapters off
            with self.peft.disable_adapter():
                yield self.scorer
            return
        assert self.ref_scorer is not None
        ref = self.ref_scorer.model
        offloaded = not self.sharded and next(ref.parameters()).device != self.device
        if offloaded:
            ref.to(self.device)
        try:
            yield self.ref_scorer
        finally:
            if offloaded:
                ref.to("cpu")

    # -- the interface -------------------------------------------------------------------------
    @torch.no_grad()
    def log_probs(self, samples: Sequence[Sample], *, ref: bool = False) -> list[Tensor]:
        """Response log-probs [r_i] per sample under the current policy (or the reference); no grad.

        Micro-batches of at most `log_prob_max_token_len` tokens (padding included), in the
        layout of `micro_batch_layout(model)`.
        """
        out: list[Tensor | None] = [None] * len(samples)
        with self._ref_on_device() if ref else contextlib.nullcontext(self.scorer) as scorer:
            model = scorer.model
            padded = micro_batch_layout(model) == "padded"
            lengths = [s.num_tokens for s in samples]
            bins = self._bins(lengths, max_tokens=self.settings.log_prob_max_token_len, max_seqs=None, padded=padded)
            was_training = model.training
            model.eval()
            try:
                for b in bins:
                    mb = [samples[i] for i in b] if b else [DUMMY]
                    flat, _, _, _ = scorer(mb, with_entropy=False)
                    for i, lp in zip(b, per_sample(flat, mb)):
                        out[i] = lp.float()
            finally:
                model.train(was_training)
                if self.sharded:
                    # FSDP2 keeps a root's parameters gathered after its forward (its backward would
                    # re-gather them at once: torch/distributed/fsdp/_fully_shard/_fsdp_state.py
                    # `_lazy_init`); a no-grad pass has no backward to free them, so the embeddings and
                    # lm_head (2 GiB in bf16 for a 7B model) stayed gathered into the next pass and the
                    # update. Found by the traced method (grpo-plan --verify).
                    scorer.reshard()
        return out  # type: ignore[return-value]

    def update(
        self,
        samples: Sequence[Sample],
        advantages: Tensor,
        loss: LossSettings,
        *,
        old_logprobs: Sequence[Tensor] | None = None,
        ref_logprobs: Sequence[Tensor] | None = None,
        global_num_tokens: int | None = None,
        global_num_seqs: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step on this mini-batch (this rank's share of it); returns the mini-batch's summed
        losses and token-weighted statistics (over every rank: the same dict on each).

        `advantages` [len(samples)]; `old_logprobs` None = on-policy (the detached current log-probs).
        `global_num_tokens` / `global_num_seqs`: trained response tokens and sequences of the whole
        mini-batch over all ranks (None = this rank's own, right for one rank).
        """
        self.policy.train()
        lengths = [s.num_tokens for s in samples]
        padded = micro_batch_layout(self.policy) == "padded"
        st = self.settings
        bins = self._bins(
            lengths,
            max_tokens=st.max_token_len,
            max_seqs=None if st.dynamic_batching else st.micro_batch_size,
            padded=padded,
        )
        trained = [not (loss.mask_truncated and s.truncated) for s in samples]
        num_tokens = sum(len(s.response_ids) for s, t in zip(samples, trained) if t)
        if global_num_tokens is None:
            global_num_tokens = num_tokens
        if global_num_seqs is None:
            global_num_seqs = len(samples)
        adv = to_device(advantages, dtype=torch.float32, device=self.device)  # once, not per micro-batch
        sums = MetricSums()
        computed_total = real_total = 0
        for b in bins:
            mb = [samples[i] for i in b] if b else [DUMMY]
            # entropy is always reported; it carries a gradient only when entropy_coeff != 0
            flat_lp, flat_ent, computed, real = self.scorer(
                mb, with_entropy=True, entropy_grad=loss.entropy_coeff != 0.0
            )
            if b:
                computed_total += computed
                real_total += real
            rows = loss_rows(
                mb,
                [trained[i] for i in b] if b else [False],  # the dummy of an empty rank trains no token
                flat_lp=flat_lp,
                flat_ent=flat_ent if loss.entropy_coeff != 0.0 or flat_ent is None else flat_ent.detach(),
                adv=adv.index_select(0, to_device(b, dtype=torch.long, device=self.device)) if b else adv.new_zeros(1),
                old=torch.cat([old_logprobs[i] for i in b]) if old_logprobs is not None and b else None,
                ref=torch.cat([ref_logprobs[i] for i in b]) if ref_logprobs is not None and b else None,
                with_ref=ref_logprobs is not None,
            )
            total, stats = micro_batch_loss(rows, loss, num_tokens=global_num_tokens, num_seqs=global_num_seqs)
            total.backward()
            sums.add(stats)  # on the device: nothing is read back per micro-batch
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), st.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # DTensor (FSDP2): the global norm, replicated
            grad_norm = grad_norm.full_tensor()
        if not bool(torch.isfinite(grad_norm)):  # the same global norm on every rank: all stop before the step
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(
                f"The gradient norm is {float(grad_norm)}: the loss or its gradient overflowed.", FLOAT32_HINT
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        counts = to_device([float(computed_total), float(real_total), float(num_tokens)], dtype=torch.float64,
                           device=self.device)  # fmt: skip
        out = sums.read(counts, grad_norm, self._all_reduce_sum)  # the mini-batch's one host read
        computed_total, real_total, total_tokens = out.pop("computed"), out.pop("real"), out.pop("tokens")
        out.update(
            num_micro_batches=float(len(bins)),
            num_tokens=total_tokens,
            padding_frac=(computed_total - real_total) / computed_total if computed_total else 0.0,
        )
        return out

    def close(self) -> None:
        """Release the one-process group this actor made for FSDP2 (offload on one rank), if any."""
        if self._own_group:
            release_process_group()
            self._own_group = False

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """{"model": ..., "optimizer": ...}: plain tensors on one unsharded rank, DTensor shards when sharded; with
        adapters only theirs (engine/lora.py `checkpoint_states`)."""
        if not self.sharded and self.peft is None:
            return {"model": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}
        model, optim = checkpoint_states(self.policy, self.optimizer)
        return {"model": model, "optimizer": optim}

    def load_state_dict(self, model: dict[str, Any], optimizer: dict[str, Any]) -> None:
        if not self.sharded and self.peft is None:
            self.policy.load_state_dict(model)
            self.optimizer.load_state_dict(optimizer)
            return
        load_states(self.policy, self.optimizer, model, optimizer)
