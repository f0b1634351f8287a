"""The traced method beside the analytic estimator: `compare_with_analytic(spec, cluster, workload, knobs)`.

Traces the update micro-batch a plan implies (`verify/traced.py`) and sets it, row by row, beside the
update phase of `planner.estimate.estimate_memory` for the memory the trace can see.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.verify.traced import TracedMemory, trace_update_step

# ---- cross-check against the analytic update phase ---------------------------------------------------

ACTS_ROW = "activations, logits, temporaries"  # the tracker splits these by moment, not by item
# Analytic update item (planner/estimate.py, memory/moments.py) -> comparison row. Items not listed and not in
# NOT_TRACED are shown in their own row with traced = 0 (a new analytic item is never dropped silently).
ROW_OF_ITEM: dict[str, str] = {
    "actor_params": "sharded params",
    "actor_grads": "sharded grads",
    "optimizer_states": "Adam states",
    "optimizer_step_temporaries": "optimizer-step temporaries",
    "gathered_layers": "gathered params",
    "root_embed_lm_head": "gathered params",
    "unsharded_grads": "unsharded grads",
    "root_reduce_scatter": "unsharded grads",
    "activations": ACTS_ROW,
    "recompute_activations": ACTS_ROW,
    "logits": ACTS_ROW,
    "layer_backward_temporaries": ACTS_ROW,
}
# Items the trace cannot see: the reference model's shard (not built), the rollout engine's leftovers,
# Ulysses buffers (no sequence parallelism traced) and the non-tensor overheads.
NOT_TRACED_PREFIXES = ("overhead_", "vllm_")
NOT_TRACED = ("ref_params", "ulysses_all_to_all")


def _traced_rows(tr: TracedMemory) -> dict[str, int]:
    """Traced bytes at the peak, grouped like the analytic rows (sums to tr.peak_bytes)."""
    lab = tr.peak_labels
    adam = min(lab.get("OptState", 0), tr.optimizer_state_bytes)
    return {
        "sharded params": lab.get("Sharded Param", 0) + lab.get("Buffer", 0),
        "sharded grads": lab.get("Sharded Grad", 0),
        "Adam states": adam,
        "optimizer-step temporaries": lab.get("OptState", 0) - adam,
        "gathered params": lab.get("Unsharded Param", 0) + lab.get("All Gather", 0),
        "unsharded grads": lab.get("Unsharded Grad", 0) + lab.get("Reduce Scatter", 0),
        ACTS_ROW: lab.get("Activation", 0) + lab.get("Inputs", 0) + lab.get("Temp", 0),
    }


class ComparisonRow(Frozen):
    """One line of the cross-check: analytic items and traced labels that measure the same memory."""

    row: str
    analytic_bytes: int = Field(ge=0)
    traced_bytes: int = Field(ge=0)


class TracedComparison(Frozen):
    """The analytic update phase beside the traced peak, for the memory the trace can see."""

    model_name: str
    cluster_label: str
    tokens_per_micro_batch: int = Field(ge=1, description="Tokens one rank processes per micro-batch (T).")
    rows: tuple[ComparisonRow, ...]
    not_traced: dict[str, int] = Field(
        description="Analytic update items outside the trace (reference shard, vLLM leftovers, overheads)."
    )
    analytic_traceable_bytes: int = Field(
        ge=0, description="Sum of the analytic rows (the update phase minus not_traced)."
    )
    traced: TracedMemory

    @property
    def traced_peak_bytes(self) -> int:
        return self.traced.peak_bytes

    @property
    def relative_error(self) -> float:
        """(analytic − traced) / traced: > 0 means the analytic model over-estimates."""
        return (self.analytic_traceable_bytes - self.traced.peak_bytes) / max(1, self.traced.peak_bytes)


def _unsupported(cluster: Any, knobs: Any, target: str) -> list[str]:
    problems = []
    if cluster.gpu.is_cpu:
        problems.append("the cpu pseudo-device (fp32, no FSDP mixed precision)")
    if target != "grpo-pilot":
        problems.append(f"target '{target}' (the trace follows our engine's unfused log-prob path)")
    for name in ("param_offload", "optimizer_offload", "fused_logprob"):
        if getattr(knobs, name):
            problems.append(f"{name}=True")
    if knobs.ulysses_sp > 1:
        problems.append(f"ulysses_sp={knobs.ulysses_sp}")
    return problems


def compare_with_analytic(
    spec: ModelSpec, cluster: Any, workload: Any, knobs: Any, *, target: str = "grpo-pilot"
) -> TracedComparison:
    """Trace the update micro-batch the plan implies and set it beside `estimate_memory(...)["update"]`.

    The micro-batch is what our engine's actor builds under SDPA: `min(micro, sequences per rank)`
    rows of prompt + response tokens (dynamic batching: as many whole sequences as fit the token
    budget), no mask (causal), logits kept at the response positions; the entropy metric (or bonus)
    computed as the actor does. Sequences are all full length, so the rows carry no padding, and the
    estimate is taken for the same worst case (`workload.worst_case()`: every sequence at its maximum);
    the actor also skips each sequence's last input token, one per row fewer than traced here.
    """
    from grpo_pilot.planner.estimate import estimate_memory
    from grpo_pilot.planner.memory.layout import layout_for
    from grpo_pilot.planner.memory.tokens import packed_tokens_per_rank, sequences_per_sp_group

    problems = _unsupported(cluster, knobs, target)
    if problems:
        raise InputError(
            f"The traced cross-check does not cover {', '.join(problems)}.",
            "Compare a GPU cluster with target 'grpo-pilot', no offload, no Ulysses and fused_logprob=False.",
        )
    layout = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    workload = workload.worst_case()
    seq = workload.seq_len_tokens
    mini_seqs = sequences_per_sp_group(workload.mini_batch_prompts * workload.n, layout.trainer_gpus, 1)
    if knobs.max_token_len_per_gpu is not None:
        # the engine's padded bins hold rows while rows x longest <= budget: floor(T / seq) full-length rows
        budget = packed_tokens_per_rank(knobs.max_token_len_per_gpu, seq, mini_seqs, 1, False)
        seqs = max(1, budget // seq)
    else:
        seqs = min(knobs.micro_batch_size_per_gpu or 1, mini_seqs)
    micro_batches = min(2, -(-mini_seqs // seqs))
    traced = trace_update_step(
        spec,
        world_size=layout.trainer_gpus,
        micro_batch_seqs=seqs,
        seq_len_tokens=seq,
        gradient_checkpointing=knobs.gradient_checkpointing,
        entropy="loss" if workload.entropy_coeff > 0 else "metric",
        micro_batches_per_step=micro_batches,
        scored_positions_per_seq=workload.response_len_tokens,
        packed=False,
    )
    items = estimate_memory(spec, cluster, workload, knobs, target=target).phases["update"].items  # type: ignore[arg-type]
    not_traced = {k: v for k, v in items.items() if k in NOT_TRACED or k.startswith(NOT_TRACED_PREFIXES)}
    analytic: dict[str, int] = {}
    for name, value in items.items():
        if name not in not_traced:
            row = ROW_OF_ITEM.get(name, name)
            analytic[row] = analytic.get(row, 0) + value
    traced_rows = _traced_rows(traced)
    names = list(traced_rows) + [r for r in analytic if r not in traced_rows]
    rows = tuple(
        ComparisonRow(row=r, analytic_bytes=analytic.get(r, 0), traced_bytes=traced_rows.get(r, 0)) for r in names
    )
    return TracedComparison(
        model_name=spec.name,
        cluster_label=cluster.label(),
        tokens_per_micro_batch=seqs * seq,
        rows=rows,
        not_traced=not_traced,
        analytic_traceable_bytes=sum(analytic.values()),
        traced=traced,
    )
