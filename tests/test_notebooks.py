"""Notebooks stay runnable: execute every code cell of each notebook in one namespace, then check what it
computed (one check per notebook)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def _walkthrough(ns: dict) -> None:
    best, default = ns["best"], ns["default_plan"]
    assert best.fits and best.tokens_per_s >= default.tokens_per_s
    total = sum(p.total_bytes for p in ns["report"].phases.values()) / (1 << 30)
    assert abs(ns["table"].loc["TOTAL"].sum() - total) < 1e-6


def _plan_verify_tune(ns: dict) -> None:
    plan7, plan32 = ns["plan7"], ns["plan32"]
    assert plan7.fits and plan32.fits and plan32.model.spec.num_params > 4 * plan7.model.spec.num_params
    assert ns["table7"].loc["TOTAL"].max() == pytest.approx(plan7.peak_gpu_bytes / (1 << 30), abs=0.01)
    check = ns["report"].update  # the traced method ran: states agree to the per-tensor rounding
    assert check.traced.total_bytes > 0 and abs(check.relative_error["Adam states"]) < 0.01
    trials = ns["trials"]
    assert len(trials) == 2 and (trials["status"] == "ok").all() and (trials["measured_tokens_per_s"] > 0).all()
    assert (ns["out"] / "plan.json").is_file() and (ns["out"] / "report.png").is_file()


CHECKS: dict[str, Callable[[dict], None]] = {
    "planner_walkthrough.ipynb": _walkthrough,
    "plan_verify_tune.ipynb": _plan_verify_tune,
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_cells_run(path: Path) -> None:
    if path.name == "plan_verify_tune.ipynb":
        pytest.importorskip("torch")  # the traced check and grpo-tune need the engine extra
    cells = json.loads(path.read_text())["cells"]
    namespace: dict = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
    CHECKS[path.name](namespace)


def test_every_notebook_has_a_check() -> None:
    assert NOTEBOOKS and {p.name for p in NOTEBOOKS} == set(CHECKS)
