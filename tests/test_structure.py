"""Size rules of the package (HELPERS standards; issue 17), by an AST walk of every module of grpo_pilot/:
no function over 80 lines, and no function taking more than 4 positional parameters (self / cls aside) —
past four, parameters are keyword-only (`*,`), so that two swapped integers fail loudly instead of silently.

`POSITIONAL_ALLOWED` lists the exceptions, each with why its parameters must stay positional.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "grpo_pilot"
MAX_FUNCTION_LINES = 80
MAX_POSITIONAL = 4
AUTOGRAD_APPLY = (
    "a torch.autograd.Function's forward receives what `Function.apply(...)` is given, and apply takes positional "
    "arguments only"
)
# (module file, function name) -> why its parameters stay positional
POSITIONAL_ALLOWED: dict[tuple[str, str], str] = {
    ("engine/algos/logprobs.py", "forward"): AUTOGRAD_APPLY,
    ("engine/failures.py", "_rebuild"): (
        "the unpickling callable that `__reduce__` returns: pickle calls it with the positional tuple it stored"
    ),
}


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def function_lines(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, length in lines, decorators excluded) of every function and method in `path`."""
    return [(fn.name, fn.lineno, fn.end_lineno - fn.lineno + 1) for fn in _functions(ast.parse(path.read_text()))]


def positional_parameters(path: Path) -> list[tuple[str, int, list[str]]]:
    """(name, line, positional parameter names without a leading self / cls) of every function in `path`."""
    found = []
    for fn in _functions(ast.parse(path.read_text())):
        names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if names and names[0] in ("self", "cls"):
            names = names[1:]
        found.append((fn.name, fn.lineno, names))
    return found


def _modules() -> list[tuple[str, Path]]:
    return [(path.relative_to(PACKAGE).as_posix(), path) for path in sorted(PACKAGE.rglob("*.py"))]


def test_no_function_is_over_80_lines():
    offenders = [
        f"grpo_pilot/{rel}:{line}: {name} has {length} lines"
        for rel, path in _modules()
        for name, line, length in function_lines(path)
        if length > MAX_FUNCTION_LINES
    ]
    assert not offenders, f"split these into helpers of ≤ {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


def test_no_function_takes_more_than_4_positional_parameters():
    offenders, used = [], set()
    for rel, path in _modules():
        for name, line, names in positional_parameters(path):
            if len(names) <= MAX_POSITIONAL:
                continue
            if (rel, name) in POSITIONAL_ALLOWED:
                used.add((rel, name))
            else:
                offenders.append(f"grpo_pilot/{rel}:{line}: {name}({', '.join(names)})")
    assert not offenders, "make the parameters past the 4th keyword-only (`*,`):\n" + "\n".join(offenders)
    assert used == set(POSITIONAL_ALLOWED), (
        f"allow-list entries no longer needed: {sorted(set(POSITIONAL_ALLOWED) - used)}"
    )


def test_the_walk_counts_lines_and_positional_parameters(tmp_path):
    sample = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    sample.write_text(
        f"def long():\n{body}\n\n"
        "def five(a, b, c, d, e):\n    return a\n\n"
        "def keyword(a, b, c, d, *, e):\n    return a\n\n"
        "class C:\n    def method(self, a, b, c, d, e=1):\n        return a\n\n"
        "    @classmethod\n    def make(cls, a, b, c, d):\n        return a\n"
    )
    assert [(name, length) for name, _, length in function_lines(sample)] == [
        ("long", 81),
        ("five", 2),
        ("keyword", 2),
        ("method", 2),
        ("make", 2),
    ]
    too_many = [name for name, _, names in positional_parameters(sample) if len(names) > MAX_POSITIONAL]
    assert too_many == ["five", "method"]
