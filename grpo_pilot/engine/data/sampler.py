"""Deterministic, resumable order of prompts: one seeded permutation per epoch.

Epoch e visits every record once in the order `permutation(seed, e)` (numpy PCG64 seeded with the
pair [seed, e], so the order depends only on those two numbers). `next_batch()` returns the next
`prompts_per_step` indices of that stream; a batch that runs past the end of an epoch continues in
the next one, so no prompt is skipped or repeated before every prompt has been seen once (a set
smaller than one batch repeats prompts inside a batch). `state_dict()` after batch k, loaded into a
fresh sampler, makes it continue with batch k + 1 exactly.
"""

from __future__ import annotations

import numpy as np

from grpo_pilot.errors import InputError

STATE_VERSION = 1


def epoch_permutation(num_records: int, seed: int, epoch: int) -> list[int]:
    """The visiting order of epoch `epoch`: a permutation of range(num_records)."""
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))
    return [int(i) for i in rng.permutation(num_records)]


class PromptSampler:
    """Yields batches of record indices; `state_dict`/`load_state_dict` resume mid-epoch."""

    def __init__(self, num_records: int, prompts_per_step: int, seed: int) -> None:
        if num_records < 1:
            raise InputError("The prompt set is empty.", "Give a prompt file with at least one valid line.")
        if prompts_per_step < 1:
            raise InputError(
                f"prompts_per_step must be at least 1, got {prompts_per_step}.", "Set a positive batch size."
            )
        if seed < 0:
            raise InputError(f"The data seed must be non-negative, got {seed}.", "Pass a seed >= 0.")
        self.num_records = num_records
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = epoch_permutation(num_records, seed, 0)

    def next_batch(self) -> list[int]:
        batch: list[int] = []
        while len(batch) < self.prompts_per_step:
            if self.position == self.num_records:
                self.epoch += 1
                self.position = 0
                self._order = epoch_permutation(self.num_records, self.seed, self.epoch)
            take = min(self.prompts_per_step - len(batch), self.num_records - self.position)
            batch.extend(self._order[self.position : self.position + take])
            self.position += take
        return batch

    def state_dict(self) -> dict[str, int]:
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "num_records": self.num_records,
            "prompts_per_step": self.prompts_per_step,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from `state`; the prompt set size, batch size and seed must match the saved ones."""
        missing = [k for k in ("seed", "epoch", "position", "num_records") if k not in state]
        if missing:
            raise InputError(
                f"The saved data position lacks {', '.join(missing)}.",
                "The checkpoint is incomplete; resume from another one.",
            )
        for key, mine in (
            ("num_records", self.num_records),
            ("seed", self.seed),
            ("prompts_per_step", self.prompts_per_step),
        ):
            if key in state and int(state[key]) != mine:
                raise InputError(
                    f"Cannot resume the prompt order: the checkpoint has {key}={state[key]}, this run has {mine}.",
                    "Resume with the same prompt file, batch size and seed as the checkpointed run.",
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.num_records:
            raise InputError(
                f"The saved data position (epoch {epoch}, position {position}) is out of range.",
                "Resume from another checkpoint.",
            )
        self.epoch = epoch
        self.position = position
        self._order = epoch_permutation(self.num_records, self.seed, epoch)
