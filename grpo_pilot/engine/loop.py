"""The GRPO step loop: `run(plan, config)` executes a plan and profiles every phase.

One step (`grpo_step`, read it top to bottom):
  1. weight sync   — the rollout engine gets the policy's current weights (no-op for `hf`);
  2. rollout       — prompts × n completions (group-contiguous rows);
  3. reward        — the reward model scores them (+ DAPO soft overlong penalty);
     DAPO dynamic sampling: groups whose rewards are all equal are dropped and new prompts are
     drawn, at most `max_refill_rounds` extra rounds; the kept groups are cut to prompts_per_step;
  4. advantages    — group-normalised (GRPO) or as configured;
  5. log-probs     — old policy (only when the batch is split into > 1 mini-batch or epoch; else
     on-policy: the update detaches its own log-probs) and the reference (only with a KL loss);
  6. update        — mini-batches × epochs, each one AdamW step over token-budget micro-batches;
  7. metrics       — metrics.jsonl, the live display, and a checkpoint every N steps.

Sampling seeds: step s, refill round r draws with seed hash(seed, s, r), so a resumed run samples
exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_pilot.atomic import atomic_write_text
from grpo_pilot.engine.actor import Sample
from grpo_pilot.engine.assemble import Engine, build_engine
from grpo_pilot.engine.algos.advantages import compute_advantages
from grpo_pilot.engine.algos.dapo import overlong_penalty, zero_variance_groups
from grpo_pilot.engine.checkpoint import latest_checkpoint, list_checkpoints, restore_rng, save_checkpoint
from grpo_pilot.engine.metrics import LiveDisplay, MetricsLog
from grpo_pilot.engine.profiling import PhaseSample, RunProfile, build_profile, write_profile_json
from grpo_pilot.engine.run_config import RunConfig
from grpo_pilot.errors import InputError, RunError
from grpo_pilot.planner.config import old_logprob_pass_needed
from grpo_pilot.planner.plan import Plan


def sampling_seed(seed: int, step: int, round_: int) -> int:
    """Distinct, reproducible sampling seed per (run seed, step, refill round)."""
    return (seed * 1_000_003 + step * 1_009 + round_) % (2**31 - 1)


@dataclass
class StepBatch:
    """The kept groups of one step (rows group-contiguous) and what the rollout produced."""

    samples: list[Sample] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    prompt_indices: list[int] = field(default_factory=list)  # every prompt drawn, in order (dropped ones too)
    all_rewards: list[float] = field(default_factory=list)  # every generated sample's reward
    all_lengths: list[int] = field(default_factory=list)
    all_truncated: list[bool] = field(default_factory=list)
    reward_parts: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = 0
    dropped_groups: int = 0


def collect_batch(eng: Engine, step: int) -> StepBatch:
    """Rollout + reward rounds until prompts_per_step informative groups (or the refill cap)."""
    cfg, n, prof = eng.config, eng.n, eng.profiler
    batch = StepBatch()
    kept_groups = 0
    for round_ in range(1 + (cfg.max_refill_rounds if cfg.dynamic_sampling else 0)):
        drawn = eng.sampler.next_batch()
        rows = [i for i in drawn for _ in range(n)]
        sampling = eng.sampling.model_copy(update={"seed": sampling_seed(cfg.seed, step, round_)})
        with prof.phase("rollout"):
            gens = eng.rollout.generate([eng.prompt_ids[i] for i in rows], sampling)
        with prof.phase("reward"):
            result = eng.reward.score(
                [g.text for g in gens], [eng.prompts.records[i] for i in rows], num_tokens=[g.num_tokens for g in gens]
            )
            rewards = torch.tensor(result.total, dtype=torch.float32)
            lengths = torch.tensor([g.num_tokens for g in gens])
            if cfg.overlong_buffer_tokens > 0:  # DAPO soft overlong punishment (eq. 13)
                rewards = rewards + overlong_penalty(
                    lengths,
                    max_len=sampling.max_new_tokens,
                    cache_len=cfg.overlong_buffer_tokens,
                    penalty_factor=cfg.overlong_penalty_factor,
                )
        batch.rounds = round_ + 1
        batch.prompt_indices += drawn
        batch.all_rewards += rewards.tolist()
        batch.all_lengths += lengths.tolist()
        batch.all_truncated += [g.finish_reason == "length" for g in gens]
        for name, values in result.parts.items():
            batch.reward_parts.setdefault(name, []).extend(values)
        dropped = zero_variance_groups(rewards, n).tolist() if cfg.dynamic_sampling else [False] * len(drawn)
        for g, drop in enumerate(dropped):
            if drop or kept_groups == eng.prompts_per_step:
                batch.dropped_groups += int(drop)
                continue
            kept_groups += 1
            for row in range(g * n, (g + 1) * n):
                gen = gens[row]
                batch.samples.append(
                    Sample(tuple(eng.prompt_ids[rows[row]]), gen.token_ids, gen.finish_reason == "length")
                )
                batch.rewards.append(float(rewards[row]))
        if kept_groups == eng.prompts_per_step:
            break
    with prof.phase("rollout"):
        eng.rollout.sleep()
    return batch


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def grpo_step(eng: Engine, step: int) -> tuple[dict[str, Any], dict[str, PhaseSample], float, int]:
    """One GRPO step; returns (metrics record, phase samples, step wall s, trained tokens)."""
    prof, actor, cfg, n = eng.profiler, eng.actor, eng.config, eng.n
    prof.begin_step()
    t0 = time.perf_counter()

    # 1. weight sync: the rollout engine must generate with the weights the last update produced
    with prof.phase("weight_sync"):
        eng.rollout.wake()
        eng.rollout.sync_weights(actor.policy)

    # 2 + 3. rollout and rewards (DAPO dynamic sampling refills dropped groups)
    batch = collect_batch(eng, step)
    samples = batch.samples
    num_groups = len(samples) // n

    # 4. advantages, one per completion, from its group's rewards
    advantages = (
        compute_advantages(torch.tensor(batch.rewards, dtype=torch.float32), n, scale=cfg.adv_scale, eps=cfg.adv_eps)
        if samples
        else torch.zeros(0)
    )

    # 5. old-policy and reference log-probs
    groups_per_mb = eng.mini_batch_prompts
    mini_batches = [
        list(range(g * n, min(g + groups_per_mb, num_groups) * n)) for g in range(0, num_groups, groups_per_mb)
    ]
    off_policy = len(mini_batches) * eng.ppo_epochs > 1
    with prof.phase("log_prob"):
        old = actor.log_probs(samples) if off_policy and samples else None
        ref = actor.log_probs(samples, ref=True) if eng.loss.kl_coef > 0 and samples else None

    # 6. update: epochs × mini-batches, one optimizer step each
    updates: list[dict[str, float]] = []
    with prof.phase("update"):
        for _ in range(eng.ppo_epochs):
            for mb in mini_batches:
                updates.append(
                    actor.update(
                        [samples[i] for i in mb],
                        advantages[mb],
                        eng.loss,
                        old_logprobs=[old[i] for i in mb] if old is not None else None,
                        ref_logprobs=[ref[i] for i in mb] if ref is not None else None,
                    )
                )

    # 7. metrics
    wall = time.perf_counter() - t0
    phases = prof.end_step()
    trained_tokens = sum(s.num_tokens for s in samples) * eng.ppo_epochs
    keys = sorted({k for u in updates for k in u})
    record: dict[str, Any] = {
        "step": step,
        "prompt_indices": batch.prompt_indices,
        "num_groups": num_groups,
        "dropped_groups": batch.dropped_groups,
        "rollout_rounds": batch.rounds,
        "reward_mean": _mean(batch.all_rewards),
        "reward_std": float(np.std(batch.all_rewards)) if batch.all_rewards else None,
        "reward_parts": {k: _mean(v) for k, v in batch.reward_parts.items()},
        "response_len_mean": _mean([float(x) for x in batch.all_lengths]),
        "response_len_max": max(batch.all_lengths, default=0),
        "truncated_frac": _mean([float(x) for x in batch.all_truncated]),
        **{k: _mean([u[k] for u in updates if k in u]) for k in keys},
        "num_updates": len(updates),
        "lr": actor.optimizer.param_groups[0]["lr"],
        "trained_tokens": trained_tokens,
        "tokens_per_s": trained_tokens / wall if wall > 0 else None,
        "step_s": wall,
        "phase_s": {k: v.wall_s for k, v in phases.items()},
        "phase_peak_bytes": {k: v.peak_bytes for k, v in phases.items()},
        "phase_rss_peak_bytes": {k: v.rss_peak_bytes for k, v in phases.items()},
    }
    return record, phases, wall, trained_tokens


@dataclass(frozen=True)
class RunResult:
    output_dir: Path
    start_step: int
    last_step: int
    profile: RunProfile
    last_record: dict[str, Any] | None


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run(
    plan: Plan, config: RunConfig, *, plan_path: str | Path | None = None, quiet: bool = False, console: Any = None
) -> RunResult:
    """Execute `plan` with `config`; writes metrics.jsonl, checkpoints and profile.json under output_dir."""
    out = Path(config.output_dir)
    log = MetricsLog(out / "metrics.jsonl")
    config_hash = config.hash(plan.model_dump_json())
    if not config.resume and (log.size() > 0 or list_checkpoints(out)):
        raise InputError(
            f"'{out}' already holds a run (metrics.jsonl or checkpoints).",
            "Add --resume to continue it, or choose another --out.",
        )
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    ckpt = latest_checkpoint(out, config_hash=config_hash) if config.resume else None
    _seed_everything(config.seed)
    eng = build_engine(plan, config, plan_path=plan_path)
    start_step = 0
    if ckpt is not None:
        eng.actor.load_state_dict(ckpt.model, ckpt.optimizer)
        eng.sampler.load_state_dict(ckpt.state["sampler"])
        restore_rng(ckpt.rng)
        log.truncate(int(ckpt.state["metrics_bytes"]))
        start_step = ckpt.step
    elif config.resume:
        log.truncate(0)  # nothing was checkpointed: every logged step will be redone
    atomic_write_text(out / "run_config.json", config.model_dump_json(indent=2) + "\n")

    done: list[tuple[int, dict[str, PhaseSample], float, float]] = []
    lengths: list[float] = []
    record: dict[str, Any] | None = None
    eng.profiler.start()
    step = start_step
    try:
        with LiveDisplay(config.steps, start_step=start_step, console=console, quiet=quiet) as live:
            for step in range(start_step + 1, config.steps + 1):
                record, phases, wall, tokens = grpo_step(eng, step)
                size = log.append(record)
                live.update(record)
                done.append((step, phases, wall, float(tokens)))
                if record["response_len_mean"] is not None:
                    lengths.append(record["response_len_mean"])
                if step == config.steps or (config.checkpoint_every and step % config.checkpoint_every == 0):
                    state = eng.actor.state_dict()
                    save_checkpoint(
                        out,
                        step=step,
                        model_state=state["model"],
                        optimizer_state=state["optimizer"],
                        keep=config.keep_checkpoints,
                        state={"sampler": eng.sampler.state_dict(), "config_hash": config_hash, "metrics_bytes": size},
                    )
    except torch.OutOfMemoryError as exc:
        raise RunError(
            f"Out of device memory in the {eng.profiler.active or 'step'} phase of step {step} ({str(exc).splitlines()[0]}).",
            "The plan underestimated this phase: re-plan with less headroom for it (smaller token budgets, offload, "
            "gradient checkpointing) and compare profile.json of a shorter run.",
        ) from None
    finally:
        eng.profiler.close()
        eng.rollout.close()
    notes = tuple(f"knob {k} is not applied by the single-process engine" for k in eng.actor.unapplied_knobs)
    if eng.rollout.name != plan.knobs.rollout_backend:
        notes += (
            f"rollout backend '{eng.rollout.name}' is not the plan's '{plan.knobs.rollout_backend}': predictions assume the plan's",
        )
    engine_old_pass = -(-eng.prompts_per_step // eng.mini_batch_prompts) * eng.ppo_epochs > 1
    if old_logprob_pass_needed(plan.workload, plan.target) != engine_old_pass:
        notes += (
            f"log_prob: this run {'runs' if engine_old_pass else 'skips'} the old-policy pass; the plan (target {plan.target}, "
            f"its workload) {'skips' if engine_old_pass else 'counts'} it",
        )
    if eng.actor.shared_forwards:
        notes += (
            f"update/log_prob: {eng.actor.shared_forwards} micro-batches computed each distinct prompt once (shared-prompt forward); "
            "the plan's time and activation figures assume every sequence computes its prompt, so they bound these phases from above",
        )
    if done and len(done) == 1:
        notes += ("only one step ran in this process: its numbers include warm-up",)
    profile = build_profile(
        plan,
        done,
        device=str(eng.actor.device),
        memory_source=eng.profiler.memory_source,
        rss_source=eng.profiler.rss_source,
        mean_response_tokens=_mean(lengths),
        notes=notes,
    )
    if done:  # a resume with nothing left to do keeps the previous profile.json
        write_profile_json(out / "profile.json", profile)
    return RunResult(
        output_dir=out,
        start_step=start_step,
        last_step=done[-1][0] if done else start_step,
        profile=profile,
        last_record=record,
    )
