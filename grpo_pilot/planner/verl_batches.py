"""verl's batch arithmetic, as the launch's verl version applies it (for `from_verl.py`).

- Mini-batch: `ppo_mini_batch_size` (prompts) above `data.train_batch_size` is one mini-batch of the whole
  batch in verl's update (`batch.split(ppo_mini_batch_size)` yields one chunk: Unakar/Logic-RL@fb31708
  verl/workers/actor/dp_actor.py line 218); verl refuses it at start-up since 4d27461d0 (#559, 2025-03-14)
  unless dynamic batching is on (verl/workers/config/actor.py@b178a3cd5 `ActorConfig.validate` lines
  200-207). Clamped to the batch with a note, or refused where the launch's verl refuses it.
- Micro-batches: `*_per_gpu` keys are per GPU. The older global keys (`actor.ppo_micro_batch_size`,
  `rollout/ref.log_prob_micro_batch_size`) are divided by the data-parallel size world/SP
  (verl/workers/fsdp_workers.py since f2a76acd9, #136) and, before that commit, also multiplied by
  rollout.n (fsdp_workers.py@f2a76acd9^ lines 121-133; Unakar/Logic-RL@fb31708 lines 97-109). A micro-batch
  above what one GPU holds is one chunk of it (`split` again: dp_actor.py@fb31708 lines 186 and 229).
- Agent repeats: the Search-R1 fork's `rollout.n_agent` (PeterGriffinJin/Search-R1@ba78b68
  verl/trainer/ppo/ray_trainer.py line 702: `batch.repeat(repeat_times=rollout.n_agent)` before its multi-turn
  generation) is the group size of its GRPO; its workers scale the mini- and micro-batches by `rollout.n` only
  (verl/workers/fsdp_workers.py lines 97-109 there), so the batch holds prompts x n_agent x n sequences while a
  mini-batch stays `ppo_mini_batch_size` x n sequences (more optimizer steps per step, same micro-batches).
- Log-prob passes: the old-policy pass (rollout.*) and the reference pass (ref.*) share one knob: the larger
  micro-batch / budget of the two (it sets the memory peak); their dynamic flags and budgets inherit the
  actor's (reference/verl-config.md).
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.errors import InputError
from grpo_pilot.planner.verl_versions import VerlWindow, change_named

ARR = "actor_rollout_ref."
_TIMES_N = change_named("micro_batch_times_n")
_MINI_CHECK = change_named("mini_batch_check")


class BatchSettings(NamedTuple):
    """The batch keys as the launch writes them (None: not given). Pairs are (rollout, ref)."""

    world: int
    sp: int
    prompts_per_step: int
    mini_batch_prompts: int
    n: int
    dynamic: bool
    budget: int
    micro_per_gpu: int | None
    micro_global: int | None
    lp_dynamic: tuple[bool | None, bool | None]
    lp_budget: tuple[int | None, int | None]
    lp_micro_per_gpu: tuple[int | None, int | None]
    lp_micro_global: tuple[int | None, int | None]
    agents: int = 1  # Search-R1's rollout.n_agent (module docstring); 1 everywhere else


class Batches(NamedTuple):
    """The planner's batch fields and knobs."""

    prompts_per_step: int
    mini_batch_prompts: int
    n: int
    sp: int
    dynamic: bool
    budget: int
    micro: int | None
    lp_budget: int
    lp_micro: int | None


def _mini(s: BatchSettings, win: VerlWindow, notes: list[str]) -> int:
    if s.mini_batch_prompts <= s.prompts_per_step:
        return s.mini_batch_prompts
    if win.side(_MINI_CHECK) == "after" and not s.dynamic:
        raise InputError(
            f"ppo_mini_batch_size={s.mini_batch_prompts} exceeds data.train_batch_size={s.prompts_per_step}: "
            f"the launch's verl refuses to start (since {_MINI_CHECK.source}: train_batch_size must be >= "
            "ppo_mini_batch_size without dynamic batching).",
            "Lower ppo_mini_batch_size to at most the batch.",
        )
    notes.append(
        f"ppo_mini_batch_size={s.mini_batch_prompts} exceeds train_batch_size={s.prompts_per_step}: verl splits "
        f"the batch into one mini-batch of {s.prompts_per_step} prompts (one optimizer step per step); planned so"
    )
    return s.prompts_per_step


