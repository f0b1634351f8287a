"""`grpo-tune plan.json --config run.toml --trials N`: measure candidate plans with short real runs.

Flow: read the plan and the run config (validated as `grpo-run` would) → build the knob space around
the plan and let the planner rank it → open (or continue) the Optuna study in the storage → run
trials until the study holds N counted trials (`tuner.sweep`) → write DIR/plan.json (best measured),
DIR/trials.csv, DIR/report.png and DIR/calibration.json (the estimator's constants fitted from the
measured trials: `grpo-plan --calibration DIR/calibration.json`), and print the best trials.
`--calibrate-only` runs nothing and fits DIR/calibration.json from the trials already in the study.
Ctrl-C or SIGTERM stops after marking the running trial interrupted (its point runs again next time)
and still writes the outputs.
Exit status: 0 with at least one measured trial; 1 when no trial could be measured; 2 bad input (an
--out that is not a directory, or that another grpo-tune holds: the directory is locked while it runs).
"""

from __future__ import annotations

import importlib.util
import math
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from grpo_pilot.cli.options import Rule, argument, check_rules, command, console, flag, flag_name
from grpo_pilot.errors import InputError, RunError
from grpo_pilot.outputs import DirectoryLock, discard_created_dir, prepare_output_dir

app = typer.Typer(
    add_completion=False,
    help="Tune a plan with short real runs: an Optuna study seeded and pruned by the planner, resumable.",
)
TOP_ROWS = 5


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _require_engine() -> None:
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(
            f"grpo-tune runs every trial with the engine, which needs {' and '.join(missing)}.",
            "Install torch first, then pip install 'grpo-pilot[engine,plot]'.",
        )


def _memory_cap(config: Path) -> int | None:
    """Validate the run config as grpo-run will; its memory_cap_bytes (if the engine has the setting)."""
    from grpo_pilot.engine.run_config import build_run_config, read_config_file

    values = read_config_file(config)
    cfg = build_run_config(values, {"steps": 3, "resume": False}, source=f"run config ({config})")
    cap = getattr(cfg, "memory_cap_bytes", None)
    return int(cap) if cap else None


def _summary(records: list[Any], out: Console) -> None:
    from grpo_pilot.tuner.display import knobs_text, rate, size

    by_status: dict[str, int] = {}
    for r in records:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    ok = sorted((r for r in records if r.status == "ok"), key=lambda r: -(r.measured_tokens_per_s or 0))
    table = Table(title=f"best measured trials ({', '.join(f'{n} {s}' for s, n in sorted(by_status.items()))})")
    for col in ("trial", "knobs", "tokens/s", "plan tok/s", "peak", "plan peak"):
        table.add_column(col, justify="left" if col == "knobs" else "right", overflow="fold")
    for r in ok[:TOP_ROWS]:
        table.add_row(
            str(r.number),
            knobs_text(r.params),
            rate(r.measured_tokens_per_s),
            rate(r.predicted_tokens_per_s),
            size(r.measured_peak_bytes),
            size(r.predicted_peak_tensor_bytes),
        )
    out.print(table)


def _calibrate_only(
    base: Any, *, url: str, name: str, out: Path, quiet: bool, err: Console, sweep_adapter: bool = False
) -> None:
    """Fit OUT/calibration.json from the study's measured trials (no trial runs, no engine needed)."""
    from grpo_pilot.tuner.report import write_calibration
    from grpo_pilot.tuner.space import build_space
    from grpo_pilot.tuner.study import identity, open_study, records

    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).is_file():
        raise InputError(
            f"No study storage at {url}: nothing to calibrate from.",
            "Run grpo-tune with --config and --trials first, or give --storage/--out of an existing sweep.",
        )
    the_study = open_study(url, name, notify=lambda text: _note(err, text))
    mine = identity(base, build_space(base, sweep_adapter=sweep_adapter))
    if the_study.user_attrs.get("inputs_sha") not in (None, mine["inputs_sha"]):
        raise InputError(
            f"Study '{name}' in {url} was made for another model, cluster, workload or target than this plan.",
            "Calibrate with the plan the sweep was run with.",
        )
    done = records(the_study)
    path, calibration = write_calibration(out, base, done, source=f"study '{name}' in {url}")
    if not quiet:
        _print_calibration(calibration, path, console())


