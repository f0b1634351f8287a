"""Replay the CUDA caching allocator over our engine's real GRPO steps: the device reserve of a measured run.

    .venv/bin/python benchmarks/allocator_replay.py tests/planner/gpu_measurements/h200-2026-11-26.json \
        OUT.json [--steps 3] [--cases NAME,...] [--events-dir DIR]

For every completed run of the measurement file, the engine's own step — the actor built as a training
worker builds it (fp32 policy moved to the device, the reference's deepcopy cast to bf16), then per step
the HF rollout's decode loop on the policy (eval, inference mode, bf16 autocast), the cache release after
the rollout, the old-policy and reference log-prob passes, and one `Actor.update` per mini-batch — runs on
fake tensors at full size (the traced method on one unsharded rank: verify/single_rank.py,
verify/cuda_autocast.py, verify/rollout_trace.py), while `verify/alloc_record.py` records every storage
allocated and freed, in order, with the phase marks and the places where the engine may empty the cache.

`verify/allocator_sim.py` then replays that sequence under each allocator setting and release policy of
the engine (engine/device_memory.py): `default` or `expandable`, releasing at `after_rollout` (the
measured runs), `verl` (before and after the weight sync, after the rollout) or `never`. The output holds,
per case and setting, the replayed peaks of allocated and reserved bytes, overall and per phase, beside
the measured ones: the check on the planner's reserve model (planner/memory/allocator.py; the last output is
benchmarks/allocator_replay_h200.json, compared in docs/validation.md "Device footprint").

Needs torch and transformers (CPU); minutes per case on two cores (the decode loop dominates).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from grpo_pilot.engine.device_memory import RELEASE_POINTS
from grpo_pilot.tuner.measured_runs import _flags, load_measurements, measured_inputs
from grpo_pilot.verify.allocator_sim import replay

CUBLAS_WORKSPACE_BYTES = 32 << 20  # Hopper's default cuBLAS workspace per handle (notes/mechanisms.md §5.5)
KL_COEF = 0.001  # the run config's default with the plan's use_kl_loss (engine/run_config.py kl_coef)


def _rollout(model: Any, prompts: list[list[int]], new_tokens: int) -> None:
    """HFRollout.generate's one decode_batch over every row (engine/rollout/hf.py `_generation_mode`)."""
    import torch

    from grpo_pilot.engine.rollout.decode import decode_batch
    from grpo_pilot.verify.rollout_trace import _decode

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            _decode(decode_batch, model, prompts, new_tokens)
    finally:
        model.train(was_training)


def record_case(case: dict[str, Any], steps: int, rollout: bool = True) -> list[tuple]:
    """The allocation events of `steps` GRPO steps of a measured run (module docstring)."""
    import torch

    from grpo_pilot.engine.actor import Actor, LossSettings
    from grpo_pilot.engine.settings import ActorSettings
    from grpo_pilot.profiles import resolve_model
    from grpo_pilot.verify.alloc_record import AllocationLog, note_module, recording
    from grpo_pilot.verify.cuda_autocast import cuda_autocast_policy
    from grpo_pilot.verify.fake_trace import gpu_attention_masks, hf_config_from_spec, host_sync_fake_mode
    from grpo_pilot.verify.single_rank import build_fake_model, fake_module_moves
    from grpo_pilot.verify.traced import _samples

    inputs, knobs = measured_inputs(case)
    w = inputs.workload
    spec = resolve_model(str(_flags(case["plan_command"])["model"])).spec
    kl = w.use_kl_loss
    settings = ActorSettings.from_knobs(knobs, with_ref=kl)
    loss = LossSettings(kl_coef=KL_COEF if kl else 0.0)
    prompt = w.prompt_len_tokens - 2  # the measured runs' prompts (measured_runs.measured_inputs)
    count = w.prompts_per_step * w.n
    mini = [
        list(range(i, min(i + w.mini_batch_prompts * w.n, count))) for i in range(0, count, w.mini_batch_prompts * w.n)
    ]
    off_policy = len(mini) * w.ppo_epochs > 1
    log = AllocationLog(cublas_workspace_bytes=CUBLAS_WORKSPACE_BYTES)
    with warnings.catch_warnings(), gpu_attention_masks(), host_sync_fake_mode(), cuda_autocast_policy():
        warnings.filterwarnings("ignore")
        model = build_fake_model(hf_config_from_spec(spec))
        note_module(log, model)  # Actor's policy.to(device): the fp32 weights, in _apply order
        with recording(log):
            with fake_module_moves():
                actor = Actor(model, device=torch.device("cpu"), settings=settings, world_size=1, numerics="cuda")
            _mark_optimizer_and_forwards(log, actor)
            for step in range(steps):
                samples = _samples(
                    count=count,
                    prompt_len=prompt,
                    response_len=w.response_len_tokens,
                    vocab=spec.vocab_size,
                    offset=step * count,
                    group=w.n,
                )
                log.events.append(("r", "before_weight_sync"))
                log.phase("weight_sync")
                log.events.append(("r", "after_weight_sync"))
                log.phase("rollout")
                if rollout:
                    _rollout(actor.policy, [list(s.prompt_ids) for s in samples], w.response_len_tokens)
                log.events.append(("r", "after_rollout"))
                log.phase("log_prob")
                old = actor.log_probs(samples) if off_policy else None
                log.events.append(("r", "after_log_prob") if off_policy else ("c", "no old-policy pass"))
                ref = actor.log_probs(samples, ref=True) if kl else None
                log.events.append(("r", "after_log_prob") if kl else ("c", "no reference pass"))
                log.phase("update")
                advantages = torch.ones(count)
                for mb in mini:
                    actor.update(
                        [samples[i] for i in mb],
                        advantages[mb],
                        loss,
                        old_logprobs=[old[i] for i in mb] if old is not None else None,
                        ref_logprobs=[ref[i] for i in mb] if ref is not None else None,
                    )
                del old, ref, advantages, samples
                log.phase("idle")
    return log.events


