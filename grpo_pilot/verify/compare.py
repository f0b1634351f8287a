"""The traced method beside the analytic estimator: `verify_plan(plan)` / `compare_with_analytic(...)`.

Traces the GRPO step a plan implies through the engine's own actor (`verify/traced.py`) and sets the
update phase and the forward-only log-prob phase, row by row, beside `planner.estimate.estimate_memory`
for the memory the trace can see (tensors; not the CUDA context, NCCL, fragmentation or vLLM leftovers).

What is traced for a plan (the worst case the estimate is taken for: every sequence at its maximum,
`workload.worst_case()`): rank 0 of the plan's trainer GPUs (the FSDP2 shard degree; one trainer GPU:
the unsharded rank with its weights in place under autocast), the plan's micro-batching (sequences per
micro-batch, or the token budget), checkpointing and log-prob kernel (fused / plain), the reference
model when the workload has a KL loss, the old-policy pass when the step has several mini-batches or
epochs, the entropy bonus when `entropy_coeff` > 0, and samples in GRPO groups of the workload's n.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import old_logprob_pass_needed
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.memory.layout import layout_for
from grpo_pilot.planner.memory.tokens import sequences_per_sp_group
from grpo_pilot.planner.ref_offload import ref_offloaded
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.verify.single_rank import CAST_LABEL
from grpo_pilot.verify.traced import ActorTrace, PassTrace, trace_actor_step

ACTS_ROW = "activations, logits, temporaries"  # the tracker splits these by moment, not by item
# Analytic item (planner/estimate.py, memory/moments.py) -> comparison row. Items not listed and not in
# NOT_TRACED get a row of their own with traced = 0 (a new analytic item is never dropped silently).
ROW_OF_ITEM: dict[str, str] = {
    "actor_params": "sharded params",
    "actor_grads": "sharded grads",
    "optimizer_states": "Adam states",
    "ref_params": "reference shard",
    "optimizer_step_temporaries": "optimizer-step temporaries",
    "gathered_layers": "gathered params",
    "root_embed_lm_head": "gathered params",
    "unsharded_grads": "unsharded grads",
    "root_reduce_scatter": "unsharded grads",
    "activations": ACTS_ROW,
    "recompute_activations": ACTS_ROW,
    "logits": ACTS_ROW,
    "layer_backward_temporaries": ACTS_ROW,
    "ulysses_all_to_all": ACTS_ROW,  # always 0 here: Ulysses plans are refused
    "autocast_weight_cache": "autocast weight casts",
}
ROWS: tuple[str, ...] = tuple(dict.fromkeys(ROW_OF_ITEM.values()))
# Not tensors, or not on the trainer's side: CUDA context, cuBLAS, NCCL, fragmentation, the vLLM leftovers, our
# engine's hf rollout replica (planner/memory/hf_rollout.py: the rollout's module, not the actor the trace runs).
NOT_TRACED_PREFIXES = ("overhead_", "vllm_", "hf_replica_")
# KL coefficient of the traced loss: any value > 0 builds the same graph (verl's kl_loss_coef default).
TRACE_KL_COEF = 0.001


class Bytes(Frozen):
    """A phase's tensor bytes on rank 0, by comparison row."""

    total_bytes: int = Field(ge=0)
    items: dict[str, int] = Field(description="Comparison row -> bytes; sums to total_bytes.")


class PhaseCheck(Frozen):
    """Traced vs analytic tensor bytes of one phase."""

    phase: str
    traced: Bytes
    analytic: Bytes
    relative_error: dict[str, float | None] = Field(
        description="(analytic - traced) / traced per row and 'total'; > 0 over-estimates; None: traced 0."
    )
    not_traced: dict[str, int] = Field(description="Analytic items outside the trace (overheads, vLLM leftovers).")

    @property
    def total_error(self) -> float:
        return self.relative_error["total"] or 0.0


class VerifyReport(Frozen):
    """What `grpo-plan --verify` prints: the update and log-prob phases, traced and analytic."""

    model_name: str
    cluster_label: str
    world_size: int = Field(ge=1, description="Trainer GPUs = FSDP2 shard degree traced.")
    update: PhaseCheck
    log_prob: PhaseCheck | None = Field(default=None, description="None: the step runs no log-prob pass.")
    notes: tuple[str, ...] = Field(default=(), description="What the trace did differently from the plan, and why.")
    trace: ActorTrace

    def to_json_dict(self) -> dict[str, Any]:
        """`"verify"` of `grpo-plan --json --verify`: the update phase at the top, the log-prob phase beside."""
        out: dict[str, Any] = self.update.model_dump(include={"traced", "analytic", "relative_error", "not_traced"})
        out["log_prob"] = (
            None
            if self.log_prob is None
            else self.log_prob.model_dump(include={"traced", "analytic", "relative_error", "not_traced"})
        )
        out.update(
            world_size=self.world_size,
            tokens_per_update_micro_batch=self.trace.update_tokens_per_micro_batch,
            tokens_per_log_prob_micro_batch=self.trace.log_prob_tokens,
            trace_s=round(self.trace.trace_s, 3),
            notes=list(self.notes),
        )
        return out


