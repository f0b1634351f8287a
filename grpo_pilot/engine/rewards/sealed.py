"""Seal a record's assert tests: expected values stay in the parent, the sandbox only reports values.

`seal_tests(tests)` rewrites every `assert COND` of every test into `__grpo_probe__(ID, lambda: e1,
lambda: e2, ...)`. The e_k are the leaves of COND that the parent cannot evaluate itself (calls of the
solution, names, attributes, subscripts, comprehensions); everything above them stays here: literals,
`==`/`<`/`in`/`is`/... comparisons, `not`/`and`/`or`, arithmetic, tuple/list/set/dict displays and a
few pure built-ins (`TRUSTED_CALLS`). So `assert add(2, 3) == 5` sends `add(2, 3)` and keeps `== 5`;
`assert abs(f(x) - 3.14) < 1e-6` sends `f(x)` and keeps the rest; no comparison ever runs in the
sandbox. A top-level `if __name__ == "__main__":` guard is unwrapped first (the sandbox runs tests in
the solution's namespace, where the block would never run).

Tests whose outcome the parent cannot decide from reported values (`judgeable.py`: no assert, an
assert under a branch or loop, a `raise`, a comparison of two sandbox values) carry a `problem` and
never pass; the `code` reward refuses them before training (`test_problems`).

`judge(sealed, messages)` then decides each test from the harness's messages: a test passes when it
can be judged, every assert of it reported at least once, every report evaluates true here on values
decoded into plain data (no object of the code's making ever reaches a comparison), the harness said
the test ended and nothing said it failed. What the code can forge — an end-of-test message, a kill
before a failing assert reports — is never enough: each assert must report values that hold.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from grpo_pilot.engine.rewards import judgeable

PROBE_NAME = "__grpo_probe__"
PLACEHOLDER = "_grpo_value_"
MAX_SEQUENCE_ITEMS = 1_000_000  # results the parent builds from reported values (str * n, list * n)
MAX_INT_BITS = 1 << 16
MAX_DECODE_DEPTH = 66

TRUSTED_CALLS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": round,
    "len": len,
    "sorted": sorted,
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "list": list,
    "min": min,
    "max": max,
    "sum": sum,
    "all": all,
    "any": any,
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "math.isclose": math.isclose,
}
_BIN_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMP_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_UNARY_OPS: dict[type, Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
_SANDBOX_ONLY_ARGS = (ast.Starred, ast.GeneratorExp, ast.Lambda)


@dataclass(frozen=True)
class SealedAssert:
    """One assert: the condition the parent evaluates (placeholders `_grpo_value_K` for probe K)."""

    test: int
    condition: ast.expr


@dataclass(frozen=True)
class SealedTests:
    """The rewritten tests for the sandbox (None: did not parse, fails), the asserts kept here, and per
    test why it cannot be judged (None when it can)."""

    sources: tuple[str | None, ...]
    asserts: tuple[SealedAssert, ...]
    problems: tuple[str | None, ...]


class _Raised:
    """A probe whose sub-expression raised in the sandbox: using its value fails the assert."""


class _Opaque:
    """A value that is not plain data: equal only to itself, so it never matches an expected value."""


def _call_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


class _Splitter:
    """Split one assert condition into the parent's expression and the sandbox's leaf sub-expressions."""

    def __init__(self) -> None:
        self.probes: list[ast.expr] = []

    def split(self, node: ast.expr) -> ast.expr:
        """The expression for the parent: operators kept here, every other leaf replaced by a probe."""
        if isinstance(node, ast.Constant):
            return node
        children = self._children(node)
        if children is None:
            self.probes.append(node)
            return ast.Name(id=f"{PLACEHOLDER}{len(self.probes) - 1}", ctx=ast.Load())
        return self._rebuild(node, [self.split(child) for child in children])

    @staticmethod
    def _children(node: ast.expr) -> list[ast.expr] | None:
        """The operands of a node the parent can evaluate, or None when the sandbox must."""
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return None if any(isinstance(e, ast.Starred) for e in node.elts) else list(node.elts)
        if isinstance(node, ast.Dict):
            return None if any(k is None for k in node.keys) else [*node.keys, *node.values]  # type: ignore[list-item]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
            return [node.operand]
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
            return [node.left, node.right]
        if isinstance(node, ast.BoolOp):
            return list(node.values)
        if isinstance(node, ast.Compare):
            return [node.left, *node.comparators]
        if isinstance(node, ast.IfExp):
            return [node.test, node.body, node.orelse]
        if isinstance(node, ast.Call) and _call_name(node.func) in TRUSTED_CALLS:
            operands = [*node.args, *(k.value for k in node.keywords)]
            if any(k.arg is None for k in node.keywords) or any(isinstance(a, _SANDBOX_ONLY_ARGS) for a in operands):
                return None  # generators, key functions, *args: the call runs in the sandbox
            return operands
        return None

    @staticmethod
    def _rebuild(node: ast.expr, parts: list[ast.expr]) -> ast.expr:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return type(node)(elts=parts, **({"ctx": ast.Load()} if not isinstance(node, ast.Set) else {}))
        if isinstance(node, ast.Dict):
            half = len(parts) // 2
            return ast.Dict(keys=parts[:half], values=parts[half:])  # type: ignore[arg-type]
        if isinstance(node, ast.UnaryOp):
            return ast.UnaryOp(op=node.op, operand=parts[0])
        if isinstance(node, ast.BinOp):
            return ast.BinOp(left=parts[0], op=node.op, right=parts[1])
        if isinstance(node, ast.BoolOp):
            return ast.BoolOp(op=node.op, values=parts)
        if isinstance(node, ast.Compare):
            return ast.Compare(left=parts[0], ops=node.ops, comparators=parts[1:])
        if isinstance(node, ast.IfExp):
            return ast.IfExp(test=parts[0], body=parts[1], orelse=parts[2])
        assert isinstance(node, ast.Call)
        num_args = len(node.args)
        keywords = [ast.keyword(arg=k.arg, value=v) for k, v in zip(node.keywords, parts[num_args:])]
        return ast.Call(func=node.func, args=parts[:num_args], keywords=keywords)


class _Rewriter(ast.NodeTransformer):
    """Replace each assert of one test by a probe call; record the parent's side of it and what keeps
    it from being judged (judgeable.py)."""

    def __init__(self, test: int, first_id: int) -> None:
        self.test, self.next_id = test, first_id
        self.asserts: list[SealedAssert] = []
        self.probes: list[ast.expr] = []
        self.conditional_lines: list[int] = []
        self.condition_problems: list[str] = []
        self._conditional_depth = 0

    def generic_visit(self, node: ast.AST) -> ast.AST:
        conditional = isinstance(node, judgeable.CONDITIONAL_STATEMENTS)
        self._conditional_depth += conditional
        result = super().generic_visit(node)
        self._conditional_depth -= conditional
        return result

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        splitter = _Splitter()
        condition = splitter.split(node.test)
        self.asserts.append(SealedAssert(self.test, condition))
        self.probes.extend(splitter.probes)
        if self._conditional_depth:
            self.conditional_lines.append(node.lineno)
        problem = judgeable.condition_problem(condition, splitter.probes, PLACEHOLDER)
        if problem:
            self.condition_problems.append(f"the assert on line {node.lineno}: {problem}")
        thunks = [ast.Lambda(args=_no_args(), body=p) for p in splitter.probes]
        probe = ast.Name(id=PROBE_NAME, ctx=ast.Load())
        call = ast.Call(func=probe, args=[ast.Constant(self.next_id), *thunks], keywords=[])
        self.next_id += 1
        return ast.copy_location(ast.Expr(value=call), node)

    def problem(self, tree: ast.Module) -> str | None:
        """Why this (rewritten) test cannot be judged, or None."""
        problems = judgeable.statement_problems(tree, len(self.asserts), self.conditional_lines)
        problems += self.condition_problems
        tainted = judgeable.tainted_probe_problem(judgeable.compared_names(tree), self.probes)
        problems += [tainted] if tainted else []
        return "; ".join(problems) or None


def _no_args() -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])


def seal_tests(tests: Sequence[str]) -> SealedTests:
    """Rewrite `tests` for the sandbox and keep their assert conditions here (see the module docstring)."""
    sources: list[str | None] = []
    asserts: list[SealedAssert] = []
    problems: list[str | None] = []
    for index, test in enumerate(tests):
        try:
            tree = judgeable.unwrap_main_guard(ast.parse(test))
            rewriter = _Rewriter(index, len(asserts))
            tree = ast.fix_missing_locations(rewriter.visit(tree))
            source = ast.unparse(tree)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            sources.append(None)
            problems.append("it is not valid Python")
            continue
        sources.append(source)
        asserts.extend(rewriter.asserts)
        problems.append(rewriter.problem(tree))
    return SealedTests(sources=tuple(sources), asserts=tuple(asserts), problems=tuple(problems))


def unjudgeable_tests(tests: Sequence[str]) -> list[tuple[int, str]]:
    """(index, reason) for each test the parent cannot judge (see judgeable.py for the rules)."""
    sealed = seal_tests(tests)
    return [(i, p) for i, p in enumerate(sealed.problems) if p is not None]


def decode(value: Any, depth: int = 0) -> Any:
    """Plain data from the harness's tagged JSON (see `encode` there); unknown shapes are opaque."""
    if depth > MAX_DECODE_DEPTH:
        return _Opaque()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode(v, depth + 1) for v in value]
    if not isinstance(value, dict) or len(value) != 1:
        return _Opaque()
    ((tag, body),) = value.items()
    if tag == "r":
        return _Raised()
    if tag in ("t", "s", "fs") and isinstance(body, list):
        items = [decode(v, depth + 1) for v in body]
        maker: Callable[[list[Any]], Any] = {"t": tuple, "s": set, "fs": frozenset}[tag]
        try:
            return maker(items)
        except TypeError:  # unhashable items in a set
            return _Opaque()
    if tag == "d" and isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body):
        try:
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
        except TypeError:
            return _Opaque()
    if tag == "b" and isinstance(body, str):
        try:
            return bytes.fromhex(body)
        except ValueError:
            return _Opaque()
    if tag == "c" and isinstance(body, list) and len(body) == 2 and all(isinstance(x, (int, float)) for x in body):
        return complex(body[0], body[1])
    return _Opaque()