def _mark_optimizer_and_forwards(log: Any, actor: Any) -> None:
    """Comments in the event log where each optimizer step and each scorer forward starts (for reading it)."""
    actor.optimizer.register_step_pre_hook(lambda *_: log.events.append(("c", "optimizer_step")))
    actor.optimizer.register_step_post_hook(lambda *_: log.events.append(("c", "optimizer_step_end")))
    for scorer in (actor.scorer, actor.ref_scorer):
        if scorer is not None:
            scorer.register_forward_pre_hook(lambda *_: log.events.append(("c", "forward")))


def replays(events: list[tuple]) -> dict[str, Any]:
    """Peaks under each allocator setting and release policy (module docstring)."""
    out: dict[str, Any] = {}
    for setting in ("default", "expandable"):
        for policy, points in RELEASE_POINTS.items():
            r = replay(events, expandable=setting == "expandable", release_points=points)
            out[f"{setting}/{policy}"] = {
                "peak_allocated_bytes": r.peak_allocated_bytes,
                "peak_reserved_bytes": r.peak_reserved_bytes,
                "phases": {k: {"allocated_bytes": v.allocated_bytes, "reserved_bytes": v.reserved_bytes}
                           for k, v in r.phases.items()},
            }  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measurements")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cases", default="")
    parser.add_argument("--events-dir", default="")
    parser.add_argument(
        "--no-rollout",
        action="store_true",
        help="skip the decode loop (it frees everything it allocates, so the phases after a release are the same; "
        "the rollout's own peaks and the `never` policy are then not replayed)",
    )
    a = parser.parse_args(argv)
    wanted = set(filter(None, a.cases.split(",")))
    raw = load_measurements(a.measurements)
    results = {"about": __doc__.split("\n\n")[0], "steps": a.steps, "rollout": not a.no_rollout, "cases": {}}
    for case in raw["cases"]:
        if not case.get("completed") or (wanted and case["name"] not in wanted):
            continue
        started = time.perf_counter()
        events = record_case(case, a.steps, rollout=not a.no_rollout)
        recorded_s = time.perf_counter() - started
        if a.events_dir:
            with gzip.open(Path(a.events_dir) / f"{case['name']}.events.json.gz", "wt") as handle:
                json.dump(events, handle)
        results["cases"][case["name"]] = {
            "events": len(events),
            "record_s": round(recorded_s, 1),
            "measured": {
                "update_allocated_bytes": case["phases"]["update"]["measured_peak_bytes"],
                "reserved_peak_bytes": case["reserved_peak_bytes"],
                "device_used_bytes": case["device_used_peak_bytes"] - case["device_used_before_bytes"],
            },
            "replayed": replays(events),
        }
        print(case["name"], json.dumps(results["cases"][case["name"]]["replayed"]["default/after_rollout"])[:300])
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
