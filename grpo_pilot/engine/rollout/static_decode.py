"""The static decode loop: fixed shapes, sampling on the device, host checks every few steps, CUDA graphs on CUDA.

    decode_static(model, weights, prompts, *, max_new_tokens, eos_ids, pad_id, temperature, top_p, top_k=0,
                  generator, stop=None, stop_window=None, graphs=False, check_every=CHECK_EVERY_STEPS,
                  length_bucket=LENGTH_BUCKET_TOKENS) -> list[list[int]]

The same results as `decode.decode_batch` (same prefill, same sampler and uniforms, same finishing
rules; tests/engine/test_rollout_static.py checks equal completions), computed so that the GPU never
waits for the host between tokens:
- one decode step = `StaticStep.forward` (static_step.py) + sampling + bookkeeping, all on device
  tensors updated in place: the row's token is written into the [B, N] result at the step index (a
  device scalar), EOS is a table lookup (`sampling.ends`), a finished row is fed `pad_id`, and the step
  at which each row finished is kept on the device. No op reads a value back, so the whole unit can be
  captured once as a CUDA graph per (rows, attended length) and replayed (`graphs=True`, cuda_graphs.py);
  on the CPU (and with `graphs=False`) the same unit runs eagerly;
- attention runs over a multiple of `length_bucket` slots (the filled ones, rounded up; the rest masked),
  so a whole decode needs about (prompt + max_new_tokens) / length_bucket graphs, not one per token;
- the host looks at the batch every `check_every` steps (one transfer of the finished flags; a stop check
  adds one transfer of the running rows' new tokens): it exits once every row is done, applies stop
  strings and compacts. A stop string found for step j of a row (checked at each step since the last
  look, only before the row's EOS, as the eager loop checks it after each token) finishes the row at j
  and its tokens after j become `pad_id` — the eager loop's result exactly. At most `check_every` − 1
  steps run past the point where every row was done (their tokens are pad and the result is cut at the
  last finishing step, as the eager loop's).
- compaction: when at least half the rows are finished, the batch keeps its running rows plus as few
  finished ones as make a power of two (B → B' ≥ R running, B' ≤ B / 2; each shrink at least halves it,
  so at most log2 B of them and as many new graph shapes); finished rows left in the batch write pad
  into their own, already finished, result rows. Each row keeps its own uniforms (indexed by its original
  row), so compaction changes no completion beyond the rounding decode.py describes.

Memory beyond decode.py's: the cache is allocated for all W + N slots up front (as the eager Llama step
does) and zero-filled; graphs allocate their intermediates from one shared pool (about one step's
temporaries per captured shape, all freed when the call returns); `done` [B] int64.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from grpo_pilot.engine.rollout.cuda_graphs import StepGraphs
from grpo_pilot.engine.rollout.decode import StopCheck, prefill
from grpo_pilot.engine.rollout.sampling import draw_uniforms, ends, eos_table, sample_next
from grpo_pilot.engine.rollout.static_step import DecodeWeights, StaticStep
from grpo_pilot.kernels import STATIC_CHECK_EVERY_STEPS, STATIC_LENGTH_BUCKET_TOKENS

CHECK_EVERY_STEPS = STATIC_CHECK_EVERY_STEPS  # grpo_pilot/kernels.py: the planner counts the same
LENGTH_BUCKET_TOKENS = STATIC_LENGTH_BUCKET_TOKENS


class _Batch:
    """The device state one decode step reads and writes in place (module docstring)."""

    def __init__(self, step: StaticStep, *, out: Tensor, draws: Tensor | None, eos: Tensor, sampling: dict) -> None:
        rows = step.num_rows
        device = out.device
        self.step, self.out, self.draws, self.eos, self.sampling = step, out, draws, eos, sampling
        self.pad_id = int(sampling.pop("pad_id"))
        self.alive = torch.arange(rows, device=device)  # the result row of each batch row
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)
        self.step_idx = torch.zeros(1, dtype=torch.long, device=device)
        self.done = torch.full((rows,), out.shape[1] - 1, dtype=torch.long, device=device)  # finishing step per row

    def sample_into(self, logits: Tensor) -> None:
        """Sample each row's token at step `step_idx`, record it, and make it the next input."""
        rows = self.alive.shape[0]
        uniforms = (
            None if self.draws is None else self.draws.index_select(0, self.step_idx)[0].index_select(0, self.alive)
        )
        token = sample_next(logits, uniforms=uniforms, **self.sampling).masked_fill(self.finished, self.pad_id)
        at = self.step_idx.expand(rows)
        self.out.index_put_((self.alive, at), token)
        newly = ends(self.eos, token) & ~self.finished
        self.done.index_put_((self.alive,), torch.where(newly, at, self.done.index_select(0, self.alive)))
        self.finished.logical_or_(newly)
        self.step.tokens.copy_(token)
        self.step_idx.add_(1)

    def unit(self, length: int) -> None:
        """One decode step: feed the current tokens, attend over `length` slots, sample the next ones."""
        self.sample_into(self.step.forward(length))

    def keep(self, rows: list[int]) -> None:
        index = torch.tensor(rows, dtype=torch.long, device=self.alive.device)
        self.alive, self.finished = self.alive.index_select(0, index), self.finished.index_select(0, index)
        self.step.keep_rows(index)


