"""Planning stays light: no grpo_pilot.planner module imports torch, transformers, vllm, ray or the engine."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import grpo_pilot.planner

HEAVY = ("torch", "transformers", "vllm", "ray", "grpo_pilot.engine")
# run in a fresh interpreter: prints the heavy modules that got imported
HEAVY_LOADED = (
    "heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in {heavy!r}))\n"
    "print(' '.join(heavy))\n"
    "sys.exit(1 if heavy else 0)\n"
)


def planner_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(grpo_pilot.planner.__path__, prefix="grpo_pilot.planner."))


def test_every_planner_module_imports_without_heavy_packages() -> None:
    modules = planner_modules()
    assert "grpo_pilot.planner.estimate" in modules and "grpo_pilot.planner.memory.kv_cache" in modules
    assert not any(m.startswith("grpo_pilot.planner.traced") for m in modules)  # moved to grpo_pilot.verify
    code = (
        f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
    ) + HEAVY_LOADED.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"imported: {done.stdout.strip()} {done.stderr[-2000:]}"


def test_the_cli_module_stays_light_too() -> None:
    """grpo-plan's own modules import the engine lazily (only for --lengths-from)."""
    code = "import sys, grpo_pilot.cli.plan, grpo_pilot.cli.plan_inputs, grpo_pilot.cli.plan_render\n"
    done = subprocess.run(
        [sys.executable, "-c", code + HEAVY_LOADED.format(heavy=HEAVY)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"imported: {done.stdout.strip()} {done.stderr[-2000:]}"