def _per_gpu(
    s: BatchSettings, key: str, *, per_gpu: int | None, global_: int | None, times_n: str | None, notes: list[str]
):
    """A micro-batch per GPU from the per-GPU key, else from the deprecated global key (module docstring)."""
    if per_gpu is not None:
        return per_gpu
    if global_ is None:
        return None
    dp = max(1, s.world // s.sp)
    divided = global_ // dp
    if divided < 1:
        raise InputError(
            f"{key}={global_} (global) over {dp} data-parallel GPUs is 0 per GPU: verl fails on it.",
            f"Raise {key}, or give {key}_per_gpu.",
        )
    if times_n == "before":
        notes.append(
            f"{key}={global_} (global): {global_} // {dp} x n={s.n} = {divided * s.n} per GPU (verl before "
            f"{_TIMES_N.source})"
        )
        return divided * s.n
    notes.append(f"{key}={global_} (global, deprecated): {global_} // {dp} = {divided} per GPU")
    if times_n is None and s.n > 1:
        notes.append(
            f"if the launch's verl predates {_TIMES_N.at[:10]} ({_TIMES_N.source}), {key} is {divided * s.n} per GPU "
            f"(also multiplied by n): pass --override {key}_per_gpu={divided * s.n}"
        )
    return divided


def _agent_group(s: BatchSettings, notes: list[str]) -> int:
    """The group size under Search-R1's n_agent (module docstring). The mini-batch stays as written (prompts):
    the fork's `ppo_mini_batch_size` x n sequences is not a whole number of n_agent groups in general, and its
    count only sets how many optimizer steps a step takes (memory follows the micro-batches)."""
    if s.agents == 1:
        return s.n
    group = s.n * s.agents
    notes.append(
        f"rollout.n_agent={s.agents} (Search-R1): each prompt is repeated {s.agents} times before generation, so "
        f"{s.prompts_per_step} prompts x {group} responses per step; the fork's mini-batch is "
        f"{s.mini_batch_prompts * s.n} sequences (ppo_mini_batch_size x rollout.n), planned as "
        f"{s.mini_batch_prompts} prompts x {group} (fewer optimizer steps, the same micro-batches)"
    )
    return group


def micro_batches(s: BatchSettings, win: VerlWindow, notes: list[str]) -> Batches:
    """The launch's batches in the planner's terms, as its verl computes them (module docstring)."""
    dp = max(1, s.world // s.sp)
    times_n = win.side(_TIMES_N)
    mini = _mini(s, win, notes)
    per_gpu_mini = max(1, mini * s.n // dp)
    per_gpu_batch = max(1, s.prompts_per_step * s.n * s.agents // dp)
    micro = _per_gpu(
        s,
        ARR + "actor.ppo_micro_batch_size",
        per_gpu=s.micro_per_gpu,
        global_=s.micro_global,
        times_n=times_n,
        notes=notes,
    )
    if not s.dynamic and micro is None:
        raise InputError(
            "Neither actor.ppo_micro_batch_size_per_gpu nor use_dynamic_bsz is set (verl refuses to start).",
            "Set one of them.",
        )
    if micro is not None and s.micro_per_gpu is None and times_n == "before":
        configured_mini = s.mini_batch_prompts // dp * s.n  # dp_actor.py@fb31708 line 207 asserts on these
        if configured_mini % micro:
            raise InputError(
                f"ppo_mini_batch_size per GPU ({configured_mini}) is not divisible by the micro-batch ({micro}): "
                "this verl asserts it at start-up (dp_actor.py@fb31708 line 207).",
                "Fix the batch settings.",
            )
        if micro > per_gpu_mini:
            notes.append(
                f"the micro-batch ({micro}) exceeds a GPU's mini-batch ({per_gpu_mini} sequences): one "
                f"micro-batch of {per_gpu_mini}"
            )
            micro = per_gpu_mini
    lp_dynamic = [s.dynamic if d is None else d for d in s.lp_dynamic]
    lp_budgets = [b or s.budget for b in s.lp_budget]
    group = _agent_group(s, notes)
    if any(lp_dynamic):
        return Batches(
            s.prompts_per_step,
            mini,
            group,
            s.sp,
            s.dynamic,
            s.budget,
            micro,
            max(b for b, d in zip(lp_budgets, lp_dynamic) if d),
            None,
        )
    given = [
        m
        for m in (
            _per_gpu(s, ARR + f"{role}.log_prob_micro_batch_size", per_gpu=pg, global_=gl, times_n=times_n, notes=notes)
            for pg, gl, role in zip(s.lp_micro_per_gpu, s.lp_micro_global, ("rollout", "ref"))
        )
        if m is not None
    ]
    if not given:
        raise InputError(
            "log_prob_micro_batch_size_per_gpu is not set for rollout/ref and dynamic batching is off "
            "(verl refuses to start).",
            "Set actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu (and ref's).",
        )
    lp_micro = max(given)
    if len(set(given)) > 1:
        notes.append(f"rollout and ref log-prob micro-batches differ ({given}); the larger is planned")
    if lp_micro > per_gpu_batch:
        notes.append(
            f"the log-prob micro-batch ({lp_micro}) exceeds what a GPU scores per step ({per_gpu_batch} "
            f"sequences): one micro-batch of {per_gpu_batch}"
        )
        lp_micro = per_gpu_batch
    return Batches(s.prompts_per_step, mini, group, s.sp, s.dynamic, s.budget, micro, s.budget, lp_micro)
