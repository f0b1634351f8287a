"""The real-run corpus: load a case file, run each case through `grpo-plan` as a user would, summarise.

    python tests/planner/real_runs/corpus.py                              # cases.json: verdicts, step times, rankings
    python tests/planner/real_runs/corpus.py --file cases_heldout.json    # launches the planner was not shaped on
    python tests/planner/real_runs/corpus.py --file cases_families.json   # PPO/critic, Megatron, LoRA, SGLang, TRL LoRA

A case names its launch file (`scripts/…`, stored as published) and the arguments a user would add on
the command line: the GPUs the run used, a model alias where the script's path is not a bundled hub
id (or a config stored under `models/`), `--override` words for settings the run's verl version
defaulted differently, and the length statistics its logs report (or, marked `assumed`, what the case
assumes where the source publishes none). Everything a case asserts comes from its `source`.
`rankings` group cases one source measured side by side (GPU counts, TP sizes): their predicted step
times must come out in the measured order.

Fields beyond cases.json's (cases_heldout.json, cases_families.json; absent means "not published"):
- `lengths: null` — the source publishes no length statistics; the case passes none (never invented).
- `launch.transcribed_from` / `why_transcribed` — the verbatim launch (a swift command line, notebook cells, a
  Hugging Face Jobs command) when `launch.file` is its key-by-key transcription into the YAML `--from-trl` reads.
- `launch.script_args` — arguments the published command passes to the script itself (`bash train.sh --x 1`):
  passed as `--script-args`, so the script's own argument loop sets its variables.
- `family` (cases_families.json) — the launch family the case exercises: ppo-critic, megatron, lora, sglang,
  trl-lora, trl-qlora (a list where a launch is two).
- `outcome.phase_s` — published phase seconds: rollout (verl timing_s/gen), old_log_prob, ref, values,
  update_critic, update (update_actor); tabled beside the plan's rollout, log_prob (old + ref), values,
  critic_update and update. `step_s` is the published seconds per step; `approximate: true` marks a
  step time derived from a stated duration and step count; `step_s_upper_bound` a bound from a stated time limit.
- `outcome.oom_phase` — where the source says the OOM happened (rollout, log_prob, update, or its own words).
- `outcome.peak_gib` — a measured peak (torch max_memory_reserved, GiB); `wall_s`, `run_steps` — stated durations.
- `outcome.fixed_by` / `outcome.fixes` — the pair of an OOM and the published change that fixed it;
  `outcome.contrast` — the same launch (or one close to it) with the other outcome on other hardware.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

HERE = Path(__file__).resolve().parent
CASES_FILE = HERE / "cases.json"
# the plan's phase_times_s keys compared below (values and critic_update: a PPO plan's critic)
PLANNER_PHASES = ("rollout", "log_prob", "values", "critic_update", "update")


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def load_cases(path: Path = CASES_FILE) -> list[dict[str, Any]]:
    return _load(path)["cases"]


def load_rankings(path: Path = CASES_FILE) -> list[dict[str, Any]]:
    """Groups of cases one source measured side by side (GPU counts, TP sizes): ordered as measured."""
    return _load(path).get("rankings", [])


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
    if launch.get("script_args"):
        args += ["--script-args", " ".join(shlex.quote(a) for a in launch["script_args"])]
    for word in launch.get("overrides", []):
        args += ["--override", word]
    for pin in launch.get("pins", []):
        args += ["--pin", pin]
    for flag, value in (case.get("lengths") or {}).get("flags", {}).items():
        args += [flag, str(value)]
    return args


def evaluate(case: dict[str, Any]) -> dict[str, Any]:
    """grpo-plan's answer as a user sees it: the exit code, the plan JSON (exit 0 fits, 3 does not fit, 4 fits
    only conditionally: inside the headroom or below a mean response length), or the error text of a
    refusal (exit 2)."""
    from grpo_pilot.cli.plan import app

    result = CliRunner().invoke(app, command(case))
    if result.exit_code in (0, 3, 4):
        return {"exit_code": result.exit_code, "plan": json.loads(result.stdout), "error": None}
    text = (result.output or "") + (str(result.exception) if result.exception and not result.output else "")
    return {"exit_code": result.exit_code, "plan": None, "error": " ".join(text.split())}


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """The plan JSON grpo-plan prints for the case (exit 0: fits, 3: does not fit)."""
    answer = evaluate(case)
    if answer["plan"] is None:
        raise RuntimeError(f"{case['id']}: grpo-plan exited {answer['exit_code']}: {answer['error'][-2000:]}")
    return answer["plan"]


def verdict_text(plan: dict[str, Any]) -> str:
    """The plan's verdict in words (fits / does not fit / fits below a mean response of N tokens)."""
    verdict = plan.get("verdict") or {}
    if verdict.get("kind") == "fits_below_mean_response":
        return f"fits below mean response {verdict['boundary_mean_response_tokens'] + 1}"
    if verdict.get("kind") == "fits_below_mean_lengths":
        return (
            f"fits at mean prompt ≤ {verdict['boundary_mean_prompt_tokens']} and mean response ≤ "
            f"{verdict['boundary_mean_response_tokens']}"
        )
    if verdict.get("kind") == "tight":
        return "tight"
    return "fits" if plan["fits"] else "does not fit"


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f}"


