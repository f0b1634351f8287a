"""Constraints a plan must satisfy: verl's start-up checks and the memory limits.

Each rule yields a `Check` with a normalised `excess` (≤ 0 satisfied, > 0 violated; for limits it
is (needed − available) / available, for divisibility rules 1.0 when broken), so the same numbers
serve the verdict, the message and Optuna's `trial.set_constraint` (feasible when ≤ 0).

Structural rules (no memory estimate needed; reference/verl-config.md "Validation rules"):
- batch.divisible_by_world — `train_batch_size × n % n_gpus == 0` (verl `validate_config`, FSDP; Megatron:
  `% (DP × ppo_micro_batch_size_per_gpu)`, verl/utils/config.py L89–L112 at b178a3cd).
- mini_batch.per_gpu — normalised mini-batch `mini × n ÷ (world/SP)` > 0 (verl fsdp_workers).
- mini_batch.divisible_by_micro — that mini-batch % `ppo_micro_batch_size_per_gpu` == 0 (not dynamic).
- micro_batch.set — micro-batch or a token budget must be set (verl actor config).
- rollout.world_divisible_by_tp — rollout GPUs % TP == 0 (verl rollout worker).
- rollout.heads_divisible_by_tp — heads % TP == 0; kv heads % TP == 0 or TP % kv heads == 0 (vLLM).
- ulysses.heads_divisible_by_sp — heads % SP == 0; kv % SP == 0 or SP % kv == 0 (verl monkey_patch).
- ulysses.world_divisible_by_sp — training GPUs % SP == 0.
- token_budget.update / token_budget.log_prob — budget × SP ≥ prompt + response (verl seqlen_balancing;
  SP scales the budget only for verl, our engine and TRL need budget ≥ one sequence); the log-prob rule
  only applies when log-prob micro-batches are packed by the budget (no fixed micro-batch).
- rollout.batched_tokens_ge_seqs — max_num_batched_tokens ≥ max_num_seqs (vLLM SchedulerConfig).
- context.max_position — prompt + response ≤ the model's max_position_embeddings (vLLM max_model_len).
- split.pools — split placement leaves at least one GPU per node to each pool.
- the launch families' rules (family_constraints.py): Megatron's layout (TP × PP × CP divides the training
  GPUs, TP divides the heads, PP (× VPP) the layers, interleaving needs PP > 1 and whole micro-batch groups),
  no FSDP-only knob under Megatron, activation offload's three layers. Under Megatron a data-parallel rank
  spans TP × PP × CP GPUs: the batch rules count DP ranks, and verl's minimal batch is DP × the micro-batch.
Memory rules: memory.<phase> ≤ usable GPU bytes; host_ram ≤ host RAM per node; rollout.kv_cache
holds one max-length request (vLLM refuses to start otherwise).
"""

from __future__ import annotations

from grpo_pilot.hardware.cluster import Cluster
from grpo_pilot.hardware.gpus import GiB
from grpo_pilot.planner.config import Knobs, Target, Workload
from grpo_pilot.planner.constraints_base import Check
from grpo_pilot.planner.constraints_base import check as _check
from grpo_pilot.planner.constraints_base import rule as _rule
from grpo_pilot.planner.family_constraints import data_parallel_divisor, family_checks, minimal_batch
from grpo_pilot.planner.reports import MemoryReport
from grpo_pilot.planner.roofline import pools
from grpo_pilot.planner.rules import heads_divisible, phases_present
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles.spec import ModelSpec


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _batch_rules(workload: Workload, knobs: Knobs, train_gpus: int, dp: int) -> list[Check]:
    """The batch sizes against the data-parallel ranks and the micro-batch."""
    responses = workload.responses_per_step
    mini_per_gpu = workload.mini_batch_prompts * workload.n // dp if dp else 0
    micro = knobs.micro_batch_size_per_gpu
    return [
        _rule(
            "batch.divisible_by_world",
            responses % minimal_batch(knobs, train_gpus, dp) == 0,
            f"prompts per step × n = {responses} is not divisible by {minimal_batch(knobs, train_gpus, dp)} "
            "(the training GPUs; with Megatron DP × micro-batch: verl validate_config).",
        ),
        _rule(
            "mini_batch.per_gpu",
            mini_per_gpu > 0,
            f"the mini-batch of {workload.mini_batch_prompts} prompts × n = "
            f"{workload.mini_batch_prompts * workload.n} responses is smaller than the {dp or train_gpus} "
            "data-parallel ranks.",
        ),
        _rule(
            "micro_batch.set",
            knobs.dynamic_batching or micro is not None,
            "neither micro_batch_size_per_gpu nor max_token_len_per_gpu is set.",
        ),
        _rule(
            "mini_batch.divisible_by_micro",
            knobs.dynamic_batching or micro is None or (mini_per_gpu > 0 and mini_per_gpu % micro == 0),
            f"the per-GPU mini-batch ({mini_per_gpu} responses) is not divisible by micro_batch_size_per_gpu={micro}.",
        ),
    ]


