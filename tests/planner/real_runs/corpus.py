"""The real-run corpus: load `cases.json`, run each case through `grpo-plan` as a user would, summarise.

    python tests/planner/real_runs/corpus.py        # prints the corpus table (verdicts, step times, rankings)

A case names its launch file (`scripts/…`, stored as published) and the arguments a user would add on
the command line: the GPUs the run used, a model alias where the script's path is not a bundled hub
id (or a config stored under `models/`), `--override` words for settings the run's verl version
defaulted differently, and the length statistics its logs report (or, marked `assumed`, what the case
assumes where the source publishes none). Everything a case asserts comes from its `source`.
`rankings` group cases one source measured side by side (GPU counts, TP sizes): their predicted step
times must come out in the measured order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

HERE = Path(__file__).resolve().parent
CASES_FILE = HERE / "cases.json"


def load_cases() -> list[dict[str, Any]]:
    return json.loads(CASES_FILE.read_text())["cases"]


def load_rankings() -> list[dict[str, Any]]:
    """Groups of cases one source measured side by side (GPU counts, TP sizes): ordered as measured."""
    return json.loads(CASES_FILE.read_text()).get("rankings", [])


def command(case: dict[str, Any]) -> list[str]:
    """grpo-plan arguments of one case (what a user would type)."""
    launch = case["launch"]
    if launch["kind"] == "search":  # a claim about every configuration: grpo-plan searches the space
        args = list(launch["args"]) + ["--gpus", case["hardware"]["gpus"], "--json"]
    else:
        args = [f"--from-{launch['kind']}", str(HERE / launch["file"]), "--gpus", case["hardware"]["gpus"], "--json"]
    args += ["--headroom-gib", "0"]  # the verdict tests the estimate against the device, not a safety margin
    if launch.get("model"):  # a bundled alias, or a config stored beside the corpus (models/...)
        local = HERE / launch["model"]
        args += ["--model", str(local) if local.exists() else launch["model"]]
    for word in launch.get("overrides", []):
        args += ["--override", word]
    for pin in launch.get("pins", []):
        args += ["--pin", pin]
    for flag, value in (case.get("lengths") or {}).get("flags", {}).items():
        args += [flag, str(value)]
    return args


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """The plan JSON grpo-plan prints for the case (exit 0: fits, 3: does not fit)."""
    from grpo_pilot.cli_plan import app

    result = CliRunner().invoke(app, command(case))
    if result.exit_code not in (0, 3):
        raise RuntimeError(f"{case['id']}: grpo-plan exited {result.exit_code}: {result.output[-2000:]}")
    return json.loads(result.stdout)


def table(cases: list[dict[str, Any]], plans: list[dict[str, Any]]) -> str:
    rows = [
        "| case | hardware | outcome | predicted | peak / usable GiB | measured s/step | predicted s/step | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, plan in zip(cases, plans):
        measured = case["outcome"].get("step_s")
        predicted = plan["predicted_step_s"]
        ratio = f"{predicted / measured:.2f}" if measured else "–"
        verdict = "fits" if plan["fits"] else "does not fit"
        peak, usable = plan["peak_gpu_bytes"] / 2**30, plan["usable_gpu_bytes"] / 2**30
        rows.append(
            f"| {case['id']} | {case['hardware']['gpus']} | {case['outcome']['status']} | {verdict} | "
            f"{peak:.1f} / {usable:.1f} | {measured or '–'} | {predicted:.1f} | {ratio} |"
        )
    return "\n".join(rows)


def ranking_table(cases: list[dict[str, Any]], plans: list[dict[str, Any]]) -> str:
    """One row per ranking: the cases in measured order, measured and predicted seconds side by side."""
    by_id = {c["id"]: (c, p) for c, p in zip(cases, plans)}
    rows = ["| ranking | measured order (s/step) | predicted (s/step) | same order |", "|---|---|---|---|"]
    for ranking in load_rankings():
        members = sorted((by_id[i] for i in ranking["cases"]), key=lambda cp: cp[0]["outcome"]["step_s"])
        measured = " < ".join(f"{c['hardware']['gpus']} {c['outcome']['step_s']:.0f}" for c, _ in members)
        predicted = " , ".join(f"{p['predicted_step_s']:.0f}" for _, p in members)
        same = all(a[1]["predicted_step_s"] < b[1]["predicted_step_s"] for a, b in zip(members, members[1:]))
        rows.append(f"| {ranking['id']} | {measured} | {predicted} | {'yes' if same else 'no'} |")
    return "\n".join(rows)


def main() -> int:
    cases = load_cases()
    plans = [run_case(c) for c in cases]
    print(table(cases, plans))
    print()
    print(ranking_table(cases, plans))
    return 0


if __name__ == "__main__":
    sys.exit(main())
