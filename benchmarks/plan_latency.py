"""Planning latency: one estimate, one full search, and the `grpo-plan` command's wall time.

Prints medians (this box is shared and noisy: medians of several runs, CPU time beside wall time).
The criterion is the README's first command — `grpo-plan --model qwen-32b --gpus 8xA100-80G` —
under 2 s of wall time, imports included.

Run: .venv/bin/python benchmarks/plan_latency.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.evaluate import PlanInputs, assess, model_ref
from grpo_pilot.planner.search import search
from grpo_pilot.planner.timing import estimate_time
from grpo_pilot.profiles import resolve_model

CLI_BUDGET_S = 2.0
MODEL, GPUS = "qwen-32b", "8xA100-80G"


def _median_s(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _cli_command() -> list[str]:
    exe = Path(sys.executable).with_name("grpo-plan")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from grpo_pilot.cli import plan_entry; plan_entry()"]


def _cli_run(args: list[str]) -> tuple[float, float, int]:
    """(wall s, child CPU s, exit status) of one `grpo-plan` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        _cli_command() + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120"}
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="repeats of the search and of the CLI (medians reported)")
    args = parser.parse_args(argv)
    inputs = PlanInputs(model=model_ref(resolve_model(MODEL)), cluster=parse_cluster(GPUS))
    spec, cluster, workload, knobs = inputs.model.spec, inputs.cluster, inputs.workload, Knobs()

    rows: list[tuple[str, str, str]] = []
    rows.append(
        (
            "estimate_memory (one configuration)",
            f"{_median_s(lambda: estimate_memory(spec, cluster, workload, knobs), 2000) * 1e6:,.0f} µs",
            "median of 2000",
        )
    )
    rows.append(
        (
            "estimate_time (one configuration)",
            f"{_median_s(lambda: estimate_time(spec, cluster, workload, knobs), 2000) * 1e6:,.0f} µs",
            "median of 2000",
        )
    )
    rows.append(
        (
            "assess = memory + time + checks",
            f"{_median_s(lambda: assess(inputs, knobs), 2000) * 1e6:,.0f} µs",
            "median of 2000",
        )
    )
    first = search(inputs)
    rows.append(
        (
            f"full search ({first.trials} Optuna trials + {first.refine_evaluations} refinement evaluations)",
            f"{_median_s(lambda: search(inputs), args.runs):.3f} s",
            f"median of {args.runs}",
        )
    )
    worst = 0.0
    for label, extra in (("table", []), ("--json", ["--json"])):
        runs = [_cli_run(["--model", MODEL, "--gpus", GPUS, *extra]) for _ in range(args.runs)]
        if any(rc != 0 for _, _, rc in runs):
            print(f"grpo-plan {label} failed", file=sys.stderr)
            return 1
        wall = statistics.median(w for w, _, _ in runs)
        cpu = statistics.median(c for _, c, _ in runs)
        worst = max(worst, wall)
        rows.append(
            (
                f"grpo-plan --model {MODEL} --gpus {GPUS} ({label})",
                f"{wall:.2f} s wall",
                f"CPU {cpu:.2f} s; median of {args.runs}",
            )
        )

    table = Table(title=f"planning latency ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")
    for col in ("what", "time", "note"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console(width=160).print(table)
    verdict = "PASS" if worst < CLI_BUDGET_S else "FAIL"
    print(f"{verdict}: CLI median wall time {worst:.2f} s (criterion < {CLI_BUDGET_S:.0f} s)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