class _Evaluator:
    """Evaluate a sealed condition over decoded values, with bounds on what arithmetic may build."""

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = values

    def eval(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            value = self.values[int(node.id[len(PLACEHOLDER) :])]
            if isinstance(value, _Raised):
                raise ValueError("the sub-expression raised in the sandbox")
            return value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self.eval(e) for e in node.elts]
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            return {self.eval(k): self.eval(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
        if isinstance(node, ast.UnaryOp):
            return _UNARY_OPS[type(node.op)](self.eval(node.operand))
        if isinstance(node, ast.BinOp):
            return _bounded_binop(type(node.op), self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.BoolOp):
            return self._boolop(node)
        if isinstance(node, ast.Compare):
            left = self.eval(node.left)
            for op, comparator in zip(node.ops, node.comparators):
                right = self.eval(comparator)
                if not _CMP_OPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.eval(node.body) if self.eval(node.test) else self.eval(node.orelse)
        if isinstance(node, ast.Call):
            fn = TRUSTED_CALLS[_call_name(node.func) or ""]
            return fn(*[self.eval(a) for a in node.args], **{k.arg: self.eval(k.value) for k in node.keywords})
        raise ValueError(f"cannot evaluate {type(node).__name__}")

    def _boolop(self, node: ast.BoolOp) -> Any:
        value: Any = None
        for operand in node.values:
            value = self.eval(operand)
            if isinstance(node.op, ast.And) and not value:
                return value
            if isinstance(node.op, ast.Or) and value:
                return value
        return value


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 1


def _bounded_binop(op: type, left: Any, right: Any) -> Any:
    """`left op right`, refusing results that would take unbounded time or memory to build."""
    if op is ast.Mult and isinstance(left, int) != isinstance(right, int):
        count = left if isinstance(left, int) else right
        other = right if isinstance(left, int) else left
        if not isinstance(other, float) and count * _size(other) > MAX_SEQUENCE_ITEMS:
            raise ValueError("result too large")
    if op is ast.Pow and isinstance(left, int) and isinstance(right, int):
        if right > 0 and max(left.bit_length(), 1) * right > MAX_INT_BITS:
            raise ValueError("result too large")
    if isinstance(left, int) and isinstance(right, int) and max(left.bit_length(), right.bit_length()) > MAX_INT_BITS:
        raise ValueError("operands too large")
    return _BIN_OPS[op](left, right)


def holds(condition: ast.expr, values: Sequence[Any]) -> bool:
    """Whether the condition is true for these decoded values; any error (or a raised probe) is False."""
    try:
        return bool(_Evaluator(values).eval(condition))
    except Exception:  # noqa: BLE001 - a value of the wrong type, too large, a raised probe: the assert fails
        return False


def judge(sealed: SealedTests, messages: Sequence[dict[str, Any]]) -> tuple[bool, ...]:
    """One pass flag per test from the harness's messages (see the module docstring).

    Only two kinds of message can help a test: a probe (values, judged here) and the end-of-test
    message, which is necessary but never sufficient. Everything else can only fail it."""
    num_tests = len(sealed.sources)
    finished = [False] * num_tests
    failed = [False] * num_tests
    seen = [0] * len(sealed.asserts)
    for message in messages:
        kind = message.get("k")
        if kind == "test":
            index = message.get("i")
            if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < num_tests:
                if message.get("ok") is True:
                    finished[index] = True
                else:
                    failed[index] = True
        elif kind == "probe":
            assert_id, values = message.get("a"), message.get("v")
            if not isinstance(assert_id, int) or not 0 <= assert_id < len(sealed.asserts):
                continue
            check = sealed.asserts[assert_id]
            seen[assert_id] += 1
            if not isinstance(values, list) or not holds(check.condition, [decode(v) for v in values]):
                failed[check.test] = True
    for assert_id, check in enumerate(sealed.asserts):
        if not seen[assert_id]:
            failed[check.test] = True
    return tuple(
        finished[i] and not failed[i] and sealed.sources[i] is not None and sealed.problems[i] is None
        for i in range(num_tests)
    )
