"""Just enough of bash to read a launch script as published: words of each command, variables expanded.

What it understands (what verl's example and tuning scripts use): line continuations, comments, single
and double quotes, `NAME=value` / `export NAME=value` assignments, `$NAME`, `${NAME}`, `${NAME:-default}`,
`${NAME:=default}`, `${NAME#pat}`/`##`/`%`/`%%` pattern trimming, `$((arithmetic))` over integers and
variables, and command separators (`;`, `&&`, `||`, `|`, redirections end a command's words). Control
flow (`if`/`for`) is not evaluated: statements run top to bottom. Command substitution `$(...)` is not
run; it expands to nothing and is reported. Unset variables expand to nothing, as in bash, and are
reported too.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import re
from typing import Mapping, NamedTuple

from grpo_pilot.errors import InputError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


class Command(NamedTuple):
    """One simple command: its words (expanded), the environment assignments in front of it."""

    words: tuple[str, ...]
    env: dict[str, str]
    line: int


class Script(NamedTuple):
    commands: tuple[Command, ...]
    variables: dict[str, str]
    unset: tuple[str, ...]  # variables used but never set (expanded to nothing)
    substitutions: tuple[str, ...]  # $(...) command substitutions left unexpanded


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,  # bash arithmetic is integer arithmetic
    ast.Mod: operator.mod,
}


def arithmetic(expr: str, variables: Mapping[str, str]) -> int:
    """Evaluate bash `$(( ))` integer arithmetic: + - * / % and parentheses over integers and variables."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            raw = variables.get(node.id, "0") or "0"
            try:
                return int(raw)
            except ValueError:
                raise InputError(f"$(({expr})): '{node.id}' is '{raw}', not an integer.", "Fix the script.") from None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Div, ast.Mod)) and right == 0:
                raise InputError(f"$(({expr})) divides by zero.", "Fix the script.")
            if isinstance(node.op, ast.Div):  # bash truncates toward zero
                return int(left / right)
            return _BINARY[type(node.op)](left, right)
        raise InputError(f"$(({expr})) is not integer arithmetic this reader understands.", "Simplify the expression.")

    text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise InputError(f"$(({expr})) is not valid arithmetic.", "Fix the script.") from None
    return value(tree)


def _trim(value: str, op: str, pattern: str) -> str:
    """`${v#p}` / `##` (prefix, shortest / longest) and `%` / `%%` (suffix) with glob patterns."""
    n = len(value)
    if op in ("#", "##"):
        cuts = range(0, n + 1) if op == "#" else range(n, -1, -1)
        for i in cuts:
            if fnmatch.fnmatchcase(value[:i], pattern):
                return value[i:]
        return value
    cuts = range(n, -1, -1) if op == "%" else range(0, n + 1)
    for i in cuts:
        if fnmatch.fnmatchcase(value[i:], pattern):
            return value[:i]
    return value


class _Expander:
    def __init__(self, variables: dict[str, str]) -> None:
        self.variables = variables
        self.unset: list[str] = []
        self.substitutions: list[str] = []

    def lookup(self, name: str) -> str:
        if name in self.variables:
            return self.variables[name]
        if name not in self.unset and name not in ("@", "*"):
            self.unset.append(name)
        return ""

    def brace(self, body: str) -> str:
        match = _NAME.match(body)
        if not match:
            return ""
        name, rest = match.group(0), body[match.end() :]
        current = self.variables.get(name)
        if not rest:
            return self.lookup(name)
        for op in (":-", ":=", "-", "="):
            if rest.startswith(op):
                default = self.expand(rest[len(op) :])
                if current is None or (op.startswith(":") and current == ""):
                    if "=" in op:
                        self.variables[name] = default
                    return default
                return current
        for op in ("##", "#", "%%", "%"):
            if rest.startswith(op):
                return _trim(self.lookup(name), op, self.expand(rest[len(op) :]))
        return self.lookup(name)

    def dollar(self, text: str, i: int) -> tuple[str, int]:
        """Expand the `$...` starting at text[i]; returns (expansion, index after it)."""
        if text.startswith("$((", i):
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                if depth == 0:
                    break
                j += 1
            inner = text[i + 3 : j - 1]
            return str(arithmetic(inner, self.variables)), j + 1
        if text.startswith("$(", i):
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                if depth == 0:
                    break
                j += 1
            self.substitutions.append(text[i : j + 1])
            return "", j + 1
        if text.startswith("${", i):
            depth, j = 0, i + 1
            while j < len(text):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    break
                j += 1
            return self.brace(text[i + 2 : j]), j + 1
        match = _NAME.match(text, i + 1)
        if match:
            return self.lookup(match.group(0)), match.end()
        if i + 1 < len(text) and text[i + 1] in "@*#?0123456789":
            return "", i + 2
        return "$", i + 1

    def expand(self, text: str) -> str:
        """Expand variables in a fragment (no word splitting, quotes already removed)."""
        out, i = [], 0
        while i < len(text):
            if text[i] == "$":
                piece, i = self.dollar(text, i)
                out.append(piece)
            else:
                out.append(text[i])
                i += 1
        return "".join(out)


