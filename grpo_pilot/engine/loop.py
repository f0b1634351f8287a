"""The GRPO step loop: `run(plan, config)` executes a plan on its workers and profiles every phase.

One step (`grpo_step`, read it top to bottom; `eng.group` fans the model work out to the workers):
  1. weight sync   — every rollout engine gets the policy's current weights (no-op for `hf` on one worker);
  2. rollout       — prompts × n completions (group-contiguous rows), split over the rollout replicas;
  3. reward        — the reward model scores them (+ DAPO soft overlong penalty), on the driver;
     DAPO dynamic sampling: groups whose rewards are all equal are dropped and new prompts are
     drawn, at most `max_refill_rounds` extra rounds; the kept groups are cut to prompts_per_step;
  4. advantages    — group-normalised (GRPO) or as configured;
  5. log-probs     — old policy (only when the batch is split into > 1 mini-batch or epoch; else
     on-policy: the update detaches its own log-probs) and the reference (only with a KL loss);
  6. update        — mini-batches × epochs, each one AdamW step over token-budget micro-batches,
     each mini-batch split over the training ranks;
  7. metrics       — metrics.jsonl, lengths.jsonl, the progress events, and a checkpoint every N steps.

`run` itself: the run directory (engine/run_dir.py), start or resume, the loop, failure.json on a
failure (engine/failures.py), then profile.json with the plan-mismatch notes (engine/notes.py).

Sampling seeds: step s, refill round r draws with seed hash(seed, s, r), so a resumed run samples
exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from grpo_pilot.engine.actor import Sample
from grpo_pilot.engine.algos.advantages import compute_advantages
from grpo_pilot.engine.algos.dapo import overlong_penalty, zero_variance_groups
from grpo_pilot.engine.assemble import Engine, build_engine
from grpo_pilot.engine.checkpoint import (
    DAMAGED_HINT,
    Checkpoint,
    begin_checkpoint,
    finish_checkpoint,
    latest_checkpoint,
    restore_rng,
)
from grpo_pilot.engine.device_memory import allocator_report
from grpo_pilot.engine.events import NoEvents, RunEvents
from grpo_pilot.engine.failures import CrashError, Interrupted, failure_record
from grpo_pilot.engine.finite import FLOAT32_HINT, NonFiniteError
from grpo_pilot.engine.notes import adapter_notes, run_notes
from grpo_pilot.engine.profiling import (
    AdapterReport,
    PhaseSample,
    RunProfile,
    aggregate_phases,
    build_profile,
    rank_profile,
    write_profile_json,
)
from grpo_pilot.engine.run_config import RunConfig, capped_threads, previous_config_hash
from grpo_pilot.engine.run_dir import RunDirectory, check_run_target
from grpo_pilot.errors import GrpoPilotError, InputError
from grpo_pilot.outputs import DirectoryLock, discard_created_dir, prepare_output_dir
from grpo_pilot.planner.adapters import adapters_modelled
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
    all_prompt_lengths: list[int] = field(default_factory=list)
    all_truncated: list[bool] = field(default_factory=list)
    reward_parts: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = 0
    dropped_groups: int = 0


@dataclass(frozen=True)
class StepResult:
    """What one GRPO step produced: its metrics.jsonl record, lengths.jsonl records and profile samples."""

    record: dict[str, Any]
    lengths: list[dict[str, int]]
    phases: dict[str, PhaseSample]  # aggregated over workers
    worker_phases: list[dict[str, PhaseSample]]  # by worker index
    wall_s: float
    trained_tokens: int


def collect_batch(eng: Engine, step: int) -> StepBatch:
    """Rollout + reward rounds until prompts_per_step informative groups (or the refill cap)."""
    cfg, n, group = eng.config, eng.n, eng.group
    batch = StepBatch()
    kept_groups = 0
    for round_ in range(1 + (cfg.max_refill_rounds if cfg.dynamic_sampling else 0)):
        drawn = eng.sampler.next_batch()
        rows = [i for i in drawn for _ in range(n)]
        sampling = eng.sampling.model_copy(update={"seed": sampling_seed(cfg.seed, step, round_)})
        with group.phase("rollout"):
            gens = group.generate([eng.prompt_ids[i] for i in rows], sampling)
        with group.phase("reward", driver_work=True):
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
        batch.all_prompt_lengths += [len(eng.prompt_ids[i]) for i in rows]
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
    with group.phase("rollout"):
        group.sleep_rollout()
    return batch


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _advantages(rewards: list[float], n: int, cfg: RunConfig, step: int) -> torch.Tensor:
    """Group advantages in float32 — what the loss multiplies — checked finite there (engine/finite.py)."""
    if not rewards:
        return torch.zeros(0)
    advantages = compute_advantages(torch.tensor(rewards, dtype=torch.float32), n, scale=cfg.adv_scale, eps=cfg.adv_eps)
    if not bool(torch.isfinite(advantages).all()):
        raise NonFiniteError(
            f"The advantages of step {step} are not finite in float32 (rewards from {min(rewards):g} to "
            f"{max(rewards):g}).",
            FLOAT32_HINT,
            phase="reward",
            step=step,
        )
    return advantages


def grpo_step(eng: Engine, step: int) -> StepResult:
    """One GRPO step (module docstring)."""
    group, cfg, n = eng.group, eng.config, eng.n
    group.begin_step(step)
    t0 = time.perf_counter()

    # 1. weight sync: the rollout engines must generate with the weights the last update produced
    with group.phase("weight_sync"):
        group.sync_weights()

    # 2 + 3. rollout and rewards (DAPO dynamic sampling refills dropped groups)
    batch = collect_batch(eng, step)
    samples = batch.samples
    num_groups = len(samples) // n

    # 4. advantages, one per completion, from its group's rewards
    advantages = _advantages(batch.rewards, n, cfg, step)

    # 5. old-policy and reference log-probs
    groups_per_mb = eng.mini_batch_prompts
    mini_batches = [
        list(range(g * n, min(g + groups_per_mb, num_groups) * n)) for g in range(0, num_groups, groups_per_mb)
    ]
    off_policy = len(mini_batches) * eng.ppo_epochs > 1
    with group.phase("log_prob"):
        old = group.log_probs(samples) if off_policy and samples else None
        ref = group.log_probs(samples, ref=True) if eng.loss.kl_coef > 0 and samples else None

    # 6. update: epochs × mini-batches, one optimizer step each
    updates: list[dict[str, float]] = []
    with group.phase("update"):
        for _ in range(eng.ppo_epochs):
            for mb in mini_batches:
                updates.append(
                    group.update(
                        [samples[i] for i in mb],
                        advantages[mb],
                        eng.loss,
                        old=[old[i] for i in mb] if old is not None else None,
                        ref=[ref[i] for i in mb] if ref is not None else None,
                    )
                )

    # 7. metrics
    wall = time.perf_counter() - t0
    worker_phases, driver_walls = group.end_step()
    phases = aggregate_phases(worker_phases, driver_walls)
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
        "lr": cfg.lr,
        "trained_tokens": trained_tokens,
        "tokens_per_s": trained_tokens / wall if wall > 0 else None,
        "step_s": wall,
        "phase_s": {k: v.wall_s for k, v in phases.items()},
        "phase_peak_bytes": {k: v.peak_bytes for k, v in phases.items()},
        "phase_rss_peak_bytes": {k: v.rss_peak_bytes for k, v in phases.items()},
        "phase_reserved_peak_bytes": {k: v.reserved_peak_bytes for k, v in phases.items()},
        "phase_device_peak_bytes": {k: v.device_peak_bytes for k, v in phases.items()},
    }
    lengths = [
        {"step": step, "prompt_tokens": p, "response_tokens": r}
        for p, r in zip(batch.all_prompt_lengths, batch.all_lengths)
    ]
    return StepResult(record, lengths, phases, worker_phases, wall, trained_tokens)


@dataclass(frozen=True)
class RunResult:
    output_dir: Path
    start_step: int
    last_step: int
    profile: RunProfile
    last_record: dict[str, Any] | None


def checkpoint_due(config: RunConfig, step: int) -> bool:
    """Whether `step` ends with a checkpoint: every `checkpoint_every` steps and at the last one, unless
    `checkpoint = false` (never)."""
    if not config.checkpoint:
        return False
    return step == config.steps or bool(config.checkpoint_every and step % config.checkpoint_every == 0)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _checkpoint(eng: Engine, rd: RunDirectory, step: int, state: dict[str, Any]) -> None:
    """Workers write their parts into a temporary directory; the driver completes and renames it."""
    tmp = begin_checkpoint(rd.path, step)
    eng.group.save_state(str(tmp))
    finish_checkpoint(rd.path, tmp, step=step, state=state, keep=eng.config.keep_checkpoints)


def run(
    plan: Plan,
    config: RunConfig,
    *,
    plan_path: str | Path | None = None,
    events: RunEvents | None = None,
    address: str | None = None,
) -> RunResult:
    """Execute `plan` with `config`; writes metrics.jsonl, lengths.jsonl, checkpoints and profile.json under
    output_dir, and failure.json when the run fails. `events` hears the progress (engine/events.py; default:
    nothing is shown). `address`: a Ray cluster to join ("auto", "HOST:PORT"); None starts a local one when
    the plan has several workers."""
    check_run_target(config.output_dir)
    created = prepare_output_dir(config.output_dir, flag="--out", what="run directory")
    lock = DirectoryLock(config.output_dir, "grpo-run").acquire()  # a second run on this --out is refused
    previous = _catch_termination()
    try:
        return _run_locked(plan, config, plan_path=plan_path, events=events or NoEvents(), address=address)
    except InputError:
        if created:
            discard_created_dir(config.output_dir)  # refused before anything was written: leave no trace
        raise
    finally:
        lock.release()
        _restore_termination(previous)


def _resume_point(rd: RunDirectory, config: RunConfig, plan_json: str, config_hash: str) -> Checkpoint | None:
    """The checkpoint a --resume continues from; without one, starting over must not erase another run's logs."""
    if not config.resume:
        return None
    ckpt = latest_checkpoint(rd.path, config_hash=config_hash)
    if ckpt is None:
        rd.check_start_over(previous_config_hash(rd.path, plan_json) == config_hash)
    return ckpt