class _Checks:
    """The host's look at the batch every few steps: stop strings, exit, compaction (module docstring)."""

    def __init__(self, batch: _Batch, stop: StopCheck | None, window: int | None, eos_ids: Sequence[int]) -> None:
        self.batch, self.stop, self.window, self.eos = batch, stop, window, set(int(i) for i in eos_ids)
        self.running = set(range(batch.out.shape[0]))  # result rows not finished at the last look
        self.alive: list[int] = list(self.running)  # the result row of each batch row at the last look

    def look(self, lo: int, hi: int) -> bool:
        """Tokens [lo, hi) are new since the last look; returns whether every row is finished."""
        b = self.batch
        if self.stop is not None and self.running:
            self._apply_stops(lo, hi)
        state = torch.cat((b.alive, b.finished.long())).tolist()  # the look's one transfer
        rows = len(state) // 2
        self.alive, finished = state[:rows], state[rows:]
        self.running = {r for r, f in zip(self.alive, finished) if not f}
        return not self.running

    def _apply_stops(self, lo: int, hi: int) -> None:
        b = self.batch
        rows = sorted(self.running)
        start = 0 if self.window is None else max(0, lo - self.window + 1)
        index = torch.tensor(rows, dtype=torch.long, device=b.out.device)
        seqs = b.out.index_select(0, index)[:, start:hi].tolist()
        asks: list[tuple[int, int]] = []  # (row, step) whose tail the stop check sees
        tails: list[list[int]] = []
        for row, seq in zip(rows, seqs):
            for j in range(lo, hi):  # the eager loop checks a row after each token, until it ends by EOS
                if seq[j - start] in self.eos:
                    break
                asks.append((row, j))
                tails.append(seq[(0 if self.window is None else max(0, j + 1 - self.window)) - start : j + 1 - start])
        first: dict[int, int] = {}
        for (row, j), hit in zip(asks, self.stop(tails) if tails else []):
            if hit and row not in first:
                first[row] = j
        if not first:
            return
        position = {r: i for i, r in enumerate(b.alive.tolist())}
        stopped = torch.tensor([position[r] for r in first], dtype=torch.long, device=b.out.device)
        b.finished.index_fill_(0, stopped, True)
        for row, j in first.items():
            b.out[row, j + 1 : hi] = b.pad_id
            b.done[row] = j

    def compaction(self) -> list[int] | None:
        """Batch rows to keep when at least half the batch is finished (module docstring), else None."""
        rows = len(self.alive)
        running = len(self.running)
        if running == 0 or 2 * running > rows:
            return None
        size = 1 << (running - 1).bit_length()  # the smallest power of two >= running
        keep = [i for i, r in enumerate(self.alive) if r in self.running]
        return keep + [i for i, r in enumerate(self.alive) if r not in self.running][: size - running]


def decode_static(
    model: Any,
    weights: DecodeWeights,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    top_k: int = 0,
    stop: StopCheck | None = None,
    stop_window: int | None = None,
    graphs: bool = False,
    check_every: int = CHECK_EVERY_STEPS,
    length_bucket: int = LENGTH_BUCKET_TOKENS,
    stats: dict[str, Any] | None = None,
) -> list[list[int]]:
    """Generated ids per prompt, as `decode.decode_batch` returns them (module docstring). `weights`: the decode
    step's tensors (static_step.DecodeWeights of `model`); `graphs`: replay CUDA graphs (CUDA only); `stats`: a
    dict the call adds its decode steps, graph captures and replays to (and a capture failure, if any)."""
    if check_every < 1 or length_bucket < 1:
        raise ValueError(f"check_every and length_bucket must be >= 1, got {check_every}, {length_bucket}")
    pre = prefill(model, prompts, pad_id=pad_id, max_new_tokens=max_new_tokens)
    rows, width = pre.real.shape
    total = width + max_new_tokens
    device = pre.logits.device
    step = StaticStep(model, weights, rows=rows, total_len=total)
    step.load_prefill(pre.cache, pre.inverse, pre.key_mask, pre.positions[:, -1] + 1)
    batch = _Batch(
        step,
        out=torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device),
        draws=draw_uniforms(max_new_tokens, rows, generator, device) if temperature != 0.0 else None,
        eos=eos_table(eos_ids, pre.logits.shape[-1], device),
        sampling=dict(temperature=temperature, top_p=top_p, top_k=top_k, pad_id=pad_id),
    )
    with torch.autocast(device.type, enabled=False):  # the prefill may run under autocast; the steps never do
        batch.sample_into(pre.logits)  # token 0, from the prefill's logits
        del pre
        runner = StepGraphs(enabled=graphs)
        steps = _loop(batch, _Checks(batch, stop, stop_window, eos_ids), runner, width=width, total=total,
                      check_every=check_every, length_bucket=length_bucket)  # fmt: skip
    if stats is not None:
        for key, value in (("steps", steps), ("captures", runner.captures), ("replays", runner.replays)):
            stats[key] = stats.get(key, 0) + value
        if runner.failure:
            stats["graph_failure"] = runner.failure
    cut = int(batch.done.max()) + 1  # the eager loop's result width: the last step at which a row finished
    return batch.out[:, : min(cut, steps)].tolist()


def _loop(batch: _Batch, checks: _Checks, runner: StepGraphs, *, width: int, total: int, check_every: int,
          length_bucket: int) -> int:  # fmt: skip
    """Decode steps until every row is finished or the cap; returns the tokens generated per row."""
    max_new_tokens = batch.out.shape[1]
    looked = 0
    steps = 1
    for steps in range(1, max_new_tokens + 1):  # `steps` tokens are out; the next step feeds token steps - 1
        if steps - looked >= check_every or steps == max_new_tokens:
            done = checks.look(looked, steps)
            looked = steps
            if done or steps == max_new_tokens:
                break
            keep = checks.compaction()
            if keep is not None:
                batch.keep(keep)
                runner.reset()
        length = min(total, -(-(width + steps) // length_bucket) * length_bucket)
        runner.run((batch.alive.shape[0], length), lambda: batch.unit(length))
    runner.reset()
    return steps