def _words(line: str, ex: _Expander) -> list[str]:
    """Split one logical line into words: quotes removed, variables expanded, operators as their own words."""
    words: list[str] = []
    cur: list[str] = []
    have = False  # a word is in progress
    quoted = False  # it has a quoted part (an empty quoted word is a word; an empty expansion is none)
    i = 0

    def flush() -> None:
        text = "".join(cur)
        if text or quoted:
            words.append(text)

    while i < len(line):
        ch = line[i]
        if ch in " \t":
            if have:
                flush()
                cur, have, quoted = [], False, False
            i += 1
        elif ch == "#" and not have:
            break
        elif ch == "'":
            j = line.find("'", i + 1)
            if j < 0:
                raise InputError(f"Unterminated single quote in: {line.strip()[:80]}", "Fix the script's quoting.")
            cur.append(line[i + 1 : j])
            have, quoted, i = True, True, j + 1
        elif ch == '"':
            j, buf = i + 1, []
            while j < len(line) and line[j] != '"':
                if line[j] == "\\" and j + 1 < len(line) and line[j + 1] in '"$\\`':
                    buf.append(line[j + 1])
                    j += 2
                elif line[j] == "$":
                    piece, j = ex.dollar(line, j)
                    buf.append(piece)
                else:
                    buf.append(line[j])
                    j += 1
            if j >= len(line):
                raise InputError(f"Unterminated double quote in: {line.strip()[:80]}", "Fix the script's quoting.")
            cur.append("".join(buf))
            have, quoted, i = True, True, j + 1
        elif ch == "\\" and i + 1 < len(line):
            cur.append(line[i + 1])
            have, i = True, i + 2
        elif ch == "$":
            piece, i = ex.dollar(line, i)
            cur.append(piece)
            have = True
        elif ch in ";|&<>":
            if have and not (ch in "<>" and "".join(cur).isdigit()):  # `2>`: the digits name a descriptor
                flush()
            cur, have, quoted = [], False, False
            j = i + 1
            while j < len(line) and line[j] in ";|&<>":
                j += 1
            words.append(line[i:j])
            i = j
        else:
            cur.append(ch)
            have = True
            i += 1
    if have:
        flush()
    return words


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with backslash-newline continuations joined, numbered by their first physical line."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not buf:
            start = number
        stripped = raw.rstrip()
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            buf.append(stripped[:-1] + " ")
            continue
        buf.append(raw)
        out.append((start, "".join(buf)))
        buf = []
    if buf:
        out.append((start, "".join(buf)))
    return out


def read_script(text: str, environment: Mapping[str, str] | None = None) -> Script:
    """Run the script's assignments top to bottom and return every command's expanded words."""
    ex = _Expander(dict(environment or {}))
    commands: list[Command] = []
    for number, line in _logical_lines(text):
        words = _words(line, ex)
        segment: list[str] = []
        for word in words + [";"]:
            if word and set(word) <= set(";|&"):
                _statement(segment, ex, commands, number)
                segment = []
            else:
                segment.append(word)
    return Script(tuple(commands), dict(ex.variables), tuple(ex.unset), tuple(ex.substitutions))


def _statement(words: list[str], ex: _Expander, commands: list[Command], number: int) -> None:
    if not words:
        return
    if words[0] in ("export", "declare", "local", "readonly"):
        for word in words[1:]:
            match = _ASSIGNMENT.match(word)
            if match:
                ex.variables[match.group(1)] = match.group(2)
        return
    env: dict[str, str] = {}
    i = 0
    while i < len(words):
        match = _ASSIGNMENT.match(words[i])
        if not match:
            break
        env[match.group(1)] = match.group(2)
        i += 1
    rest = words[i:]
    # a redirection ends the command's words (`| tee log`, `> out.log 2>&1`)
    for j, word in enumerate(rest):
        if word.startswith(("<", ">")) or re.fullmatch(r"\d*>+&?\d*", word):
            rest = rest[:j]
            break
    if not rest:  # plain assignments
        ex.variables.update(env)
        return
    commands.append(Command(tuple(rest), env, number))
