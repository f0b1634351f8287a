"""Tuning efficiency: real-run trials grpo-tune needs to reach within 5 % of the best measured throughput.

1. **Grid** (real runs): every point of a small knob space of the tiny example (update micro-batch or
   token budget × gradient checkpointing × fused log-probs = 48 points) runs through the tuner's own
   trial runner (`grpo-run` subprocesses, `--steps` steps, later steps measured), `--repeats` times,
   interleaved (every point once, then again) so that load drifts on this shared box hit all points
   alike. A point's throughput is the median of its repeats; the target is 95 % of the best median.
2. **Replay**: CPU timings here are noisy, so both strategies are replayed over the measured table
   for many seeds: a trial of point p returns one of p's repeats drawn at random (the noise a real
   trial would see). The same sweep code as `grpo-tune` runs with a table-lookup runner:
   - `grpo-tune`: the planner's prior (input plan and best predicted plans enqueued, dead dimensions
     dropped, memory pruning, unseen points by predicted rank when the sampler repeats itself);
   - `plain Optuna`: the same TPE sampler over the same space, no prior (random unseen points when
     the sampler repeats itself).
   Counted: real runs until a point whose median is within 5 % of the grid's best has been run.

Run: .venv/bin/python benchmarks/tune_efficiency.py [--save grid.json]   (~25 min: the grid)
     .venv/bin/python benchmarks/tune_efficiency.py --table grid.json      (~1 min: replay only)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from grpo_pilot.atomic import atomic_write_text
from grpo_pilot.planner.evaluate import evaluate
from grpo_pilot.planner.plan import load_plan, save_plan
from grpo_pilot.tuner.prior import plan_inputs
from grpo_pilot.tuner.runner import SubprocessRunner, TrialRequest
from grpo_pilot.tuner.space import build_space, grid, knobs_at
from grpo_pilot.tuner.versions import software_versions

PLAN = "examples/tiny/plan.json"
CONFIG = "examples/tiny/run.toml"
DIMENSIONS = ("update_batch", "gradient_checkpointing", "fused_logprob")
TOLERANCE = 0.05
TARGET_TRIALS = 8


def measure_grid(repeats: int, steps: int, console: Console) -> dict[str, Any]:
    """Every point of the space, `repeats` real runs each (interleaved); the measured table."""
    plan = load_plan(PLAN)
    space = build_space(plan).restrict(DIMENSIONS)
    inputs = plan_inputs(plan)
    points = list(grid(space))
    runner = SubprocessRunner()
    rows: list[dict[str, Any]] = [{"params": p, "tokens_per_s": [], "status": []} for p in points]
    with (
        tempfile.TemporaryDirectory(prefix="tune-grid-") as tmp,
        Progress(
            TextColumn("[bold]grid"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as bar,
    ):
        task = bar.add_task("runs", total=repeats * len(points))
        for rep in range(repeats):
            for i, row in enumerate(rows):
                trial_dir = Path(tmp) / f"p{i:03d}-r{rep}"
                plan_path = trial_dir / "trialplan.json"
                save_plan(evaluate(inputs, knobs_at(space, row["params"])), plan_path)
                outcome = runner.run(
                    TrialRequest(
                        plan_path=str(plan_path),
                        config_path=CONFIG,
                        out_dir=str(trial_dir / "run"),
                        steps=steps,
                        timeout_s=300,
                    )
                )
                row["status"].append(outcome.status)
                if outcome.tokens_per_s is not None:
                    row["tokens_per_s"].append(outcome.tokens_per_s)
                bar.advance(task)
    return {
        "plan": PLAN,
        "config": CONFIG,
        "dimensions": list(DIMENSIONS),
        "space": {k: list(v) for k, v in space.choices.items()},
        "repeats": repeats,
        "steps": steps,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "versions": software_versions(),
        "points": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", help="replay a grid measured earlier (JSON written by --save)")
    parser.add_argument("--save", help="write the measured grid here (JSON)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if args.table:
        table = json.loads(Path(args.table).read_text())
    else:
        table = measure_grid(args.repeats, args.steps, console)
        if args.save:
            atomic_write_text(args.save, json.dumps(table, indent=1) + "\n")
    best = max(statistics.median(r["tokens_per_s"]) for r in table["points"] if r["tokens_per_s"])
    print(f"grid best median {best:.0f} tokens/s over {len(table['points'])} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
