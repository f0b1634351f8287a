"""The rollout protocol every backend implements, and the sampling settings it takes.

A rollout backend turns a batch of tokenised prompts into one completion per prompt. The step loop
repeats each prompt `n` times itself (one GRPO group = n consecutive rows), so backends never see `n`.

Completion semantics (identical for every backend; `completion.finish_completion` enforces them):
- a completion ends at the first EOS token, which is *included* in `token_ids` (the loss counts it);
- or at the first stop string, whose tokens are included (the token that completes the string is
  the last one kept);
- or after `max_new_tokens` tokens, with `finish_reason == "length"`.
`text` is the decoding of `token_ids` with special tokens (EOS) skipped, so rewards see exactly the
tokens the loss trains on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from pydantic import Field

from grpo_pilot.models import Frozen

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length"]
BackendName = Literal["hf", "vllm"]


class SamplingConfig(Frozen):
    """How completions are sampled. `temperature == 0` means greedy decoding (top_p then unused)."""

    temperature: float = Field(default=1.0, ge=0.0, description="Softmax temperature; 0 = greedy (argmax).")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1.0 = off.")
    top_k: int = Field(default=0, ge=0, description="Keep the k most likely tokens (applied before top_p); 0 = off.")
    max_new_tokens: int = Field(ge=1, description="Most tokens generated per completion (EOS included).")
    stop: tuple[str, ...] = Field(
        default=(), description="Stop strings; the completion keeps the string and ends there."
    )
    seed: int = Field(
        default=0, ge=0, description="Same seed, weights and prompts give the same completions; vary it per step."
    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Generation:
    """One completion. `token_ids`: generated ids only (no prompt, no padding), EOS included when hit."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class RolloutBackend(Protocol):
    """What a worker calls. One instance lives for the whole run.

    Call order per step: `wake()` → `sync_weights(weights)` → `generate(...)` → `sleep()`.
    `shares_policy`: generation runs on the trainer's own module (hf, one unsharded worker), so there is
    nothing to sync and the worker skips gathering weights.
    """

    name: str
    shares_policy: bool

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        """One completion per prompt, in the order of `prompt_ids`; batched in one call."""
        ...

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the trainer's current weights, (HF parameter name, full tensor) pairs covering every
        parameter name of the model (tied ones under each name); a missing one is a `RunError`."""
        ...

    def sleep(self) -> None:
        """Release rollout memory (KV cache, engine weights) while the trainer runs; no-op where N/A."""
        ...

    def wake(self) -> None:
        """Restore what `sleep` released; no-op where N/A."""
        ...

    def close(self) -> None:
        """Free the engine for good; the backend cannot be used afterwards."""
        ...
