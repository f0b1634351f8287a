"""What an executor can run, and the launch families the planner cannot plan: refusals, not plans.

`unsupported(target, workload, knobs)` lists every reason a configuration cannot be planned for `target`
(empty: it can). Two kinds:

- the executor does not run it (`ExecutorTraits.algorithms`, `strategies`, `rollout_engines`, and the
  family knobs it misses — `traits.FAMILY_KNOBS`): our engine (`grpo-run`) runs GRPO on FSDP with vLLM or
  its HF decode loop, TRL's GRPOTrainer the same; only verl runs PPO with a critic, Megatron and SGLang.
  Planning such a job for grpo-run would describe a run that cannot happen, so it is refused with the
  target that can run it.
- combinations no public source lets the planner check, each with its reason (docs/families.md "What
  stays refused"):
  * a Mixture-of-Experts model under Megatron: the expert parameter and optimizer shards are modelled
    (memory/megatron.py), but not the token-dispatch buffers (alltoall / DeepEP "flex" dispatchers),
    expert load imbalance, nor the precision-aware CPU optimizer such launches turn on
    (`optimizer_offload_fraction`, `optimizer_cpu_offload`); the one public launch with an outcome
    (verl run_qwen3moe-30b_megatron_96gb.sh, OOM on 64 H20) depends on exactly those;
  * a critic trained under Megatron (`critic.strategy=megatron` with GAE): verl's Megatron critic is a
    separate pipeline with its own parallel sizes; no public launch with an outcome exists to check it;
  * LoRA under Megatron (verl `model.lora.*`, Megatron-Bridge): its fused adapters are counted
    (memory/lora.py) but the bridge's activation and weight-export paths are not, and no public launch
    with an outcome exists;
  * LoRA with SGLang rollout (SGLang's LoRA pools are not modelled) and with HF rollout in verl;
  * activation offload under Megatron (verl implements it for FSDP only) and an HF rollout under Megatron
    (verl's Megatron workers roll out with vLLM or SGLang);
  * a bitsandbytes-quantized base without adapters: nothing is trainable (bitsandbytes weights take no
    gradients); peft's adapters are what such a launch trains;
  * DoRA (peft `use_dora`: the magnitude vector and a weight-norm recomputation of every adapted weight in
    each forward) and `modules_to_save` (modules trained in full beside the adapters): the LoRA leaves count
    plain adapters only.
Pure: the CLI turns the list into an `InputError` (exit 2).
"""

from __future__ import annotations

from grpo_pilot.errors import InputError
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.traits import FAMILY_KNOBS, traits_for

_RUNS_IT = "verl"  # the executor that runs every launch family modelled here


def _executor_problems(target: str, workload: Workload, knobs: Knobs) -> list[str]:
    ex = traits_for(target)
    engine = "grpo-run" if target == "grpo-pilot" else target
    problems = []
    if workload.algorithm not in ex.algorithms:
        problems.append(f"{engine} does not run {workload.algorithm.upper()} (no critic)")
    if knobs.strategy not in ex.strategies:
        problems.append(f"{engine} does not train with the {knobs.strategy} backend")
    if knobs.rollout_backend not in ex.rollout_engines:
        problems.append(f"{engine} has no {knobs.rollout_backend} rollout")
    if knobs.state_sharding != "full" and not ex.has_knob("state_sharding"):
        problems.append(f"{engine} shards every model state (FSDP): no state_sharding={knobs.state_sharding}")
    if knobs.model_dtype != "fp32" and not ex.has_knob("model_dtype"):
        problems.append(f"{engine} creates the actor in fp32 (mixed precision): no model_dtype={knobs.model_dtype}")
    defaults = Knobs()
    moved = sorted(
        name
        for name in FAMILY_KNOBS & ex.missing_knobs
        if name != "strategy" and getattr(knobs, name) != getattr(defaults, name)
    )
    if moved and knobs.strategy in ex.strategies:
        problems.append(f"{engine} has no setting for {', '.join(moved)}")
    return problems


def _family_problems(model_is_moe: bool, workload: Workload, knobs: Knobs) -> list[str]:
    megatron = knobs.strategy == "megatron"
    adapter = workload.adapter is not None and workload.adapter.method != "none"
    problems = []
    if megatron and model_is_moe:
        problems.append(
            "a Mixture-of-Experts model under Megatron is not modelled (token-dispatch buffers, expert load "
            "imbalance and Megatron's CPU optimizer offload are not)"
        )
    if megatron and workload.has_critic:
        problems.append("a critic trained under Megatron is not modelled")
    if megatron and adapter:
        problems.append("LoRA under Megatron (Megatron-Bridge) is not modelled")
    if megatron and knobs.activation_offload:
        problems.append("activation offload exists for FSDP only (verl enable_activation_offload)")
    if megatron and knobs.rollout_backend == "hf":
        problems.append("verl's Megatron workers roll out with vLLM or SGLang, not HF generate")
    if adapter and workload.adapter.method == "dora":
        problems.append("DoRA is not modelled (its weight-norm recomputation holds a full weight per adapted layer)")
    if adapter and workload.adapter.modules_to_save:
        problems.append(
            f"modules trained in full beside the adapters ({', '.join(workload.adapter.modules_to_save)[:60]}) "
            "are not modelled"
        )
    quantized_only = workload.adapter is not None and workload.adapter.method == "none"
    if quantized_only and workload.adapter.base_quantization:
        problems.append("a bitsandbytes-quantized base without adapters has no trainable weights (add use_peft)")
    if adapter and knobs.rollout_backend == "sglang":
        problems.append("LoRA with SGLang rollout is not modelled (SGLang's LoRA memory pools)")
    return problems


def unsupported(target: str, workload: Workload, knobs: Knobs, *, model_is_moe: bool = False) -> list[str]:
    """Every reason this configuration cannot be planned for `target` (module docstring); empty when it can."""
    return _executor_problems(target, workload, knobs) + _family_problems(model_is_moe, workload, knobs)


def require_supported(target: str, workload: Workload, knobs: Knobs, *, model_is_moe: bool = False) -> None:
    """`unsupported` as an `InputError` naming every reason and what to do instead."""
    executor = _executor_problems(target, workload, knobs)
    family = _family_problems(model_is_moe, workload, knobs)
    if not executor and not family:
        return
    hint = (
        f"Plan it for the executor that runs it (--target {_RUNS_IT}), or change the job."
        if executor
        else "docs/families.md lists what grpo-plan models for each launch family; plan a variant it models."
    )
    raise InputError(f"This job cannot be planned for --target {target}: {'; '.join(executor + family)}.", hint)
