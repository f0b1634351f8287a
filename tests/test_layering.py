"""Layering rules of the package (DESIGN.md "One home per fact"; issue 17): the engine reads the plan, not
the planner's internals. A run's numbers (layout, rollout KV bytes per token, weight-sync bucket, whether an
old-policy pass runs) come from `Plan.execution`; shared rules from `planner/rules.py`; the kernel constants
both sides use from `grpo_pilot/kernels.py`; model facts from `profiles/`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "grpo_pilot"
# what of the planner the engine may import: the plan and config types, the shared rules
ENGINE_MAY_IMPORT = {
    "grpo_pilot.planner.plan",
    "grpo_pilot.planner.config",
    "grpo_pilot.planner.rules",
    "grpo_pilot.planner.adapters",  # the adapter settings a plan carries and whether its memory models them
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def test_the_engine_imports_only_the_plan_and_config_types_of_the_planner() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(m for m in _imports(path) if m.startswith("grpo_pilot.planner"))
        for path in (PACKAGE / "engine").rglob("*.py")
    }
    bad = {k: [m for m in v if m not in ENGINE_MAY_IMPORT] for k, v in offenders.items()}
    assert not {k: v for k, v in bad.items() if v}


def test_the_planner_imports_no_engine_no_cli_no_verify_no_tuner() -> None:
    for path in (PACKAGE / "planner").rglob("*.py"):
        forbidden = [
            m
            for m in _imports(path)
            if m.startswith(("grpo_pilot.engine", "grpo_pilot.cli", "grpo_pilot.verify", "grpo_pilot.tuner"))
        ]
        assert not forbidden, (path, forbidden)
