"""Structural rules of the launch families (constraints.py calls `family_checks`).

Megatron (verl `actor.strategy=megatron`; Megatron-Core's own checks):
- megatron.world_divisible — the training GPUs divide by TP × PP × CP (verl/utils/config.py
  `validate_config`: "n_gpus must be divisible by model_parallel_size times context_parallel_size");
- megatron.heads_divisible_by_tp — TP divides the query heads and the kv heads (memory/megatron_activations.py
  splits K and V by TP; recent mcore replicates a kv head when TP > kv heads, which is not modelled);
- megatron.layers_divisible — PP × VPP divides the layers (Megatron's uniform split; verl's
  `num_layers_in_first/last_pipeline_stage` overrides are not modelled);
- megatron.vpp_needs_pp — interleaving (VPP > 1) needs a pipeline (PP > 1);
- megatron.vpp_microbatches — with VPP the micro-batches of a mini-batch come in groups of
  `microbatch_group_size_per_vp_stage` (default PP): a fixed micro-batch must give a multiple of PP (verl
  asserts it; with dynamic batching verl pads the count itself);
- megatron.no_fsdp_knobs — Ulysses SP and an FSDP group size are FSDP settings (Megatron has CP and DP).
Launchers (`Knobs.state_sharding`):
- offload.needs_sharding — parameter and reference offload need every state sharded (FSDP / ZeRO-3); DeepSpeed
  ZeRO-1/2 offload only the optimizer (memory/zero.py); DDP offloads nothing.
FSDP:
- activation_offload.layers — verl's activation offload needs at least three decoder layers (its handler
  offloads L − 1 groups and refuses fewer than two).
"""

from __future__ import annotations

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.constraints_base import Check, rule
from grpo_pilot.planner.memory.zero import ZERO_MODES
from grpo_pilot.profiles.spec import ModelSpec


def megatron_model_parallel(knobs: Knobs) -> int:
    """GPUs one data-parallel rank spans under Megatron: TP × PP × CP."""
    return knobs.megatron_tp * knobs.megatron_pp * knobs.megatron_cp


def data_parallel_divisor(knobs: Knobs) -> int:
    """GPUs one data-parallel rank spans: the Ulysses group under FSDP, TP × PP × CP under Megatron."""
    return megatron_model_parallel(knobs) if knobs.strategy == "megatron" else knobs.ulysses_sp


def minimal_batch(knobs: Knobs, train_gpus: int, dp: int) -> int:
    """The responses per step must divide by this (verl validate_config): the training GPUs under FSDP, DP ×
    the micro-batch under Megatron with fixed micro-batches (DP with dynamic batching)."""
    if knobs.strategy != "megatron":
        return train_gpus
    micro = 1 if knobs.dynamic_batching else (knobs.micro_batch_size_per_gpu or 1)
    return max(1, dp) * micro


def _megatron(spec: ModelSpec, workload: Workload, knobs: Knobs, *, train_gpus: int, dp: int) -> list[Check]:
    tp, pp, vpp, cp = knobs.megatron_tp, knobs.megatron_pp, knobs.megatron_vpp, knobs.megatron_cp
    mp = megatron_model_parallel(knobs)
    layers = spec.num_layers
    per_dp = workload.mini_batch_prompts * workload.n // dp if dp else 0
    micro = knobs.micro_batch_size_per_gpu or 1
    groups_ok = vpp == 1 or knobs.dynamic_batching or (per_dp // micro) % pp == 0
    return [
        rule(
            "megatron.world_divisible",
            train_gpus % mp == 0,
            f"the {train_gpus} training GPUs are not divisible by TP {tp} × PP {pp} × CP {cp} = {mp}.",
        ),
        rule(
            "megatron.heads_divisible_by_tp",
            spec.num_attention_heads % tp == 0 and spec.num_kv_heads % tp == 0,
            f"megatron_tp={tp} does not divide the {spec.num_attention_heads} heads / {spec.num_kv_heads} kv heads.",
        ),
        rule(
            "megatron.layers_divisible",
            layers % (pp * vpp) == 0,
            f"the {layers} layers are not divisible by PP {pp} × VPP {vpp}.",
        ),
        rule("megatron.vpp_needs_pp", vpp == 1 or pp > 1, f"megatron_vpp={vpp} needs megatron_pp > 1."),
        rule(
            "megatron.vpp_microbatches",
            groups_ok,
            f"with VPP the micro-batches of a mini-batch ({per_dp} sequences per DP rank / {micro}) must be a "
            f"multiple of PP {pp} (microbatch_group_size_per_vp_stage).",
        ),
        rule(
            "megatron.no_fsdp_knobs",
            knobs.ulysses_sp == 1 and knobs.fsdp_size is None,
            "ulysses_sp and fsdp_size are FSDP settings; Megatron splits sequences with megatron_cp.",
        ),
    ]


def family_checks(spec: ModelSpec, workload: Workload, knobs: Knobs, *, train_gpus: int, dp: int) -> tuple[Check, ...]:
    """The launch families' structural rules for this configuration (module docstring)."""
    checks: list[Check] = []
    if knobs.strategy == "megatron":
        checks += _megatron(spec, workload, knobs, train_gpus=train_gpus, dp=dp)
    offloads = [k for k in ("param_offload", "optimizer_offload", "ref_param_offload") if getattr(knobs, k)]
    # ZeRO-1/2 offload only the optimizer (DeepSpeed's offload_optimizer: memory/zero.py); offload_param is ZeRO-3's
    # (deepspeed/runtime/zero/stage3.py `_configure_offloading`), and DDP offloads nothing
    allowed = ("optimizer_offload",) if knobs.state_sharding in ZERO_MODES else ()
    if knobs.state_sharding != "full" and set(offloads) - set(allowed):
        checks.append(
            rule(
                "offload.needs_sharding",
                False,
                f"{', '.join(offloads)} under state_sharding={knobs.state_sharding}: parameters offload only with "
                "every state sharded (state_sharding=full: fsdp: or DeepSpeed ZeRO-3 offload_param), ZeRO-1/2 offload "
                "only the optimizer (offload_optimizer), and DDP cannot offload.",
            )
        )
    if knobs.activation_offload:
        checks.append(
            rule(
                "activation_offload.layers",
                spec.num_layers >= 3,
                f"activation offload needs at least 3 decoder layers (the model has {spec.num_layers}).",
            )
        )
    return tuple(checks)
