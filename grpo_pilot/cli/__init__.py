"""The console commands `grpo-plan`, `grpo-run`, `grpo-tune` (one module each) and their shared pieces.

- `plan.py` (+ `plan_inputs.py` for the flags' values, `plan_render.py` for the tables, `plan_verify.py` for
  --verify), `run.py`, `tune.py`: thin typer commands; rich tables and progress at this edge only.
- `errors.py`: the one error handler turning our exceptions into a paragraph and an exit status.
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
