"""The console commands `grpo-plan`, `grpo-run`, `grpo-tune` (one module each) and their shared pieces.

- `plan.py` (+ `plan_flags.py`: its flags and the table of rules between them, `plan_inputs.py` for the flags'
  values, `plan_render.py` for the tables, `plan_verify.py` for --verify), `run.py` (+ `run_display.py`: the
  engine's progress events on the console, `run_render.py`: the end-of-run table), `tune.py`: thin typer
  commands; rich tables and progress at this edge only.
- `options.py`: flags declared once per command (a frozen dataclass), flag rules as table rows, consoles
  that fit a terminal or a pipe; `errors.py`: the one error handler turning every exception into a paragraph
  and an exit status.
The entry points import their command lazily, so `grpo-plan` never imports the engine.
"""

from __future__ import annotations


def plan_entry() -> None:
    from grpo_pilot.cli.plan import app

    app()


def run_entry() -> None:
    from grpo_pilot.cli.run import app

    app()


def tune_entry() -> None:
    from grpo_pilot.cli.tune import app

    app()
