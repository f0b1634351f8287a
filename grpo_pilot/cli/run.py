"""`grpo-run plan.json [--config run.toml] [flags]`: execute a plan with the embedded GRPO engine.

Settings come from the run config file and flags (flags win; `--set KEY=VALUE` reaches every
setting of `RunConfig`). Outputs in the output directory: metrics.jsonl, checkpoints/,
profile.json (measured vs predicted per phase) and run_config.json. Exit status 2 for bad input
(missing/corrupt plan, bad dataset line, bad reward spec, an --out that is not a directory or is
locked by another run, ...), 3 when the plan does not fit (marked so, or re-checked by the planner;
`--force` runs it anyway), 1 when the run itself fails, 130 on Ctrl-C or SIGTERM (after failure.json kind
"interrupted", the workers stopped and the lock released).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from grpo_pilot.cli.errors import handle_errors
from grpo_pilot.errors import InfeasibleError, InputError

app = typer.Typer(add_completion=False, help="Run GRPO for a plan.json and compare measured memory/time with the plan.")


def _check_sandbox(value: bool) -> None:
    """`--check-sandbox`: print what isolation the code reward gets here; exit 0 if any, 1 if none."""
    if not value:
        return
    from grpo_pilot.engine.rewards.isolation import choose, describe_reports, probe

    print(describe_reports([probe("bwrap"), probe("unshare")]))
    chosen = choose("auto")
    if chosen.available:
        print(f"=> the code reward runs in: {chosen.mechanism}")
    else:
        print("=> no isolation here: the code reward refuses to run unless --allow-unsandboxed-code is given")
    raise typer.Exit(0 if chosen.available else 1)


def _recheck(the_plan: Any, path: Path, *, force: bool) -> None:
    """Refuse (exit 3) a plan that does not fit by its own verdict or the planner's re-check, unless --force."""
    from grpo_pilot.planner.calibration import inputs_of_plan
    from grpo_pilot.planner.recheck import recheck

    verdict = recheck(the_plan, inputs_of_plan(the_plan))
    if verdict.mismatch is not None:
        problem = (
            f"'{path}' does not add up: its predictions are not what its own inputs give ({verdict.mismatch}); "
            f"it was edited by hand or written by another grpo-pilot version ({the_plan.provenance.tool_version})"
        )
        if not force:
            raise InputError(f"{problem}.", "Re-create it with grpo-plan, or pass --force to run it as it is.")
        print(f"warning: --force: running although {problem}.", file=sys.stderr)
    if verdict.file_fits and verdict.fits:
        return
    if force:
        print(f"warning: --force: running '{path}' although {verdict.reason()}.", file=sys.stderr)
        return
    raise InfeasibleError(
        f"Not running '{path}': {verdict.reason()}.",
        "Re-plan with grpo-plan (it searches knobs that fit), or pass --force to run it anyway (it may run out "
        "of memory).",
    )