def _print_calibration(calibration: Any, path: Any, out: Console) -> None:
    e = calibration.fit_error
    table = Table(title=f"calibration '{calibration.name}' from {calibration.num_trials} measured trial(s)")
    for col in ("constant", "analytic", "fitted"):
        table.add_column(col, justify="left" if col == "constant" else "right")
    for v in calibration.fitted:
        table.add_row(v.name, f"{v.analytic:.4g}", f"{v.fitted:.4g}")
    out.print(table)
    for k in calibration.kept_analytic:
        out.print(f"kept analytic: {k.name}: {k.reason}", highlight=False, markup=False, soft_wrap=True)
    out.print(
        f"error factor (geometric RMS, these trials): tokens/s {e.tokens_per_s_before:.2f}x -> "
        f"{e.tokens_per_s_after:.2f}x, phase times {e.phase_time_before:.2f}x -> {e.phase_time_after:.2f}x",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    out.print(f"calibration written to {path}", highlight=False, markup=False, soft_wrap=True)


@dataclass(frozen=True)
class TuneArgs:
    """The arguments and flags of one `grpo-tune` command line."""

    plan: Path = argument(help="plan.json from grpo-plan: the model, cluster, workload and starting knobs.")
    config: Optional[Path] = flag(
        None, "--config", "-c", help="Run config every trial uses (as for grpo-run); not needed with --calibrate-only."
    )
    trials: Optional[int] = flag(None, "--trials", min=1, help="Trials the study should hold (a rerun continues to N).")
    storage: Optional[str] = flag(
        None, "--storage", help="Optuna storage URL (any SQLAlchemy URL); default sqlite:///OUT/study.db."
    )
    study: str = flag("grpo-tune", "--study", help="Study name in the storage.")
    out: Path = flag(Path("runs/tune"), "--out", "-o", help="Output directory (plan.json, trials.csv, ...).")
    steps_per_trial: int = flag(3, "--steps-per-trial", min=3, help="GRPO steps per trial; the first is warm-up.")
    trial_timeout: float = flag(
        900.0, "--trial-timeout", min=1.0, help="Seconds before a trial is killed (start-up included)."
    )
    quiet: bool = flag(False, "--quiet", "-q", help="No progress display and no summary table.")
    sweep_adapter: bool = flag(
        False,
        "--sweep-adapter",
        help="Also vary the LoRA rank (8, 16, 32, 64) and target modules (all-linear, attention, q_proj,v_proj) of a "
        "plan that trains adapters (grpo-plan --lora-rank).",
    )
    calibrate_only: bool = flag(
        False,
        "--calibrate-only",
        help="Run no trial: fit OUT/calibration.json from the measured trials already in the study.",
    )


def _missing_for_trials(a: TuneArgs) -> list[str]:
    return [] if a.calibrate_only else [flag_name(TuneArgs, f) for f in ("config", "trials") if getattr(a, f) is None]


RULES: tuple[Rule, ...] = (
    Rule(
        lambda a: bool(_missing_for_trials(a)),
        lambda a: f"grpo-tune needs {' and '.join(_missing_for_trials(a))} to run trials.",
        "Or pass --calibrate-only to fit from a study.",
    ),
    Rule(
        lambda a: not math.isfinite(a.trial_timeout),
        lambda a: f"--trial-timeout {a.trial_timeout} is not a finite number of seconds.",
        "Give the seconds a trial may take, start-up included (default 900).",
    ),
)


def _check_args(args: TuneArgs) -> int | None:
    """Usage checks before anything is written; the run config's memory cap (None with --calibrate-only)."""
    check_rules(args, RULES)
    if args.calibrate_only:
        return None
    assert args.config is not None  # RULES
    _require_engine()
    return _memory_cap(args.config)


def _settings(args: TuneArgs, cap: int | None) -> Any:
    from grpo_pilot.tuner.sweep import SweepSettings

    assert args.config is not None and args.trials is not None  # _check_args
    return SweepSettings(
        trials=args.trials,
        steps_per_trial=args.steps_per_trial,
        trial_timeout_s=args.trial_timeout,
        out_dir=str(args.out),
        config_path=str(args.config.resolve()),
        memory_cap_bytes=cap,
    )


@command(app, TuneArgs)
def main(args: TuneArgs) -> None:
    """Run short real trials of candidate knobs for PLAN and write the best measured plan."""
    from grpo_pilot.planner.plan import check_plan_out, load_plan
    from grpo_pilot.tuner.prior import memory_limit
    from grpo_pilot.tuner.space import build_space
    from grpo_pilot.tuner.study import check_identity, default_storage, open_study
    from grpo_pilot.tuner.sweep import prepare

    base = load_plan(args.plan)
    err = console(stderr=True)
    url = args.storage or default_storage(args.out)
    cap = _check_args(args)
    created = prepare_output_dir(args.out, flag="--out", what="tuning directory")
    with DirectoryLock(args.out, "grpo-tune"):  # a second grpo-tune on this --out is refused with our PID
        try:
            if args.calibrate_only:
                _calibrate_only(
                    base,
                    url=url,
                    name=args.study,
                    out=args.out,
                    quiet=args.quiet,
                    err=err,
                    sweep_adapter=args.sweep_adapter,
                )
                return
            check_plan_out(args.out / "plan.json", flag="--out")  # the best plan goes there: only over a plan
            space = build_space(base, sweep_adapter=args.sweep_adapter)  # before the storage: a refusal leaves nothing
            the_study = open_study(url, args.study, notify=lambda text: _note(err, text))
            setup = prepare(base, space, memory_limit(base, cap), use_prior=True)
            check_identity(the_study, base, setup.space)
        except InputError:
            if created:
                discard_created_dir(args.out)
            raise
        if not args.quiet:
            dims = ", ".join(f"{k} ({len(v)})" for k, v in setup.space.choices.items())
            _note(err, f"study '{args.study}' in {url}; space: {dims} = {setup.space.size} points", prefix="")
        _sweep(the_study, base, setup=setup, settings=_settings(args, cap), url=url, quiet=args.quiet, err=err)


def _note(out: Console, text: str, prefix: str = "note: ") -> None:
    out.print(f"{prefix}{text}", highlight=False, markup=False, soft_wrap=True)


def _sweep(the_study: Any, base: Any, *, setup: Any, settings: Any, url: str, quiet: bool, err: Console) -> None:
    """Run the trials, then write the outputs (also after Ctrl-C / SIGTERM) and print the summary."""
    from grpo_pilot.tuner.display import SweepDisplay
    from grpo_pilot.tuner.report import write_outputs
    from grpo_pilot.tuner.runner import SubprocessRunner
    from grpo_pilot.tuner.study import records
    from grpo_pilot.tuner.sweep import Sweep

    study = the_study.study_name
    out = Path(settings.out_dir)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    failure: BaseException | None = None
    try:
        with SweepDisplay(err, quiet=quiet) as display:
            Sweep(the_study, base, setup, settings, runner=SubprocessRunner(), events=display).run()
    except (KeyboardInterrupt, RunError) as exc:
        failure = exc
    finally:
        signal.signal(signal.SIGTERM, previous)
    done = records(the_study)
    outputs = write_outputs(out, base, done, source=f"study '{study}' in {url}")
    if failure is not None:
        raise failure
    for note in outputs.notes:
        err.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    if outputs.calibration_json and not quiet:
        err.print(f"calibration: {outputs.calibration_json}", highlight=False, markup=False, soft_wrap=True)
    if outputs.best_trial is None:
        raise RunError(
            f"No trial of study '{study}' produced a measurement ({len(done)} trial(s): see {outputs.trials_csv}).",
            "Read the failure reasons there and in OUT/trials/*/run/grpo-run.log, fix the setup, and run again.",
        )
    if not quiet:
        _summary(done, console())
        print(
            f"best: trial {outputs.best_trial}. Outputs: {outputs.plan_path}, {outputs.trials_csv}, "
            f"{outputs.report_png or '(no report.png)'}, {outputs.calibration_json or '(no calibration.json)'}"
        )
