"""Notebooks stay runnable: execute every code cell of each notebook in one namespace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_cells_run(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    namespace: dict = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
    best, default = namespace["best"], namespace["default_plan"]
    assert best.fits and best.tokens_per_s >= default.tokens_per_s
    assert (
        abs(
            namespace["table"].loc["TOTAL"].sum()
            - sum(p.total_bytes for p in namespace["report"].phases.values()) / (1 << 30)
        )
        < 1e-6
    )


def test_there_is_a_notebook() -> None:
    assert NOTEBOOKS
