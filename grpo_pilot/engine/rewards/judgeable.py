"""Which test shapes the parent can judge from reported values alone, and why the others cannot be.

The sandbox runs the completion's code and the test in one process, so anything that process says
about *control flow* ("the test finished", "this branch was not taken", "nothing raised") can be
forged by the code. The parent therefore judges a test only by its asserts, evaluated here on the
values the sandbox reports, and only where those asserts decide the test:

1. the test has at least one assert;
2. every assert runs unconditionally — not under if/elif/else, for, while, try/except/else/finally
   or match (a top-level `if __name__ == "__main__":` guard is unwrapped before this check: its body
   is the test); an assert at the top level of a function the test defines (HumanEval's
   `def check(candidate)`) counts as unconditional and must report at least once;
3. the test has no `raise` statement (a failure only the code's own report could show);
4. every comparison of an assert has a side made of the test's literals only (`f(2) == 5`,
   `0 < f(3) <= 8`), so the expected value stays in the parent; a condition with no comparison
   (`assert is_even(2)`, `assert not f(3)`) is judged on the truth of the reported value;
5. no comparison runs in the sandbox: none inside a reported sub-expression
   (`assert all(f(x) == y for ...)`) and none in what defines a name an assert reports
   (`ok = f(1) == 2` then `assert ok`).

`problems(tree, asserts)` lists what breaks these rules for one rewritten test. The rules are pure
functions of the test's syntax tree: no value of the code's making is involved.
"""

from __future__ import annotations

import ast
from typing import Iterable, Sequence

CONDITIONAL_STATEMENTS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try) + (
    (ast.Match,) if hasattr(ast, "Match") else ()
)
if hasattr(ast, "TryStar"):
    CONDITIONAL_STATEMENTS += (ast.TryStar,)


def is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` (either operand order), with no else branch."""
    if not isinstance(node, ast.If) or node.orelse:
        return False
    test = node.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


def unwrap_main_guard(tree: ast.Module) -> ast.Module:
    """The test with its top-level `if __name__ == "__main__":` blocks replaced by their bodies.

    The sandbox runs tests in the solution's namespace (`__name__` is "solution"), where such a
    block would never run; the parent removes the guard, so its asserts run and are required."""
    body: list[ast.stmt] = []
    for statement in tree.body:
        body.extend(statement.body if is_main_guard(statement) else [statement])
    tree.body = body
    return tree


def _has_compare(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Compare) for n in ast.walk(node))


def _bound_names(target: ast.AST) -> Iterable[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id


def compared_names(tree: ast.AST) -> set[str]:
    """Names the test binds to something that holds a comparison (an assignment's value, a function
    or class body): what such a name holds was decided in the sandbox."""
    tainted: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            if _has_compare(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    tainted.update(_bound_names(target))
        elif isinstance(node, ast.NamedExpr) and _has_compare(node.value):
            tainted.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            body = node.body if isinstance(node.body, list) else [node.body]
            if any(_has_compare(statement) for statement in body):
                if not isinstance(node, ast.Lambda):
                    tainted.add(node.name)
    return tainted


def _reads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _literal_only(node: ast.expr, placeholder: str) -> bool:
    """Whether `node` (a parent-side expression) uses no reported value."""
    return not any(isinstance(n, ast.Name) and n.id.startswith(placeholder) for n in ast.walk(node))


def condition_problem(condition: ast.expr, probes: Sequence[ast.expr], placeholder: str) -> str | None:
    """Why one assert (its parent-side condition and its reported sub-expressions) cannot be judged."""
    for node in ast.walk(condition):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for left, right in zip(operands, operands[1:]):
            if not (_literal_only(left, placeholder) or _literal_only(right, placeholder)):
                return (
                    f"it compares two values computed in the sandbox ({_show(left, probes, placeholder)} and "
                    f"{_show(right, probes, placeholder)}), where the code can change both; "
                    "write the expected value as a literal in the assert"
                )
    for probe in probes:
        if _has_compare(probe):
            return (
                f"the comparison in '{_clip(ast.unparse(probe))}' would run in the sandbox, where the code "
                "decides its outcome; write one assert per case comparing with a literal"
            )
    return None


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(node: ast.expr, probes: Sequence[ast.expr], placeholder: str) -> str:
    """The source of a parent-side expression with its placeholders put back."""

    class Restore(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.expr:
            if name.id.startswith(placeholder):
                return probes[int(name.id[len(placeholder) :])]
            return name

    return "'" + _clip(ast.unparse(Restore().visit(ast.parse(ast.unparse(node), mode="eval")).body)) + "'"


def statement_problems(tree: ast.Module, num_asserts: int, conditional_lines: Sequence[int]) -> list[str]:
    """Rules 1-3 for one test (`conditional_lines`: the lines of asserts found under a branch or loop)."""
    problems: list[str] = []
    if num_asserts == 0:
        problems.append(
            "it has no assert, so only the sandbox's own report could say it passed, and the code can forge that"
        )
    if conditional_lines:
        lines = ", ".join(str(n) for n in conditional_lines[:5])
        problems.append(
            f"the assert(s) on line(s) {lines} run only on some paths (under if/for/while/try/match), and the "
            "code decides which; write the asserts at the top level of the test or of a function it calls"
        )
    raises = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Raise)]
    if raises:
        problems.append(
            f"it fails by `raise` (line {raises[0]}), a failure only the sandbox's own report could show; "
            "use assert statements"
        )
    return problems


def tainted_probe_problem(tainted: set[str], probes: Iterable[ast.expr]) -> str | None:
    """Rule 5, second half: a reported sub-expression reads a name whose value a comparison decided."""
    for probe in probes:
        hit = sorted(_reads(probe) & tainted)
        if hit:
            text = _clip(ast.unparse(probe))
            where = f"'{hit[0]}'" if text == hit[0] else f"'{text}' uses '{hit[0]}', which"
            return (
                f"{where} is set by the test from a comparison run in the sandbox, where the code decides its "
                "outcome; compare the solution's value with a literal in the assert itself"
            )
    return None