@app.command()
@handle_errors
def main(
    plan: Path = typer.Argument(..., help="plan.json written by grpo-plan --out."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Run config (TOML or JSON); flags override it."),
    dataset: Optional[str] = typer.Option(None, help="JSONL prompt set."),
    dataset_format: Optional[str] = typer.Option(
        None, "--format", help="auto | prompt_answer | instruction_response | input_output | messages."
    ),
    transform: Optional[str] = typer.Option(None, help="Record transform 'module:function' or 'file.py:function'."),
    skip_invalid: Optional[bool] = typer.Option(
        None, "--skip-invalid/--no-skip-invalid", help="Skip and count bad records instead of stopping."
    ),
    reward: Optional[str] = typer.Option(
        None, help="Reward spec, e.g. 'char_fraction:char=a' or 'exact_match=1,format=0.5'."
    ),
    steps: Optional[int] = typer.Option(None, help="GRPO steps to run."),
    lr: Optional[float] = typer.Option(None, help="Learning rate."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output directory."),
    seed: Optional[int] = typer.Option(None, help="Seed (model init, data order, sampling)."),
    backend: Optional[str] = typer.Option(None, help="Rollout backend: hf | vllm (default: the plan's)."),
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Response cap (≤ the plan's response length)."),
    checkpoint_every: Optional[int] = typer.Option(None, help="Checkpoint every N steps (0 = at the end only)."),
    checkpoint: Optional[bool] = typer.Option(
        None,
        "--checkpoint/--no-checkpoint",
        help="--no-checkpoint: write no checkpoint at all, not even at the last step (run config: checkpoint = "
        "false); the run cannot be resumed.",
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in the output directory."),
    device: Optional[str] = typer.Option(None, help="auto | cpu | cuda."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads."),
    set_: list[str] = typer.Option(
        [], "--set", help="Any run setting as KEY=VALUE (repeatable), e.g. --set clip_high=0.28."
    ),
    address: Optional[str] = typer.Option(
        None,
        "--address",
        help="Ray cluster to join: 'auto' (the one `ray start` made on this node) or HEAD_IP:PORT. Default: a "
        "plan with several workers starts a local Ray cluster, a one-worker plan runs in this process.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live display and no summary table."),
    allow_unsandboxed_code: bool = typer.Option(
        False,
        "--allow-unsandboxed-code",
        help="Let the code reward run with resource limits only where no sandbox (bwrap/unshare) works.",
    ),
    force: bool = typer.Option(
        False, "--force", help="Run a plan the planner says does not fit (the file's verdict or a re-check)."
    ),
    check_sandbox: bool = typer.Option(
        False,
        "--check-sandbox",
        is_eager=True,
        callback=_check_sandbox,
        help="Print which isolation the code reward gets on this machine, then exit (no plan needed).",
    ),
) -> None:
    """Run GRPO for PLAN and write metrics.jsonl, checkpoints and profile.json."""
    from rich.console import Console

    from grpo_pilot.engine.run_config import build_run_config, parse_set_option, read_config_file
    from grpo_pilot.planner.plan import load_plan

    the_plan = load_plan(plan)
    file_values = read_config_file(config) if config is not None else {}
    flags = {
        "dataset": dataset,
        "dataset_format": dataset_format,
        "transform": transform,
        "skip_invalid": skip_invalid,
        "reward": reward,
        "steps": steps,
        "lr": lr,
        "output_dir": out,
        "seed": seed,
        "rollout_backend": backend,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "checkpoint_every": checkpoint_every,
        "checkpoint": checkpoint,
        "resume": resume or None,
        "device": device,
        "threads": threads,
        "allow_unsandboxed_code": allow_unsandboxed_code or None,
    }
    flags.update(parse_set_option(set_))
    cfg = build_run_config(file_values, flags, source=f"run config ({config})" if config else "command line")
    from grpo_pilot.engine.assemble import check_executable

    check_executable(the_plan, cfg)  # what the engine cannot run at all comes first: --force cannot help
    _recheck(the_plan, plan, force=force)

    from grpo_pilot.engine.loop import run
    from grpo_pilot.engine.metrics import summary_table

    console = Console(stderr=True)
    result = run(the_plan, cfg, plan_path=plan, quiet=quiet, console=console, address=address)
    if quiet:
        return
    out_console = Console(file=sys.stdout)
    if result.last_step == result.start_step:
        out_console.print(
            f"nothing to do: the run in {result.output_dir} is already at step {result.start_step} of {cfg.steps}."
        )
        return
    out_console.print(summary_table(result.profile))
    if result.profile.num_workers > 1:
        out_console.print(
            f"{result.profile.num_workers} workers: time = the slowest worker's, memory = the largest worker peak; "
            f"each worker's own figures are under 'ranks' in profile.json (workers.json: their processes)."
        )
    last = result.last_record or {}
    reward_mean = last.get("reward_mean")
    out_console.print(
        f"steps {result.start_step + 1}–{result.last_step} done"
        + (f"; last reward mean {reward_mean:.3f}" if reward_mean is not None else "")
        + f". Outputs: {Path(result.output_dir) / 'metrics.jsonl'}, {Path(result.output_dir) / 'profile.json'}"
    )
    for note in result.profile.notes:
        out_console.print(f"note: {note}")
