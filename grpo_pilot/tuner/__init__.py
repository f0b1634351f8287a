"""`grpo-tune`: an Optuna study over real short engine runs, seeded and pruned by the planner.

Modules, one job each: `space` (which knobs a sweep varies), `prior` (the planner's predictions:
trial plans, seeds, pruning), `runner` (one trial as a `grpo-run` subprocess), `records` (what each
trial stores), `study` (the Optuna storage and study), `sweep` (the ask/tell loop), `display` (the
progress view), `report` (trials.csv, report.png, plan.json, calibration.json), `calibrate` (the
estimator's constants fitted from the measured trials, pure).
"""