def _parallel_rules(spec: ModelSpec, knobs: Knobs, rollout_gpus: int, train_gpus: int) -> list[Check]:
    """Rollout TP and Ulysses SP against the GPUs of their pools and the model's heads."""
    tp, sp = knobs.rollout_tp, knobs.ulysses_sp
    vllm = knobs.rollout_backend != "hf"  # a rollout engine with its own TP (vLLM or SGLang)
    heads, kv = spec.num_attention_heads, spec.num_kv_heads
    return [
        _rule(
            "rollout.world_divisible_by_tp",
            not vllm or rollout_gpus % tp == 0,
            f"the {rollout_gpus} rollout GPUs are not divisible by rollout_tp={tp}.",
        ),
        _rule(
            "rollout.heads_divisible_by_tp",
            not vllm or heads_divisible(heads, kv, tp),
            f"rollout_tp={tp} does not divide the model's {heads} attention heads / {kv} kv heads (vLLM).",
        ),
        _rule(
            "ulysses.heads_divisible_by_sp",
            heads_divisible(heads, kv, sp),
            f"ulysses_sp={sp} does not divide the model's {heads} attention heads / {kv} kv heads (verl Ulysses).",
        ),
        _rule(
            "ulysses.world_divisible_by_sp",
            train_gpus % sp == 0,
            f"the {train_gpus} training GPUs are not divisible by ulysses_sp={sp}.",
        ),
    ]


def _length_rules(spec: ModelSpec, workload: Workload, knobs: Knobs, target: Target) -> list[Check]:
    """One sequence against the token budgets, vLLM's batched tokens and the model's positions."""
    sp, seq = knobs.ulysses_sp, workload.seq_len_tokens
    scale = sp if traits_for(target).budget_scaled_by_sp else 1  # verl multiplies budgets by SP; ours and TRL do not
    times_sp = f" × ulysses_sp={sp}" if scale > 1 else ""
    return [
        _rule(  # first: no knob mends it, so it is the binding rule a report names
            "context.max_position",
            seq <= spec.max_position_embeddings,
            f"prompt + response = {seq} tokens exceeds the model's {spec.max_position_embeddings} positions "
            f"(responses up to {spec.max_position_embeddings - workload.prompt_len_tokens} tokens fit them).",
        ),
        _rule(
            "token_budget.update",
            not knobs.dynamic_batching or (knobs.max_token_len_per_gpu or 0) * scale >= seq,
            f"max_token_len_per_gpu={knobs.max_token_len_per_gpu}{times_sp} is below one sequence ({seq} tokens).",
        ),
        _rule(
            "token_budget.log_prob",
            knobs.log_prob_micro_batch_size_per_gpu is not None or knobs.log_prob_max_token_len_per_gpu * scale >= seq,
            f"log_prob_max_token_len_per_gpu={knobs.log_prob_max_token_len_per_gpu}{times_sp} is below one sequence "
            f"({seq} tokens).",
        ),
        _rule(
            "rollout.batched_tokens_ge_seqs",
            knobs.rollout_backend != "vllm" or knobs.max_num_batched_tokens >= knobs.max_num_seqs,
            f"max_num_batched_tokens={knobs.max_num_batched_tokens} is below max_num_seqs={knobs.max_num_seqs} (vLLM).",
        ),
    ]


def _split_rule(cluster: Cluster, knobs: Knobs) -> Check:
    """Split placement leaves each node at least one rollout and one training GPU."""
    return _rule(
        "split.pools",
        knobs.placement == "colocated"
        or knobs.rollout_backend == "hf"
        or (cluster.gpus_per_node >= 2 and knobs.split_rollout_gpus_per_node < cluster.gpus_per_node),
        "split placement needs at least one rollout and one training GPU per node "
        f"({cluster.gpus_per_node} per node, split_rollout_gpus_per_node={knobs.split_rollout_gpus_per_node}).",
    )


def structural_checks(
    spec: ModelSpec, cluster: Cluster, workload: Workload, knobs: Knobs, *, target: Target = "grpo-pilot"
) -> tuple[Check, ...]:
    """The divisibility and size rules that need no memory estimate (cheap: used to prune trials)."""
    rollout_gpus, train_gpus = pools(cluster, knobs)
    dp = train_gpus // data_parallel_divisor(knobs) if knobs.ulysses_sp <= train_gpus else 0
    checks = [
        *_batch_rules(workload, knobs, train_gpus, dp),
        *_parallel_rules(spec, knobs, rollout_gpus, train_gpus),
        *_length_rules(spec, workload, knobs, target),
        _split_rule(cluster, knobs),
    ]
    return tuple(checks) + family_checks(spec, workload, knobs, train_gpus=train_gpus, dp=dp)


