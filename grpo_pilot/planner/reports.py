"""Result types of the estimators. Items are integer bytes; every total is the sum of its items.

Item names starting with `overhead_` are non-tensor overheads (CUDA context, NCCL, fragmentation);
all other items are tensor bytes.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from grpo_pilot.models import Frozen
from grpo_pilot.planner.rules import PhaseName

OVERHEAD_PREFIX = "overhead_"


class PhaseMemory(Frozen):
    """Peak bytes on one GPU during one phase, itemised."""

    total_bytes: int = Field(ge=0, description="Sum of items.")
    items: dict[str, int] = Field(description="Item name -> bytes (all >= 0).")

    @model_validator(mode="after")
    def _items_sum(self) -> "PhaseMemory":
        if any(v < 0 for v in self.items.values()):
            raise ValueError(f"negative memory item in {self.items}")
        if sum(self.items.values()) != self.total_bytes:
            raise ValueError("total_bytes must equal the sum of items")
        return self

    @classmethod
    def of(cls, items: dict[str, int]) -> "PhaseMemory":
        """From the estimators' integer items (checked non-negative; the total is their sum by construction),
        without a validation pass: the search builds thousands of these."""
        clean = {k: int(v) for k, v in items.items()}
        if any(v < 0 for v in clean.values()):
            raise ValueError(f"negative memory item in {clean}")
        return cls.model_construct(total_bytes=sum(clean.values()), items=clean)

    @property
    def tensor_bytes(self) -> int:
        return sum(v for k, v in self.items.items() if not k.startswith(OVERHEAD_PREFIX))

    def largest_item(self) -> str:
        return max(self.items, key=lambda k: self.items[k]) if self.items else ""


class MemoryReport(Frozen):
    """Per-GPU peak memory of every phase, plus host RAM per node."""

    phases: dict[PhaseName, PhaseMemory] = Field(
        description="rollout, log_prob, update, weight_sync; a PPO plan adds values and critic_update."
    )
    host: PhaseMemory = Field(
        description="Host RAM per node: offloaded states of every rank on the node, pinned buffers."
    )
    kv_cache_bytes_per_gpu: int = Field(
        ge=0, description="KV cache the rollout engine gets (its budget minus weights, activations, graphs, buffers)."
    )
    kv_cache_tokens_per_gpu: int = Field(
        ge=0, description="Tokens of KV cache that fit on one GPU of the rollout engine."
    )
    max_concurrent_seqs: int = Field(
        ge=0, description="Sequences that can decode at once per rollout replica (KV capacity, capped by max_num_seqs)."
    )

    @property
    def peak_gpu_bytes(self) -> int:
        return max(p.total_bytes for p in self.phases.values())

    @property
    def peak_tensor_bytes(self) -> int:
        """The largest phase's tensor bytes (items without overhead_*: what max_memory_allocated shows)."""
        return max(p.tensor_bytes for p in self.phases.values())

    @property
    def peak_phase(self) -> PhaseName:
        return max(self.phases, key=lambda k: self.phases[k].total_bytes)


class TimeReport(Frozen):
    """Roofline step time by phase (seconds), throughput and utilisation."""

    phases_s: dict[PhaseName, float] = Field(
        description="rollout, log_prob (old + ref), update, weight_sync seconds (PPO: values, critic_update)."
    )
    step_s: float = Field(ge=0.0, description="Sum of phases.")
    tokens_per_s: float = Field(ge=0.0, description="Trained tokens (prompt + response) per second, whole cluster.")
    mfu: float = Field(
        ge=0.0,
        description="Model FLOPs utilisation of the whole step (6P per trained token + 2P per log-prob token "
        "+ 2P per generated token) / (peak × GPUs × step_s).",
    )
