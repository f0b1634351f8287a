"""grpo-run on 1, 2 and 4 CPU workers, same global batch: step time and tokens/s beside the plan's prediction.

    python benchmarks/engine_scaling.py                       # about a minute on 2 cores
    python benchmarks/engine_scaling.py --workers 1 2 --steps 3 --warmup 1

Same everything but the worker count: the tiny example model (`examples/tiny`, random init), its prompts
and reward, `--prompts-per-step` prompts × `--n` completions per step (the global batch), `--max-new`
new tokens, hf rollout, colocated placement (every worker trains and generates), one on-policy
mini-batch, the same knobs pinned for every N (so only the split over workers changes), one torch
thread per worker, `cpu_memory = "rss"` (no per-op tensor tracker). The plan for each N is the
planner's own evaluation of those knobs on an `Nxcpu` cluster (`grpo_pilot.planner.evaluate`).

N = 1 runs in this process (no Ray); N > 1 joins one local Ray cluster started once for the script
(logical CPUs = the largest N, so 4 workers can be placed on a 2-core laptop). Workers share the
machine's cores: where N exceeds the cores, the measurement shows the cost of the split (collectives,
dispatch, time-sharing), not a speed-up; the plan's prediction assumes every worker has a device of
its own. Times are medians of the measured steps (the first `--warmup` steps of each run are left
out: allocator growth, first optimizer state).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
warnings.filterwarnings("ignore", category=FutureWarning)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny"


def build_plan(workers: int, *, prompts_per_step: int, n: int, max_new: int) -> Any:
    """The planner's evaluation of the pinned knobs for the tiny model on `workers` CPU workers."""
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.planner.evaluate import PlanInputs, model_ref
    from grpo_pilot.planner.make_plan import evaluate
    from grpo_pilot.profiles.catalog import resolve_model

    workload = Workload(
        prompts_per_step=prompts_per_step,
        mini_batch_prompts=prompts_per_step,
        n=n,
        prompt_len_tokens=32,
        response_len_tokens=max_new,
        use_kl_loss=False,
    )
    knobs = Knobs(
        rollout_backend="hf",
        rollout_tp=1,
        placement="colocated",
        micro_batch_size_per_gpu=16,
        gradient_checkpointing=False,
        fused_logprob=False,
        log_prob_max_token_len_per_gpu=prompts_per_step * n * (32 + max_new),
    )
    inputs = PlanInputs(
        model=model_ref(resolve_model(str(EXAMPLE))), cluster=parse_cluster(f"{workers}xcpu"), workload=workload
    )
    return evaluate(inputs, knobs)


def measure(plan: Any, out: Path, *, steps: int, warmup: int, seed: int) -> list[dict[str, Any]]:
    """Run `warmup + steps` GRPO steps through `grpo_pilot.engine.loop.run`; the measured steps' records."""
    from grpo_pilot.engine.loop import run
    from grpo_pilot.engine.run_config import RunConfig

    cfg = RunConfig(
        dataset=str(EXAMPLE / "prompts.jsonl"),
        reward="char_fraction:char=a",
        steps=warmup + steps,
        lr=2e-3,
        output_dir=str(out),
        threads=1,
        cpu_memory="rss",
        checkpoint_every=0,
        seed=seed,
    )
    run(plan, cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows[warmup:]


def _rel(measured: float, predicted: float) -> str:
    return f"{measured / predicted - 1:+.0%}" if predicted > 0 else "—"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--n", type=int, default=4, help="completions per prompt")
    p.add_argument("--max-new", type=int, default=16, help="max new tokens per completion")
    p.add_argument("--steps", type=int, default=5, help="measured steps per worker count")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per worker count (not measured)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    import ray
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    started = time.perf_counter()
    if max(a.workers) > 1:
        ray.init(num_cpus=max(max(a.workers), os.cpu_count() or 1), include_dashboard=False,
                 logging_level=logging.ERROR, log_to_driver=False)  # fmt: skip
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="grpo-scaling-") as tmp:
            for workers in a.workers:
                plan = build_plan(workers, prompts_per_step=a.prompts_per_step, n=a.n, max_new=a.max_new)
                t0 = time.perf_counter()
                kept = measure(plan, Path(tmp) / f"n{workers}", steps=a.steps, warmup=a.warmup, seed=a.seed)
                step_s = statistics.median(r["step_s"] for r in kept)
                tokens = statistics.median(r["trained_tokens"] for r in kept)
                rows.append(
                    {
                        "workers": workers,
                        "step_s": step_s,
                        "tokens_per_s": statistics.median(r["trained_tokens"] / r["step_s"] for r in kept),
                        "tokens_per_step": tokens,
                        "phases": {k: statistics.median(r["phase_s"][k] for r in kept) for k in kept[0]["phase_s"]},
                        "plan_step_s": plan.predicted_step_s,
                        "plan_tokens_per_s": plan.tokens_per_s,
                        "run_s": time.perf_counter() - t0,
                    }
                )
                print(f"{workers} worker(s) done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    finally:
        if ray.is_initialized():
            ray.shutdown()

    base = rows[0]
    print(
        f"\nmodel: examples/tiny (Qwen2, hidden 64, 2 layers, char vocab); global batch {a.prompts_per_step} prompts x "
        f"n={a.n}, max {a.max_new} new tokens; colocated, hf rollout, micro-batch 16; {a.warmup} warm-up + {a.steps} "
        f"measured steps per row; 1 thread per worker; {os.cpu_count()} cores; torch {torch.__version__}"
    )
    header = (
        f"{'workers':>7s} {'step s':>8s} {'plan s':>8s} {'err':>7s} {'tokens/s':>9s} {'plan tok/s':>11s} {'err':>7s} "
        f"{'vs 1 worker':>11s}  phases (median s)"
    )
    print(header)
    for r in rows:
        phases = " ".join(f"{k} {v:.3f}" for k, v in r["phases"].items() if k != "reward")
        print(
            f"{r['workers']:7d} {r['step_s']:8.3f} {r['plan_step_s']:8.4f} {_rel(r['step_s'], r['plan_step_s']):>7s} "
            f"{r['tokens_per_s']:9.0f} {r['plan_tokens_per_s']:11.0f} "
            f"{_rel(r['tokens_per_s'], r['plan_tokens_per_s']):>7s} {base['step_s'] / r['step_s']:10.2f}x  {phases}"
        )
    print(
        "step s / tokens/s: medians of the measured steps (trained prompt + completion tokens per second); plan: the "
        "planner's roofline for the same knobs on Nxcpu; vs 1 worker: step-time speed-up."
    )
    print(f"total wall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