def memory_checks(
    memory: MemoryReport,
    workload: Workload,
    knobs: Knobs,
    *,
    usable_gpu_bytes: int,
    host_ram_bytes: int,
    kv_budget_bytes: int | None = None,
    device_bytes: int | None = None,
) -> tuple[Check, ...]:
    """Every phase within usable GPU memory, host RAM within the node, KV cache ≥ one request.

    `kv_budget_bytes` (signed, `estimate.rollout_kv_budget_bytes`) and `device_bytes`, when given, let a
    failed KV rule say how far the vLLM budget falls short and which utilisation would start the engine.
    """
    checks = []
    for phase in phases_present(memory.phases):
        pm = memory.phases[phase]
        excess = (pm.total_bytes - usable_gpu_bytes) / usable_gpu_bytes
        item = pm.largest_item()
        checks.append(
            _check(
                f"memory.{phase}",
                excess,
                f"{phase}.{item}" if item else f"memory.{phase}",
                ""
                if excess <= 0
                else f"{phase} needs {_gib(pm.total_bytes)} per GPU, over the usable {_gib(usable_gpu_bytes)} "
                f"(largest item: {item} {_gib(pm.items.get(item, 0))}).",
            )
        )
    host_item = memory.host.largest_item()
    host_excess = (memory.host.total_bytes - host_ram_bytes) / host_ram_bytes
    checks.append(
        _check(
            "host_ram",
            host_excess,
            f"host.{host_item}" if host_item else "host_ram",
            ""
            if host_excess <= 0
            else f"host RAM needs {_gib(memory.host.total_bytes)} per node, over the {_gib(host_ram_bytes)} available "
            f"(largest item: {host_item}).",
        )
    )
    seq = workload.seq_len_tokens
    needs_kv = knobs.rollout_backend != "hf"
    kv_excess = (seq - memory.kv_cache_tokens_per_gpu) / seq if needs_kv else -1.0
    checks.append(
        _check(
            "rollout.kv_cache",
            kv_excess,
            "rollout.kv_cache",
            ""
            if kv_excess <= 0
            else f"the rollout engine's KV cache holds {memory.kv_cache_tokens_per_gpu} tokens, less than one "
            f"{seq}-token request (raise gpu_memory_utilization or rollout_tp)"
            + _kv_shortfall(
                kv_budget_bytes, device_bytes, knobs.gpu_memory_utilization, of_free=knobs.vllm_memory == "free"
            )
            + ".",
        )
    )
    return tuple(checks)


def _kv_shortfall(
    kv_budget_bytes: int | None, device_bytes: int | None, utilization: float, *, of_free: bool = False
) -> str:
    """'; the budget is X GiB short ... ≥ U' when the signed KV budget is negative (vLLM would refuse to start).
    With vllm_memory=free the negative value is the memory the profile run lacks, which no utilization mends."""
    if kv_budget_bytes is None or device_bytes is None or kv_budget_bytes >= 0:
        return ""
    if of_free:
        return (
            f"; the engine's weights, profile peak and buffers exceed the memory the trainer leaves free by "
            f"{_gib(-kv_budget_bytes)}: no gpu_memory_utilization starts it (offload or shard the trainer's states)"
        )
    needed = utilization + -kv_budget_bytes / device_bytes
    return (
        f"; the vLLM budget of {utilization:g} x {_gib(device_bytes)} is {_gib(-kv_budget_bytes)} short of its "
        "weights, activations, buffers and graphs before any KV cache: gpu_memory_utilization must exceed "
        f"{needed:.2f} for it to start"
    )


def violations(checks: tuple[Check, ...]) -> tuple[Check, ...]:
    return tuple(c for c in checks if not c.ok)


def binding_constraint(checks: tuple[Check, ...], memory: MemoryReport | None) -> str | None:
    """The limiting 'phase.item' or rule: the worst violation if any, else the fullest phase's largest item."""
    broken = violations(checks)
    if broken:
        return max(broken, key=lambda c: c.excess).binding
    if memory is None:
        return None
    phase = memory.peak_phase
    item = memory.phases[phase].largest_item()
    return f"{phase}.{item}" if item else None


def constraint_values(checks: tuple[Check, ...]) -> dict[str, float]:
    """rule -> excess, for `trial.set_constraint` (≤ 0 feasible)."""
    return {c.rule: float(c.excess) for c in checks}
