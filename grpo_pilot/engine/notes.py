"""Notes for profile.json: where this run did something the plan's prediction does not assume.

Each note is one sentence a reader can act on; `run_notes` is a pure function of the plan and what
the run reports about itself.
"""

from __future__ import annotations

from typing import Any

from grpo_pilot.planner.adapters import adapters_modelled


def adapter_notes(plan: Any, *, adapter_params: int, adapter_bytes: int) -> tuple[str, ...]:
    """What a LoRA run does differently from what its plan says (none without adapters)."""
    adapter = plan.workload.adapter
    if adapter is None:
        return ()
    notes = (
        f"adapters: {adapter.describe()}: {adapter_params:,} trainable parameters ({adapter_bytes / 2**20:.2f} MiB) "
        "on a frozen base; the reference log-probs are the base's (adapters disabled, no second copy) and checkpoints "
        "hold the adapters and their AdamW states only",
    )
    if not adapters_modelled(plan):
        notes += (
            "adapters: the plan's memory and time figures are those of full fine-tuning (grpo-plan does not model "
            "adapters yet: it counts gradients and AdamW states for every parameter and, with a KL loss, a reference "
            "copy); the measured peaks stand beside them, but memory is not compared",
        )
    return notes


def run_notes(
    plan: Any,
    *,
    rollout_backend: str,
    engine_old_pass: bool,
    shared_forwards: int,
    steps_run: int,
    rollout_replica_bytes: int = 0,
    rollout_weight_copy_bytes: int = 0,
    fused_adamw_on_gpu: bool = False,
) -> tuple[str, ...]:
    """Mismatches between the plan and this run (module docstring)."""
    notes: tuple[str, ...] = ()
    if rollout_backend != plan.knobs.rollout_backend:
        notes += (
            f"rollout backend '{rollout_backend}' is not the plan's '{plan.knobs.rollout_backend}': predictions "
            "assume the plan's",
        )
    notes += _replica_notes(plan, rollout_replica_bytes)
    k = plan.knobs
    if k.param_offload != k.optimizer_offload:
        only = "param_offload" if k.param_offload else "optimizer_offload"
        notes += (
            f"offload: the plan sets only {only}; FSDP2's CPUOffloadPolicy keeps parameters, gradients and optimizer "
            "states on the host together, so the run offloads all three",
        )
    if plan.run.old_logprob_pass != engine_old_pass:
        notes += (
            f"log_prob: this run {'runs' if engine_old_pass else 'skips'} the old-policy pass; the plan (target "
            f"{plan.target}, its workload) {'skips' if engine_old_pass else 'counts'} it",
        )
    if shared_forwards:
        notes += (
            f"update/log_prob: {shared_forwards} micro-batches computed each distinct prompt once (shared-prompt "
            "forward); the plan's time and activation figures assume every sequence computes its prompt, so they "
            "bound these phases from above",
        )
    notes += _weight_copy_notes(plan, rollout_weight_copy_bytes)
    items = plan.phases["update"].items if "update" in plan.phases else {}
    if fused_adamw_on_gpu and items.get("optimizer_step_temporaries"):
        notes += (
            "update: AdamW ran the fused kernel (no step temporaries); the plan counts the foreach kernel's "
            f"{items['optimizer_step_temporaries'] / 2**30:.2f} GiB at the optimizer step",
        )
    if steps_run == 1:
        notes += ("only one step ran in this process: its numbers include warm-up",)
    return notes


def _replica_notes(plan: Any, replica_bytes: int) -> tuple[str, ...]:
    """The hf rollout's replica of the model (engine/rollout/hf.py `replica_bytes`, engine/worker.py `_build_rollout`)
    against the plan's `hf_replica_weights` item (planner/memory/hf_rollout.py): a note only where one holds it and
    the other not (a plan for another target, or made before the planner counted it; a run on another backend)."""
    planned = max((p.items.get("hf_replica_weights", 0) for p in plan.phases.values()), default=0)
    if replica_bytes and not planned:
        return (
            f"rollout: the hf backend generated on its own copy of the weights on every rollout worker "
            f"({replica_bytes / 2**30:.2f} GiB each, resident in every phase); the plan (target {plan.target}) "
            "assumes it generates on the trainer's module and does not count it (re-plan with grpo-plan)",
        )
    if planned and not replica_bytes:
        return (
            f"rollout: the plan counts a replica of the weights for the hf rollout ({planned / 2**30:.2f} GiB on "
            "each rollout GPU); this run generated without one",
        )
    return ()


def _weight_copy_notes(plan: Any, copy_bytes: int) -> tuple[str, ...]:
    """The static decode loop's bf16 weight copy (engine/rollout/hf.py `weight_copy_bytes`) against the plan's
    `hf_decode_weight_copy` item (planner/memory/hf_generate.py): a note only where one holds it and the other not."""
    rollout = plan.phases.get("rollout")
    planned = rollout.items.get("hf_decode_weight_copy", 0) if rollout is not None else 0
    knob = getattr(plan.knobs, "hf_decode", "auto")
    if copy_bytes and not planned:
        return (
            f"rollout/weight_sync: the hf rollout decoded from a bf16 copy of the weights ({copy_bytes / 2**30:.2f} "
            f"GiB, held from the weight sync to the end of the rollout); the plan (hf_decode={knob}) decodes eagerly "
            "and does not count it (re-plan with --pin hf_decode=static, or run with hf_decode=eager)",
        )
    if planned and not copy_bytes:
        return (
            f"rollout/weight_sync: the plan counts a bf16 copy of the weights for the static decode loop "
            f"({planned / 2**30:.2f} GiB, hf_decode={knob}); this run decoded eagerly and held none",
        )
    return ()
