"""No function-level imports of grpo_pilot.* outside grpo_pilot/cli/ (an AST walk of every module).

The console commands (grpo_pilot/cli/) import their heavy parts lazily so that `grpo-plan` never imports the
engine; everywhere else a module's grpo_pilot imports sit at its top, where the import graph can be read.
Lazy imports of torch, Ray, vLLM, matplotlib, peft and transformers stay allowed (they are not grpo_pilot.*).
`ALLOWED` lists the exceptions, each with why it must stay inside its function.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "grpo_pilot"
# (module file, imported grpo_pilot module prefix) -> why the import stays in the function
TORCH_FREE_VERIFY = (
    "grpo_pilot.engine.actor imports torch at module level, and grpo_pilot.verify imports without torch "
    "(tests/planner/test_traced.py::test_verify_import_does_not_import_torch): grpo-plan --verify checks for the "
    "engine extra before any trace"
)
ALLOWED: dict[tuple[str, str], str] = {
    ("verify/compare.py", "grpo_pilot.engine"): TORCH_FREE_VERIFY,
    ("verify/traced.py", "grpo_pilot.engine"): TORCH_FREE_VERIFY,
    ("verify/rollout_trace.py", "grpo_pilot.engine"): TORCH_FREE_VERIFY,
}


def function_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `import grpo_pilot...` / `from grpo_pilot... import` inside a function."""
    found = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                found.append((node.lineno, f".{node.module or ''} (relative)"))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grpo_pilot":
                found.append((node.lineno, str(node.module)))
            elif isinstance(node, ast.Import):
                found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "grpo_pilot"]
    return sorted(set(found))


def test_no_function_level_imports_of_grpo_pilot_outside_the_cli():
    offenders, used = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("cli/"):
            continue
        for line, module in function_level_imports(path):
            allowed = [key for key in ALLOWED if key[0] == rel and module.startswith(key[1])]
            if allowed:
                used.update(allowed)
            else:
                offenders.append(f"grpo_pilot/{rel}:{line}: {module}")
    assert not offenders, "move these imports to the top of their module:\n" + "\n".join(offenders)
    assert used == set(ALLOWED), f"allow-list entries no longer needed: {sorted(set(ALLOWED) - used)}"


def test_the_walk_sees_function_level_imports(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text(
        "import torch\nfrom grpo_pilot.errors import InputError\n\n"
        "def f():\n    import ray\n    from grpo_pilot.planner import plan\n    import grpo_pilot.inputs\n"
        "    from . import sibling\n"
    )
    assert function_level_imports(sample) == [(6, "grpo_pilot.planner"), (7, "grpo_pilot.inputs"), (8, ". (relative)")]