def traced_rows(labels: dict[str, int], adam_bytes: int, ref_on_device: int, ref_traced: int) -> dict[str, int]:
    """Tracker labels at a peak -> comparison rows. The (sharded) parameter label holds the policy's and the
    reference's parameters; `ref_traced` is the reference's part, `ref_on_device` what of it the plan keeps
    on the GPU (0 with ref_param_offload). FSDPMemTracker labels (sharded) and MemTracker labels (one
    unsharded rank: Parameter, Gradient, Optstate, and autocast's parameter casts) both map here."""
    opt = labels.get("OptState", 0) + labels.get("Optstate", 0)
    adam = min(opt, adam_bytes)
    params = labels.get("Sharded Param", 0) + labels.get("Parameter", 0)
    return {
        "sharded params": params + labels.get("Buffer", 0) - ref_traced,
        "sharded grads": labels.get("Sharded Grad", 0) + labels.get("Gradient", 0),
        "Adam states": adam,
        "reference shard": ref_on_device,
        "optimizer-step temporaries": opt - adam,
        "gathered params": labels.get("Unsharded Param", 0) + labels.get("All Gather", 0),
        "unsharded grads": labels.get("Unsharded Grad", 0) + labels.get("Reduce Scatter", 0),
        "autocast weight casts": labels.get(CAST_LABEL, 0),
        ACTS_ROW: sum(labels.get(k, 0) for k in ("Activation", "Inputs", "Temp", "Other")),
    }


def relative_error(analytic: int, traced: int) -> float | None:
    """(analytic − traced) / traced; 0 when both are 0, None when only the trace is 0."""
    if traced == 0:
        return 0.0 if analytic == 0 else None
    return (analytic - traced) / traced


def phase_check(phase: str, traced: dict[str, int], analytic_items: dict[str, int]) -> PhaseCheck:
    """Group the analytic items into rows and set them beside the traced rows."""
    not_traced = {k: v for k, v in analytic_items.items() if k.startswith(NOT_TRACED_PREFIXES)}
    analytic: dict[str, int] = {}
    for name, value in analytic_items.items():
        if name not in not_traced:
            row = ROW_OF_ITEM.get(name, name)
            analytic[row] = analytic.get(row, 0) + value
    names = list(traced) + [r for r in analytic if r not in traced]
    t_items = {r: traced.get(r, 0) for r in names}
    a_items = {r: analytic.get(r, 0) for r in names}
    t_total, a_total = sum(t_items.values()), sum(a_items.values())
    errors = {r: relative_error(a_items[r], t_items[r]) for r in names}
    errors["total"] = relative_error(a_total, t_total)
    return PhaseCheck(
        phase=phase,
        traced=Bytes(total_bytes=t_total, items=t_items),
        analytic=Bytes(total_bytes=a_total, items=a_items),
        relative_error=errors,
        not_traced=not_traced,
    )


def _unsupported(knobs: Any, target: str) -> list[str]:
    problems = []
    if target != "grpo-pilot":
        problems.append(f"target '{target}' (the trace runs our engine's actor)")
    for name in ("param_offload", "optimizer_offload"):
        if getattr(knobs, name):
            problems.append(f"{name}=True (FSDP2 CPUOffloadPolicy keeps the training states in host RAM)")
    if knobs.ulysses_sp > 1:
        problems.append(f"ulysses_sp={knobs.ulysses_sp} (our engine has no sequence parallelism)")
    return problems


