"""The actor: policy + optimizer + frozen reference behind a small interface the step loop calls.

    actor.log_probs(samples, ref=False) -> list[Tensor[r_i]]      no grad; old-policy or reference pass
    actor.update(samples, advantages, ...) -> metrics             one optimizer step over a mini-batch
    actor.state_dict() / actor.load_state_dict(...)               checkpoints

The same calls can later run on N workers (FSDP2 + Ray) with the samples sharded; nothing here
assumes one process beyond `torch.nn.Module` ownership.

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

Precision: fp32 master weights everywhere; on CUDA the forward runs under bf16 autocast and the
reference model is a bf16 copy; on CPU everything is fp32.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from grpo_pilot.engine.algos.dapo import mask_truncated
from grpo_pilot.engine.algos.logprobs import chunked_token_logprobs, entropy_from_logits, token_logprobs
from grpo_pilot.engine.algos.policy_loss import policy_loss
from grpo_pilot.engine.micro_batches import plan_micro_batches
from grpo_pilot.engine.shared_prefix import prefix_batch, shared_prefix_hidden, shared_prefix_unsupported
from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.memory.logits import FUSED_LOGPROB_CHUNK_TOKENS

SUMMED_METRICS = ("loss", "pg_loss", "kl_loss", "entropy_loss")


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


def pad_rows(rows: Sequence[Tensor], width: int | None = None) -> Tensor:
    """[k, width] float tensor from 1-D rows (zeros after each row's end)."""
    width = width if width is not None else max((r.numel() for r in rows), default=0)
    out = torch.zeros((len(rows), width), dtype=torch.float32, device=rows[0].device if rows else None)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out


class Actor:
    """Owns the policy (fp32 master), its AdamW optimizer, and the frozen reference (initial policy)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        *,
        device: torch.device,
        knobs: Knobs,
        lr: float,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        max_grad_norm: float = 1.0,
        temperature: float = 1.0,
        with_ref: bool = False,
        share_prompts: bool = True,
    ) -> None:
        self.device = device
        self.knobs = knobs
        self.temperature = temperature
        self.max_grad_norm = max_grad_norm
        self.policy = policy.to(device=device, dtype=torch.float32)
        self.policy.config.use_cache = False
        self.autocast_dtype = torch.bfloat16 if device.type == "cuda" else None
        self.ref: torch.nn.Module | None = None
        if with_ref:  # frozen copy of the initial policy; bf16 on GPU (what the planner assumes)
            ref = copy.deepcopy(self.policy).eval().requires_grad_(False)
            if self.autocast_dtype is not None:
                ref = ref.to(self.autocast_dtype)
            self.ref = ref.to("cpu") if knobs.ref_param_offload and device.type == "cuda" else ref
        if knobs.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # models whose padded micro-batches compute each distinct prompt once (engine/shared_prefix.py)
        self._shares_prompts = {
            id(m)
            for m in (self.policy, self.ref)
            if m is not None and share_prompts and shared_prefix_unsupported(m) is None
        }
        # cpu: the fused kernel (one vectorised in-place pass per tensor, no temporaries; ~3x faster than
        # the default single-tensor loop for small models); GPU: torch's default (foreach), which
        # planner/memory/optimizer.py models for both
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(),
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
            fused=True if device.type == "cpu" else None,
        )
        self.shared_forwards = 0  # training/log-prob micro-batches that ran the shared-prompt forward
        self.unapplied_knobs = tuple(
            name
            for name, on in (
                ("param_offload", knobs.param_offload),
                ("optimizer_offload", knobs.optimizer_offload),
                (f"ulysses_sp={knobs.ulysses_sp}", knobs.ulysses_sp > 1),
            )
            if on
        )

    # -- forward pieces ------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _scored_hidden(self, model: torch.nn.Module, samples: Sequence[Sample]) -> tuple[Tensor, Tensor, int, int]:
        """Final hidden states [N, h] at the N = Σ r_i positions that predict response tokens, the target
        ids [N] (sample-major), the positions computed (k·W padded, Σ(n_i − 1) packed, U·P + k·R shared)
        and how many of them are real tokens (not padding).

        The logits at position t − 1 predict token t, so a sequence of n tokens feeds its first n − 1.
        """
        layout = micro_batch_layout(model)
        if (
            layout == "padded"
            and id(model) in self._shares_prompts
            and len({s.prompt_ids for s in samples}) < len(samples)
        ):
            shared = prefix_batch([s.prompt_ids for s in samples], [s.response_ids for s in samples], self.device)
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
            input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
            position_ids = torch.tensor([pos], dtype=torch.long, device=self.device)
            out = model.get_decoder()(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
            computed = len(ids)
            hidden = out[0, torch.tensor(cols, dtype=torch.long, device=self.device)]
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
            input_ids = torch.tensor(batch, dtype=torch.long, device=self.device)
            out = model.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
            computed = len(samples) * width
            hidden = out[
                torch.tensor(rows, dtype=torch.long, device=self.device),
                torch.tensor(cols, dtype=torch.long, device=self.device),
            ]
        return hidden, torch.tensor(targets, dtype=torch.long, device=self.device), computed, fed

    def _micro_batch_logprobs(
        self, model: torch.nn.Module, samples: Sequence[Sample], *, with_entropy: bool, entropy_grad: bool = False
    ) -> tuple[list[Tensor], list[Tensor] | None, int, int]:
        """Per-sample response log-probs (and entropies) from one forward of the micro-batch `samples`,
        in the layout of `micro_batch_layout(model)`; also the positions computed (padding included)
        and the real ones among them.

        Entropies carry a gradient only with `entropy_grad` (else they are a metric and keep no graph).
        """
        entropy: Tensor | None = None
        with self._autocast():
            hidden, target_ids, computed, real = self._scored_hidden(model, samples)
            head = model.get_output_embeddings()
            if self.knobs.fused_logprob:
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
        sizes = [len(s.response_ids) for s in samples]
        return (
            list(logprobs.split(sizes)),
            (list(entropy.split(sizes)) if entropy is not None else None),
            computed,
            real,
        )

    @contextlib.contextmanager
    def _ref_on_device(self) -> Iterator[torch.nn.Module]:
        assert self.ref is not None
        offloaded = next(self.ref.parameters()).device != self.device
        if offloaded:
            self.ref.to(self.device)
        try:
            yield self.ref
        finally:
            if offloaded:
                self.ref.to("cpu")

    # -- the interface -------------------------------------------------------------------------
    @torch.no_grad()
    def log_probs(self, samples: Sequence[Sample], *, ref: bool = False) -> list[Tensor]:
        """Response log-probs [r_i] per sample under the current policy (or the reference); no grad.

        Micro-batches of at most `log_prob_max_token_len_per_gpu` tokens (padding included), in the
        layout of `micro_batch_layout(model)`.
        """
        out: list[Tensor | None] = [None] * len(samples)
        with self._ref_on_device() if ref else contextlib.nullcontext(self.policy) as model:
            padded = micro_batch_layout(model) == "padded"
            bins = plan_micro_batches(
                [s.num_tokens for s in samples],
                max_tokens=self.knobs.log_prob_max_token_len_per_gpu,
                padded=padded,
                split_padding=padded,
            )
            was_training = model.training
            model.eval()
            try:
                for b in bins:
                    lps, _, _, _ = self._micro_batch_logprobs(model, [samples[i] for i in b], with_entropy=False)
                    for i, lp in zip(b, lps):
                        out[i] = lp.float()
            finally:
                model.train(was_training)
        return out  # type: ignore[return-value]

    def update(
        self,
        samples: Sequence[Sample],
        advantages: Tensor,
        loss: LossSettings,
        *,
        old_logprobs: Sequence[Tensor] | None = None,
        ref_logprobs: Sequence[Tensor] | None = None,
    ) -> dict[str, float]:
        """One optimizer step on this mini-batch; returns summed losses and token-weighted statistics.

        `advantages` [len(samples)]; `old_logprobs` None = on-policy (the detached current log-probs).
        """
        self.policy.train()
        lengths = [s.num_tokens for s in samples]
        padded = micro_batch_layout(self.policy) == "padded"
        bins = plan_micro_batches(
            lengths,
            max_tokens=self.knobs.max_token_len_per_gpu,
            max_seqs=None if self.knobs.dynamic_batching else self.knobs.micro_batch_size_per_gpu,
            padded=padded,
            split_padding=padded,
        )
        trained = [not (loss.mask_truncated and s.truncated) for s in samples]
        num_tokens = sum(len(s.response_ids) for s, t in zip(samples, trained) if t)
        sums: dict[str, float] = {}
        weighted: dict[str, float] = {}
        weight_total = 0.0
        computed_total = real_total = 0
        for b in bins:
            mb = [samples[i] for i in b]
            # entropy is always reported; it carries a gradient only when entropy_coeff != 0
            lps, ents, computed, real = self._micro_batch_logprobs(
                self.policy, mb, with_entropy=True, entropy_grad=loss.entropy_coeff != 0.0
            )
            computed_total += computed
            real_total += real
            width = max(len(s.response_ids) for s in mb)
            lp = pad_rows(lps, width)
            mask = pad_rows([torch.ones(len(s.response_ids), device=self.device) for s in mb], width)
            truncated = torch.tensor([not trained[i] for i in b], device=self.device)
            mask = mask_truncated(mask, truncated)
            old = pad_rows([old_logprobs[i] for i in b], width) if old_logprobs is not None else lp.detach()
            refs = pad_rows([ref_logprobs[i] for i in b], width) if ref_logprobs is not None else None
            ent = pad_rows(ents, width) if ents is not None else None
            if ent is not None and loss.entropy_coeff == 0.0:
                ent = ent.detach()
            total, metrics = policy_loss(
                lp,
                old,
                advantages[b].to(self.device),
                mask,
                loss_agg_mode=loss.loss_agg_mode,
                clip_low=loss.clip_low,
                clip_high=loss.clip_high,
                clip_c=loss.clip_c,
                ref_logprobs=refs,
                kl_coef=loss.kl_coef,
                kl_type=loss.kl_type,
                ratio_level=loss.ratio_level,
                entropy=ent,
                entropy_coeff=loss.entropy_coeff,
                loss_scale_len=loss.loss_scale_len,
                global_num_tokens=max(num_tokens, 1),
                global_num_seqs=len(samples),
            )
            total.backward()
            w = metrics.get("num_tokens", 0.0)
            weight_total += w
            for k, v in metrics.items():
                if k in SUMMED_METRICS:
                    sums[k] = sums.get(k, 0.0) + v
                elif k not in ("num_tokens", "num_seqs", "ratio_min", "ratio_max"):
                    weighted[k] = weighted.get(k, 0.0) + v * w
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        out = dict(sums)
        out.update({k: v / weight_total for k, v in weighted.items()} if weight_total > 0 else {})
        out.update(
            grad_norm=float(grad_norm),
            num_micro_batches=float(len(bins)),
            num_tokens=float(num_tokens),
            padding_frac=(computed_total - real_total) / computed_total if computed_total else 0.0,
        )
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"model": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, model: dict[str, Any], optimizer: dict[str, Any]) -> None:
        self.policy.load_state_dict(model)
        self.optimizer.load_state_dict(optimizer)
