"""Fit the packaged calibration of a GPU from a measurement file of real grpo-run runs.

    .venv/bin/python benchmarks/fit_measured_calibration.py \
        tests/planner/gpu_measurements/h200-2026-11-26.json grpo_pilot/planner/calibrations/H200.json

The fit (`grpo_pilot.tuner.measured_runs.fit_measured`) re-plans every completed run with its own plan
command and measured knobs and fits the host's dispatch times and the engine's CUDA context; the output
is what `grpo-plan` applies by default to plans for that GPU (its host-side constants to every other
GPU). tests/planner/gpu_measurements/test_packaged_calibration.py checks that the packaged file is this
script's output for the committed measurement file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpo_pilot.planner.calibration import save_calibration
from grpo_pilot.tuner.measured_runs import PACKAGED_FIT_TIME, fit_measured, packaged_name


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    source, out = Path(argv[0]), Path(argv[1])
    calibration = fit_measured(source, name=packaged_name(source), created_at=PACKAGED_FIT_TIME)
    save_calibration(calibration, out)
    print(f"{out}: {calibration.name}")
    for value in calibration.fitted:
        print(f"  {value.name}: {value.analytic:.4g} -> {value.fitted:.4g}")
    e = calibration.fit_error
    print(f"  phase seconds error {e.phase_time_before:.2f}x -> {e.phase_time_after:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