def table(cases: list[dict[str, Any]], answers: list[dict[str, Any]]) -> str:
    rows = [
        "| case | hardware | outcome | predicted | peak / usable GiB | binding | measured s/step | predicted s/step "
        "| ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, answer in zip(cases, answers):
        outcome, plan = case["outcome"], answer["plan"]
        measured = outcome.get("step_s")
        shown = f"{measured}{'~' if outcome.get('approximate') else ''}" if measured else "–"
        if plan is None:
            rows.append(
                f"| {case['id']} | {case['hardware']['gpus']} | {outcome['status']} | refused (exit "
                f"{answer['exit_code']}) | – | – | {shown} | – | – |"
            )
            continue
        predicted = plan["predicted_step_s"]
        ratio = f"{predicted / measured:.2f}" if measured else "–"
        verdict = verdict_text(plan)
        rows.append(
            f"| {case['id']} | {case['hardware']['gpus']} | {outcome['status']} | {verdict} | "
            f"{_gib(plan['peak_gpu_bytes'])} / {_gib(plan['usable_gpu_bytes'])} | {plan['binding_constraint']} | "
            f"{shown} | {predicted:.1f} | {ratio} |"
        )
    return "\n".join(rows)


def phase_table(cases: list[dict[str, Any]], answers: list[dict[str, Any]]) -> str:
    """Published phase seconds beside the plan's (old log-prob and reference passes are one phase in the plan)."""
    rows = ["| case | phase | measured s | predicted s |", "|---|---|---|---|"]
    for case, answer in zip(cases, answers):
        measured = case["outcome"].get("phase_s")
        if not measured or answer["plan"] is None:
            continue
        predicted = answer["plan"]["phase_times_s"]
        joined = {
            "rollout": measured.get("rollout"),
            "log_prob": sum(measured.get(k, 0) for k in ("old_log_prob", "ref")) or None,
            "values": measured.get("values"),
            "critic_update": measured.get("update_critic"),
            "update": measured.get("update"),
        }
        for phase in PLANNER_PHASES:
            if joined[phase] is not None and phase in predicted:
                rows.append(f"| {case['id']} | {phase} | {joined[phase]:g} | {predicted[phase]:.1f} |")
    return "\n".join(rows)


def refusals(cases: list[dict[str, Any]], answers: list[dict[str, Any]]) -> str:
    rows = [f"- {c['id']} (exit {a['exit_code']}): {a['error']}" for c, a in zip(cases, answers) if a["plan"] is None]
    return "\n".join(rows)


def ranking_table(cases: list[dict[str, Any]], plans: list[dict[str, Any]], path: Path = CASES_FILE) -> str:
    """One row per ranking: the cases in measured order, measured and predicted seconds side by side."""
    by_id = {c["id"]: (c, p) for c, p in zip(cases, plans)}
    rows = ["| ranking | measured order (s/step) | predicted (s/step) | same order |", "|---|---|---|---|"]
    for ranking in load_rankings(path):
        members = sorted((by_id[i] for i in ranking["cases"]), key=lambda cp: cp[0]["outcome"]["step_s"])
        measured = " < ".join(f"{c['hardware']['gpus']} {c['outcome']['step_s']:.0f}" for c, _ in members)
        predicted = " , ".join(f"{p['predicted_step_s']:.0f}" for _, p in members)
        same = all(a[1]["predicted_step_s"] < b[1]["predicted_step_s"] for a, b in zip(members, members[1:]))
        rows.append(f"| {ranking['id']} | {measured} | {predicted} | {'yes' if same else 'no'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a real-run case file through grpo-plan and print the tables.")
    parser.add_argument("--file", default=CASES_FILE.name, help="case file beside this script (default cases.json)")
    path = HERE / parser.parse_args(argv).file
    cases = load_cases(path)
    answers = [evaluate(c) for c in cases]
    print(table(cases, answers))
    phases = phase_table(cases, answers)
    if phases.count("\n") > 1:
        print()
        print(phases)
    refused = refusals(cases, answers)
    if refused:
        print()
        print("Refused:")
        print(refused)
    if load_rankings(path) and all(a["plan"] for a in answers):
        print()
        print(ranking_table(cases, [a["plan"] for a in answers], path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
