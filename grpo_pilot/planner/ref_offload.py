"""Where the reference model's parameters live, per executor: one home for "is the reference offloaded".

Three modes, each read in the executor's code:

- "resident": the reference's shard stays on the GPU through every phase (plain FSDP, offload off).
- "loaded": the shard lives on the host between passes and the whole shard is brought back to the GPU for the
  reference pass, then offloaded again. verl's reference with `ref.fsdp_config.param_offload` before fefca4172
  (#121, 2025-01-24: fsdp_workers.py@fefca4172^ compute_ref_log_prob `load_fsdp_param_and_grad` ...
  `offload_fsdp_param_and_grad`), and verl's Megatron reference with `ref.megatron.param_offload` (megatron_workers.py
  @b178a3cd5 compute_ref_log_prob: `load_megatron_model_to_gpu` / `offload_megatron_model_to_cpu`).
- "streamed": the shard never leaves the host; every FSDP unit copies its piece to the GPU, all-gathers it for its
  forward and frees it after (one gathered unit at a time, counted by the log-prob pass's gathered layers and root
  like any FSDP forward), for every micro-batch. Our engine's and TRL's offloads (FSDP2 CPUOffloadPolicy / ZeRO-3:
  `ExecutorTraits.offload_streams`), and verl's FSDP reference since #121 *whatever its param_offload key*:
  `_build_model_optimizer` passes `cpu_offload = None if role == "actor" else CPUOffload(offload_params=True)` to
  FSDP1 and `CPUOffloadPolicy(pin_memory=True)` to FSDP2 (db84a4007, #1026), and `compute_ref_log_prob` no longer
  loads or offloads anything (fsdp_workers.py@fefca4172 and @b178a3cd5; the new engine likewise forces it for a
  forward-only module: workers/engine/fsdp/transformer_impl.py@b178a3cd5 `forward_only`). `ExecutorTraits.
  forces_fsdp_ref_offload` says verl does this; `Knobs.ref_forced_cpu_offload` (True by default, False for a
  --from-verl launch before #121: verl_versions.CHANGES "ref_cpu_offload") says the launch's verl has it. The
  Megatron backend has no such force (it honours ref.megatron.param_offload).
"""

from __future__ import annotations

from typing import Literal

from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.traits import ExecutorTraits

RefOffloadMode = Literal["resident", "loaded", "streamed"]


def forced_ref_offload(knobs: Knobs, executor: ExecutorTraits) -> bool:
    """verl's FSDP reference under CPUOffload whatever `ref_param_offload` (module docstring)."""
    return executor.forces_fsdp_ref_offload and knobs.strategy == "fsdp" and knobs.ref_forced_cpu_offload


def ref_offload_mode(knobs: Knobs, executor: ExecutorTraits) -> RefOffloadMode:
    """Where the reference's parameters live between and during its passes (module docstring)."""
    if forced_ref_offload(knobs, executor):
        return "streamed"
    if not knobs.ref_param_offload:
        return "resident"
    return "streamed" if executor.offload_streams else "loaded"


def ref_offloaded(knobs: Knobs, executor: ExecutorTraits) -> bool:
    """The reference's shard is on the host outside its pass (the knob, or verl's forced offload)."""
    return ref_offload_mode(knobs, executor) != "resident"