def trace_inputs(cluster: Any, workload: Any, knobs: Any) -> dict[str, Any]:
    """The sequences the trace feeds, from the plan's micro-batching (see `compare_with_analytic`)."""

    layout = layout_for(cluster.num_nodes, cluster.gpus_per_node, knobs.placement, knobs.split_rollout_gpus_per_node)
    world = layout.trainer_gpus
    seq = workload.prompt_len_tokens + workload.response_len_tokens
    mini_seqs = sequences_per_sp_group(workload.mini_batch_prompts * workload.n, world, 1)
    step_seqs = sequences_per_sp_group(workload.prompts_per_step * workload.n, world, 1)
    if knobs.max_token_len_per_gpu is not None:  # padded bins: rows while rows x longest <= budget
        per_mb = max(1, knobs.max_token_len_per_gpu // seq)
    else:
        per_mb = knobs.micro_batch_size_per_gpu or 1
    if knobs.log_prob_micro_batch_size_per_gpu is not None:
        lp_seqs = min(knobs.log_prob_micro_batch_size_per_gpu, step_seqs)
        lp_budget = lp_seqs * seq  # the engine batches log-prob passes by tokens: the same micro-batch
    else:
        lp_budget = knobs.log_prob_max_token_len_per_gpu
        lp_seqs = min(max(1, lp_budget // seq), step_seqs)
    old_pass = old_logprob_pass_needed(workload, traits_for("grpo-pilot"))
    return {
        "world_size": world,
        "update_seqs": min(2 * min(per_mb, mini_seqs), mini_seqs),
        "log_prob_seqs": lp_seqs if (old_pass or workload.use_kl_loss) else 0,
        "log_prob_budget": lp_budget,
        "old_pass": old_pass,
        "group_size": workload.n,
    }


def compare_with_analytic(
    spec: ModelSpec, cluster: Any, workload: Any, knobs: Any, *, target: str = "grpo-pilot"
) -> VerifyReport:
    """Trace the step the plan implies and set it beside `estimate_memory(...)` (module docstring).

    The update is fed two micro-batches (the second one's backward runs with every sharded gradient
    resident: the update's peak), each log-prob pass one micro-batch; all sequences full length, so the
    estimate is taken for the same worst case. A reference offloaded by the plan (ref_param_offload, or verl's
    forced FSDP CPUOffload: planner/ref_offload.py) is traced on the device and its shard left out of the
    traced rows (it lives in host RAM).
    """
    from grpo_pilot.engine.actor import LossSettings
    from grpo_pilot.engine.settings import ActorSettings

    workload = workload.worst_case()
    inputs = trace_inputs(cluster, workload, knobs)
    problems = _unsupported(knobs, target)
    if problems:
        raise InputError(
            f"--verify cannot trace this plan: {'; '.join(problems)}.",
            "Verify a plan for target grpo-pilot without param/optimizer offload and without Ulysses "
            "(e.g. --pin param_offload=false --pin optimizer_offload=false --pin ulysses_sp=1).",
        )
    kl = workload.use_kl_loss
    traced_knobs = knobs.model_copy(
        update={"ref_param_offload": False, "log_prob_max_token_len_per_gpu": inputs["log_prob_budget"]}
    )
    settings = ActorSettings.from_knobs(traced_knobs, with_ref=kl)
    loss = LossSettings(kl_coef=TRACE_KL_COEF if kl else 0.0, entropy_coeff=workload.entropy_coeff)
    trace = trace_actor_step(
        spec,
        world_size=inputs["world_size"],
        settings=settings,
        loss=loss,
        prompt_len_tokens=workload.prompt_len_tokens,
        response_len_tokens=workload.response_len_tokens,
        update_seqs=inputs["update_seqs"],
        log_prob_seqs=inputs["log_prob_seqs"],
        old_pass=inputs["old_pass"],
        numerics="cpu" if cluster.gpu.is_cpu else "cuda",
        group_size=inputs["group_size"],
    )
    notes = []
    # the key, or verl's FSDP reference under CPUOffload whatever the key since #121 (planner/ref_offload.py)
    offloaded = ref_offloaded(knobs, traits_for(target))
    ref_on_device = 0 if offloaded else trace.ref_shard_bytes
    if kl and offloaded:
        notes.append(
            "reference offloaded (ref_param_offload, or verl's forced CPUOffload): the reference shard was traced "
            "on the device and is left out (it lives in host RAM)."
        )
    report = estimate_memory(spec, cluster, workload, knobs, target=target)  # type: ignore[arg-type]
    adam = trace.optimizer_state_bytes
    update = phase_check(
        "update",
        traced_rows(trace.update.labels, adam, ref_on_device, trace.ref_shard_bytes),
        report.phases["update"].items,
    )
    log_prob = None
    lp = trace.log_prob
    if lp is not None:
        log_prob = phase_check(
            "log_prob",
            traced_rows(lp.labels, adam, ref_on_device, trace.ref_shard_bytes),
            report.phases["log_prob"].items,
        )
    return VerifyReport(
        model_name=spec.name,
        cluster_label=cluster.label(),
        world_size=trace.world_size,
        update=update,
        log_prob=log_prob,
        notes=tuple(notes),
        trace=trace,
    )


def verify_plan(plan: Any) -> VerifyReport:
    """`grpo-plan --verify`: the plan's own model, cluster, workload, knobs and target."""
    return compare_with_analytic(plan.model.spec, plan.cluster, plan.workload, plan.knobs, target=plan.target)


__all__ = ["PassTrace", "VerifyReport", "PhaseCheck", "compare_with_analytic", "verify_plan", "phase_check"]