def _record_and_reraise(rd: RunDirectory, exc: BaseException, *, phase: str | None, step: int | None) -> NoReturn:
    """failure.json for a run failure or an interruption, then the exception again (an interruption says
    where it stopped: the one line grpo-run prints)."""
    failure = failure_record(exc, phase=phase, step=step)
    rd.write_failure(failure)
    if isinstance(exc, KeyboardInterrupt):
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        raise Interrupted(signum, f"{failure.message}; failure.json records it") from None
    raise exc


def _terminated(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def _catch_termination() -> Any:
    """SIGTERM stops the run as Ctrl-C does (`Interrupted`): failure.json, workers closed, lock released."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _terminated)


def _restore_termination(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _restore(eng: Engine, ckpt: Checkpoint) -> None:
    """Load a --resume checkpoint into the workers (model and optimizer), the sampler and the RNGs; a damaged
    one is an InputError."""
    try:
        eng.group.load_state(str(ckpt.path))
    except GrpoPilotError:
        raise
    except Exception as exc:  # a shard missing or damaged: the checkpoint's problem, not a bug
        raise InputError(
            f"Checkpoint '{ckpt.path}' cannot be read: its model/optimizer state does not load "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}).",
            DAMAGED_HINT,
        ) from None
    eng.sampler.load_state_dict(ckpt.state["sampler"])
    try:
        restore_rng(ckpt.rng)
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:
        raise InputError(
            f"Checkpoint '{ckpt.path}' cannot be read: its rng.pt holds unusable generator states ({exc}).",
            DAMAGED_HINT,
        ) from None


def _run_locked(
    plan: Plan, config: RunConfig, *, plan_path: str | Path | None, events: RunEvents, address: str | None
) -> RunResult:
    """`run` once its output directory is locked."""
    rd = RunDirectory(config.output_dir)
    plan_json = plan.model_dump_json()
    config_hash = config.hash(plan_json)
    rd.check_start(resume=config.resume)
    if config.threads is not None:
        torch.set_num_threads(capped_threads(config.threads))
    ckpt = _resume_point(rd, config, plan_json, config_hash)
    _seed_everything(config.seed)
    rd.clear_failure()
    step: int | None = None
    phase: str | None = "start"
    try:
        eng = build_engine(plan, config, plan_path=plan_path, address=address)
    except InputError:
        raise
    except (GrpoPilotError, KeyboardInterrupt) as exc:
        _record_and_reraise(rd, exc, phase=phase, step=None)
    done: list[StepResult] = []
    start_step = 0
    try:
        rd.write_workers(eng.group.infos)
        if ckpt is not None:
            _restore(eng, ckpt)
            start_step = ckpt.step
        if config.resume:
            for note in rd.rewind(ckpt.state if ckpt is not None else None, start_step):
                events.note(note)
        rd.write_json("run_config.json", config.model_dump_json(indent=2) + "\n")
        phase = None
        events.begin(start_step, config.steps)
        for step in range(start_step + 1, config.steps + 1):
            result = grpo_step(eng, step)
            rd.lengths.append_many(result.lengths)
            size = rd.metrics.append(result.record)
            events.step_finished(result.record)
            done.append(result)
            if checkpoint_due(config, step):
                state = {
                    "sampler": eng.sampler.state_dict(),
                    "config_hash": config_hash,
                    "metrics_bytes": size,
                    "lengths_bytes": rd.lengths.size(),
                }
                _checkpoint(eng, rd, step, state)
        shared = eng.group.shared_forwards()
    except InputError:
        raise
    except (GrpoPilotError, KeyboardInterrupt) as exc:  # Ctrl-C and SIGTERM (Interrupted) too
        _record_and_reraise(rd, exc, phase=eng.group.current_phase or phase, step=step)
    except Exception as exc:  # a bug on the driver's side: recorded like any failure, reported in one paragraph
        failure = failure_record(exc, phase=eng.group.current_phase or phase, step=step)
        rd.write_failure(failure)
        raise CrashError(
            f"The run crashed in step {step}: {failure.message}",
            "This is a bug; failure.json records it.",
            phase=failure.phase,
            step=step,
        ) from exc
    finally:
        eng.reward.close()  # user reward workers and every process they started
        eng.group.close()
    return _finish(plan, eng, rd, done=done, start_step=start_step, shared=shared)


def _finish(
    plan: Plan, eng: Engine, rd: RunDirectory, *, done: list[StepResult], start_step: int, shared: int
) -> RunResult:
    """profile.json (per worker and aggregated, with the plan-mismatch notes) and the run's result."""
    engine_old_pass = -(-eng.prompts_per_step // eng.mini_batch_prompts) * eng.ppo_epochs > 1
    rollout = eng.group.setup.rollout
    replica_bytes = max(i.rollout_replica_bytes for i in eng.group.infos)
    notes = run_notes(
        plan,
        rollout_backend=rollout.backend,
        engine_old_pass=engine_old_pass,
        shared_forwards=shared,
        steps_run=len(done),
        rollout_replica_bytes=replica_bytes,
        rollout_weight_copy_bytes=max(i.rollout_weight_copy_bytes for i in eng.group.infos),
        fused_adamw_on_gpu=any(i.device.startswith("cuda") for i in eng.group.infos if i.train_rank is not None)
        and not eng.group.setup.actor.offload,
    )
    infos = eng.group.infos
    adapter_params, adapter_bytes = max(i.adapter_params for i in infos), max(i.adapter_bytes for i in infos)
    notes += adapter_notes(plan, adapter_params=adapter_params, adapter_bytes=adapter_bytes)
    ranks = tuple(rank_profile(i.label, i.device, [r.worker_phases[i.index] for r in done]) for i in infos)
    setup = eng.group.setup  # the settings that ran: the run config's, else the plan's knobs
    allocator = allocator_report(
        setup.allocator, setup.release_cache, device_type=infos[0].device.split(":")[0], conf=infos[0].alloc_conf
    )
    lengths = [r.record["response_len_mean"] for r in done if r.record["response_len_mean"] is not None]
    profile = build_profile(
        plan,
        [(r.record["step"], r.phases, r.wall_s, float(r.trained_tokens)) for r in done],
        device=infos[0].device if len({i.device for i in infos}) == 1 else ", ".join(i.device for i in infos),
        memory_source=infos[0].memory_source,
        rss_source=infos[0].rss_source,
        mean_response_tokens=float(np.mean(lengths)) if lengths else None,
        notes=notes,
        ranks=ranks,
        rollout_backend=rollout.backend,
        allocator=allocator,
        rollout_weight_copy_bytes=max(i.rollout_weight_copy_bytes for i in infos),
        rollout_replica_bytes=replica_bytes,
        adapter=None
        if plan.workload.adapter is None
        else AdapterReport(
            setting=plan.workload.adapter.describe(),
            trainable_params=adapter_params,
            trainable_bytes=adapter_bytes,
            plan_models_adapters=adapters_modelled(plan),
        ),
    )
    if done:  # a resume with nothing left to do keeps the previous profile.json
        write_profile_json(rd.path / "profile.json", profile)
    return RunResult(
        output_dir=rd.path,
        start_step=start_step,
        last_step=done[-1].record["step"] if done else start_step,
        profile=profile,
        last_record=done[-1].record if done else None,
    )
