"""One micro-batch's loss inputs as [k, width] rows, and the mini-batch's metrics accumulated on the device.

    rows = loss_rows(samples, trained, flat_lp=, flat_ent=, adv=, old=, ref=, with_ref=)    LossRows
    sums = MetricSums(); sums.add(stats) per micro-batch; sums.read(counts, grad_norm, reduce) once

The actor's update (engine/actor.py) calls these per micro-batch; neither reads a value back to the host:
the rows are one scatter each from the flat, sample-major log-probs (right after each row's end: zeros,
as the masked positions of `policy_loss_terms` need finite numbers), built with two host-to-device copies
that do not make the host wait (engine/host_copy.py), and the statistics stay 0-d device tensors until the
mini-batch's single `read`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from grpo_pilot.engine.host_copy import to_device

SUMMED_METRICS = ("loss", "pg_loss", "kl_loss", "entropy_loss")  # terms that sum over micro-batches
NOT_AVERAGED = ("num_tokens", "num_seqs", "ratio_min", "ratio_max")  # per-micro-batch statistics left out


@dataclass(frozen=True)
class LossRows:
    """One micro-batch's `policy_loss_terms` inputs, [k, width] (advantages [k])."""

    lp: Tensor
    old: Tensor
    ref: Tensor | None
    ent: Tensor | None
    mask: Tensor
    adv: Tensor


class MetricSums:
    """A mini-batch's metrics accumulated on the device over its micro-batches, read back once (`read`): the summed
    losses (SUMMED_METRICS) and the token-weighted means of the other statistics."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.weighted: dict[str, Tensor] = {}
        self.weight: Tensor | None = None

    def add(self, stats: dict[str, Tensor]) -> None:
        w = stats["num_tokens"].to(torch.float64).reshape(())
        self.weight = w if self.weight is None else self.weight + w
        for key, value in stats.items():
            v = value.detach().to(torch.float64).reshape(())
            if key in SUMMED_METRICS:
                self.sums[key] = self.sums[key] + v if key in self.sums else v
            elif key not in NOT_AVERAGED:
                self.weighted[key] = self.weighted[key] + v * w if key in self.weighted else v * w

    def read(self, counts: Tensor, grad_norm: Tensor, reduce: Any) -> dict[str, float]:
        """One transfer to the host: the sums and weighted means (each summed over ranks by `reduce`), the
        `counts` [computed, real, tokens] (summed likewise) and `grad_norm` (already global)."""
        sum_keys, weighted_keys = sorted(self.sums), sorted(self.weighted)
        weight = self.weight if self.weight is not None else counts.new_zeros(())
        parts = [self.sums[k] for k in sum_keys] + [self.weighted[k] for k in weighted_keys] + [weight]
        reduced = reduce(torch.cat([torch.stack(parts).to(counts.device), counts]))
        values = torch.cat([reduced, grad_norm.detach().to(torch.float64).reshape(1)]).tolist()
        out = dict(zip(sum_keys, values))
        weighted = values[len(sum_keys) : len(sum_keys) + len(weighted_keys)]
        total_weight = values[len(parts) - 1]
        if total_weight > 0:
            out.update({k: v / total_weight for k, v in zip(weighted_keys, weighted)})
        computed, real, tokens, norm = values[len(parts) :]
        out.update(grad_norm=norm, computed=computed, real=real, tokens=tokens)
        return out


def loss_rows(
    samples: Sequence[Any],
    trained: Sequence[bool],
    *,
    flat_lp: Tensor,
    flat_ent: Tensor | None,
    adv: Tensor,
    old: Tensor | None,
    ref: Tensor | None,
    with_ref: bool,
) -> LossRows:
    """[k, width] rows of a micro-batch's k `samples` (width = the longest response) from flat, sample-major
    tensors: its log-probs (with grad), entropies, old-policy log-probs (None: on-policy, the detached current
    ones) and reference log-probs (`with_ref` and None: the detached current ones, for a rank's dummy). `trained`:
    per sample whether its tokens count (False: DAPO overlong filtering, or an empty rank's dummy) — its mask
    row is all zero. `adv` [k]."""
    device = flat_lp.device
    lens = [len(s.response_ids) for s in samples]
    width = max(lens)
    flat_index = to_device([r * width + t for r, n in enumerate(lens) for t in range(n)], dtype=torch.long,
                           device=device)  # fmt: skip
    counted = to_device([n if ok else 0 for n, ok in zip(lens, trained)], dtype=torch.long, device=device)
    mask = (torch.arange(width, device=device)[None, :] < counted[:, None]).float()

    def rows(flat: Tensor) -> Tensor:  # zeros after each row's end; differentiable in `flat`
        return (
            flat.new_zeros(len(lens) * width, dtype=torch.float32)
            .index_put((flat_index,), flat.float())
            .view(len(lens), width)
        )

    lp = rows(flat_lp)
    return LossRows(
        lp=lp,
        old=rows(old) if old is not None else lp.detach(),
        ref=(rows(ref) if ref is not None else lp.detach()) if with_ref else None,
        ent=rows(flat_ent) if flat_ent is not None else None,
        mask=mask,
        adv=adv,
    )
