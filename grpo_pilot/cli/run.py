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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from grpo_pilot.cli.options import argument, command, console, flag
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


@dataclass(frozen=True)
class RunArgs:
    """The arguments and flags of one `grpo-run` command line."""

    plan: Path = argument(help="plan.json written by grpo-plan --out.")
    config: Optional[Path] = flag(None, "--config", "-c", help="Run config (TOML or JSON); flags override it.")
    dataset: Optional[str] = flag(None, "--dataset", help="JSONL prompt set.")
    dataset_format: Optional[str] = flag(
        None, "--format", help="auto | prompt_answer | instruction_response | input_output | messages."
    )
    transform: Optional[str] = flag(
        None, "--transform", help="Record transform 'module:function' or 'file.py:function'."
    )
    skip_invalid: Optional[bool] = flag(
        None, "--skip-invalid/--no-skip-invalid", help="Skip and count bad records instead of stopping."
    )
    reward: Optional[str] = flag(
        None, "--reward", help="Reward spec, e.g. 'char_fraction:char=a' or 'exact_match=1,format=0.5'."
    )
    steps: Optional[int] = flag(None, "--steps", help="GRPO steps to run.")
    lr: Optional[float] = flag(None, "--lr", help="Learning rate.")
    out: Optional[str] = flag(None, "--out", "-o", help="Output directory.")
    seed: Optional[int] = flag(None, "--seed", help="Seed (model init, data order, sampling).")
    backend: Optional[str] = flag(None, "--backend", help="Rollout backend: hf | vllm (default: the plan's).")
    temperature: Optional[float] = flag(None, "--temperature", help="Sampling temperature.")
    max_new_tokens: Optional[int] = flag(None, "--max-new-tokens", help="Response cap (≤ the plan's response length).")
    checkpoint_every: Optional[int] = flag(
        None, "--checkpoint-every", help="Checkpoint every N steps (0 = at the end only)."
    )
    checkpoint: Optional[bool] = flag(
        None,
        "--checkpoint/--no-checkpoint",
        help="--no-checkpoint: write no checkpoint at all, not even at the last step (run config: checkpoint = "
        "false); the run cannot be resumed.",
    )
    resume: bool = flag(False, "--resume", help="Continue from the newest checkpoint in the output directory.")
    device: Optional[str] = flag(None, "--device", help="auto | cpu | cuda.")
    threads: Optional[int] = flag(None, "--threads", help="torch CPU threads.")
    set_: list[str] = flag([], "--set", help="Any run setting as KEY=VALUE (repeatable), e.g. --set clip_high=0.28.")
    address: Optional[str] = flag(
        None,
        "--address",
        help="Ray cluster to join: 'auto' (the one `ray start` made on this node) or HEAD_IP:PORT. Default: a "
        "plan with several workers starts a local Ray cluster, a one-worker plan runs in this process.",
    )
    quiet: bool = flag(False, "--quiet", "-q", help="No progress display and no summary table.")
    allow_unsandboxed_code: bool = flag(
        False,
        "--allow-unsandboxed-code",
        help="Let the code reward run with resource limits only where no sandbox (bwrap/unshare) works.",
    )
    force: bool = flag(
        False, "--force", help="Run a plan the planner says does not fit (the file's verdict or a re-check)."
    )
    check_sandbox: bool = flag(
        False,
        "--check-sandbox",
        is_eager=True,
        callback=_check_sandbox,
        help="Print which isolation the code reward gets on this machine, then exit (no plan needed).",
    )


def _run_config(args: RunArgs) -> Any:
    """The run's settings: the config file, then the flags, then `--set` (each wins over the one before)."""
    from grpo_pilot.engine.run_config import build_run_config, parse_set_option, read_config_file

    file_values = read_config_file(args.config) if args.config is not None else {}
    flags = {
        "dataset": args.dataset,
        "dataset_format": args.dataset_format,
        "transform": args.transform,
        "skip_invalid": args.skip_invalid,
        "reward": args.reward,
        "steps": args.steps,
        "lr": args.lr,
        "output_dir": args.out,
        "seed": args.seed,
        "rollout_backend": args.backend,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "checkpoint_every": args.checkpoint_every,
        "checkpoint": args.checkpoint,
        "resume": args.resume or None,
        "device": args.device,
        "threads": args.threads,
        "allow_unsandboxed_code": args.allow_unsandboxed_code or None,
    }
    flags.update(parse_set_option(args.set_))
    source = f"run config ({args.config})" if args.config else "command line"
    return build_run_config(file_values, flags, source=source)


def _report(result: Any, steps: int, *, memory_history: bool = False) -> None:
    """The end-of-run summary on stdout: measured vs predicted per phase, the last reward, where the outputs are."""
    from grpo_pilot.cli.run_render import summary_table
    from grpo_pilot.engine.memory_history import SNAPSHOT_FILE

    out = console()
    if result.last_step == result.start_step:
        out.print(f"nothing to do: the run in {result.output_dir} is already at step {result.start_step} of {steps}.")
        return
    out.print(summary_table(result.profile))
    if result.profile.num_workers > 1:
        out.print(
            f"{result.profile.num_workers} workers: time = the slowest worker's, memory = the largest worker peak; "
            f"each worker's own figures are under 'ranks' in profile.json (workers.json: their processes)."
        )
    last = result.last_record or {}
    reward_mean = last.get("reward_mean")
    out.print(
        f"steps {result.start_step + 1}–{result.last_step} done"
        + (f"; last reward mean {reward_mean:.3f}" if reward_mean is not None else "")
        + f". Outputs: {Path(result.output_dir) / 'metrics.jsonl'}, {Path(result.output_dir) / 'profile.json'}"
    )
    snapshot = Path(result.output_dir) / "workers" / "worker-0" / SNAPSHOT_FILE
    if memory_history:
        out.print(
            f"allocator history: {snapshot} (open it at https://pytorch.org/memory_viz)"
            if snapshot.exists()
            else "note: memory_history records the CUDA caching allocator: nothing was recorded on this device"
        )
    for note in result.profile.notes:
        out.print(f"note: {note}")


@command(app, RunArgs)
def main(args: RunArgs) -> None:
    """Run GRPO for PLAN and write metrics.jsonl, checkpoints and profile.json."""
    from grpo_pilot.cli.run_display import RunDisplay
    from grpo_pilot.engine.assemble import check_executable
    from grpo_pilot.engine.loop import run
    from grpo_pilot.planner.plan import load_plan

    the_plan = load_plan(args.plan)
    cfg = _run_config(args)
    check_executable(the_plan, cfg)  # what the engine cannot run at all comes first: --force cannot help
    _recheck(the_plan, args.plan, force=args.force)
    with RunDisplay(console(stderr=True), quiet=args.quiet) as display:
        result = run(the_plan, cfg, plan_path=args.plan, events=display, address=args.address)
    if not args.quiet:
        _report(result, cfg.steps, memory_history=cfg.memory_history)
