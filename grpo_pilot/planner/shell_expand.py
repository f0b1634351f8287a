"""Bash word expansion for `shell_words.py`: quote removal, parameters, arithmetic, field splitting.

What is expanded as bash does (bash(1), EXPANSION): `$NAME`, `${NAME}`, positional parameters (`$1`,
`${10}`, `$#`, `$@`, `"$@"`, `$*`, `${@:2}`), arrays (`${A[@]}`, `${A[i]}`), `${N:-d}` `${N-d}` `${N:=d}`
`${N:+a}` `${N#p}` `${N##p}` `${N%p}` `${N%%p}` `${N/p/r}` `${N//p/r}` `${#N}` `${N:off:len}` `${N^^}`
`${N,,}`, `$((arithmetic))` (64-bit integers that wrap, as bash's), and unquoted expansions split into
fields at blanks. Command substitution is never run: `$(expr A + B)` (and backquotes) over integers is
evaluated, `$(echo words)` gives its words; any other `$(...)` expands to nothing and is reported.
Unset parameters expand to nothing and are reported. A value may not grow past `MAX_VALUE_CHARS`
(`A=$A$A` forty times would otherwise take a terabyte).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from typing import Callable, Mapping

from grpo_pilot.errors import InputError
from grpo_pilot.planner.shell_lex import skip_backquote, skip_balanced, skip_double, skip_single, tokenize

MAX_VALUE_CHARS = 1 << 20  # 1 MiB: launch scripts hold values of a few hundred characters
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PARAM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])(\[[^\]]*\])?")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]")
_EXPR_NUMBER = re.compile(r"^-?[0-9]+$")
MAX_PATTERN_VALUE_CHARS = 4096  # `${v#pattern}` on longer values: glob matching is quadratic
_WRAP = 1 << 64


def _signed(value: int) -> int:
    """Bash arithmetic is 64-bit two's complement: results wrap."""
    value %= _WRAP
    return value - _WRAP if value >= 1 << 63 else value


def _truncating_div(left: int, right: int, expr: str, mod: bool) -> int:
    if right == 0:
        raise InputError(f"$(({expr})) divides by zero.", "Fix the script.")
    quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
    return left - quotient * right if mod else quotient


def _binary(op: ast.AST, left: int, right: int, expr: str) -> int:
    if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)):  # bash truncates toward zero
        return _truncating_div(left, right, expr, isinstance(op, ast.Mod))
    if isinstance(op, ast.Pow):
        if right < 0:
            raise InputError(f"$(({expr})) has a negative exponent.", "Fix the script.")
        return pow(left, right, _WRAP)
    if isinstance(op, (ast.LShift, ast.RShift)):
        shift = right & 63  # the shift count is taken modulo 64, as on the machines bash runs on
        return left << shift if isinstance(op, ast.LShift) else left >> shift
    table: dict[type, Callable[[int, int], int]] = {
        ast.Add: lambda a, b: a + b,
        ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b,
        ast.BitAnd: lambda a, b: a & b,
        ast.BitOr: lambda a, b: a | b,
        ast.BitXor: lambda a, b: a ^ b,
    }
    return table[type(op)](left, right)


_COMPARE: dict[type, Callable[[int, int], bool]] = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
}
_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
_BINOPS += (ast.BitAnd, ast.BitOr, ast.BitXor)


def arithmetic(expr: str, variables: Mapping[str, str]) -> int:
    """Evaluate bash `$(( ))` integer arithmetic over integers and variables (64-bit, wrapping).

    + - * / % ** << >> & | ^ ~ ! && || comparisons and parentheses; `/` and `%` truncate toward zero."""

    def name_value(name: str) -> int:
        raw = (variables.get(name, "0") or "0").strip()
        try:
            return _signed(int(raw, 0) if raw.lower().startswith("0x") else int(raw))
        except ValueError:
            raise InputError(f"$(({expr})): '{name}' is '{raw[:80]}', not an integer.", "Fix the script.") from None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return _signed(node.value)
        if isinstance(node, ast.Name):
            return name_value(node.id)
        if isinstance(node, ast.UnaryOp):
            v = value(node.operand)
            ops = {ast.USub: -v, ast.UAdd: v, ast.Invert: ~v, ast.Not: int(not v)}
            return _signed(ops[type(node.op)])
        if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
            return _signed(_binary(node.op, value(node.left), value(node.right), expr))
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            left, result = value(node.left), True
            for op, comparator in zip(node.ops, node.comparators):
                right = value(comparator)
                result, left = result and _COMPARE[type(op)](left, right), right
            return int(result)
        if isinstance(node, ast.BoolOp):
            values = [bool(value(v)) for v in node.values]
            return int(all(values) if isinstance(node.op, ast.And) else any(values))
        raise InputError(f"$(({expr[:200]})) is not integer arithmetic this reader understands.", "Simplify it.")

    text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
    branches = _ternary(text)
    if branches:  # `c ? a : b`, the lowest precedence: split at the top level, evaluate the chosen side
        condition, yes, no = branches
        return arithmetic(yes if arithmetic(condition, variables) else no, variables)
    text = text.replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"!(?!=)", " not ", text)
    try:
        tree = ast.parse(text.strip() or "0", mode="eval")
        return value(tree)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise InputError(f"$(({expr[:200]})) is not valid arithmetic (or nests too deep).", "Fix the script.") from None


def _ternary(text: str) -> tuple[str, str, str] | None:
    """(condition, then, else) of a top-level `c ? a : b`, or None."""
    depth, question, pending = 0, -1, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth:
            continue
        if ch == "?":
            if question < 0:
                question = i
            else:
                pending += 1
        elif ch == ":" and question >= 0:
            if pending == 0:
                return text[:question], text[question + 1 : i], text[i + 1 :]
            pending -= 1
    return None


def trim(value: str, op: str, pattern: str) -> str:
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


def _ansi(body: str) -> str:
    """The text of a `$'...'` string (the common escapes)."""
    escapes = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"', "r": "\r", "0": "\0", "e": "\x1b"}
    out, i = [], 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            out.append(escapes.get(body[i + 1], "\\" + body[i + 1]))
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


class _Fields:
    """Fields being built: each a list of (text, splittable) segments; `quoted` marks a quoted part."""

    def __init__(self) -> None:
        self.fields: list[list[tuple[str, bool]]] = [[]]
        self.quoted = False
        self.size = 0

    def add(self, text: str, splittable: bool) -> None:
        self.size += len(text)
        if self.size > MAX_VALUE_CHARS:
            raise InputError(
                f"A word of the script expands past {MAX_VALUE_CHARS >> 20} MiB (a value that doubles itself, "
                "such as A=$A$A repeated, grows without bound).",
                "Fix the script: launch scripts hold values of a few hundred characters.",
            )
        self.fields[-1].append((text, splittable))

    def separate(self, words: list[str], splittable: bool) -> None:
        """`"$@"`: each word its own field, the first joined to what precedes, the last to what follows."""
        for k, word in enumerate(words):
            if k:
                self.fields.append([])
            self.add(word, splittable)

    def split(self) -> list[str]:
        """The final fields: unquoted expansions split at blanks; an empty unquoted expansion is no field."""
        out: list[str] = []
        for segments in self.fields:
            current: list[str] = []
            started = False  # a field is in progress (a quoted part, even empty, starts one)
            for text, splittable in segments:
                if not splittable:
                    current.append(text)
                    started = True
                    continue
                for k, part in enumerate(re.split(r"[ \t\n]+", text)):
                    if k and started:
                        out.append("".join(current))
                    if k:
                        current, started = [], False
                    if part:
                        current.append(part)
                        started = True
            if started:
                out.append("".join(current))
        return out

    def joined(self) -> str:
        return " ".join("".join(t for t, _ in segments) for segments in self.fields)


class Expander:
    """The shell's parameters (variables, arrays, positional) and word expansion over them."""

    def __init__(self, variables: dict[str, str], positional: list[str] | None = None) -> None:
        self.variables = variables
        self.arrays: dict[str, list[str]] = {}
        self.positional = list(positional or [])
        self.unset: list[str] = []
        self.substitutions: list[str] = []

    # ---- parameters ----
    def assign(self, name: str, value: str) -> None:
        if len(value) > MAX_VALUE_CHARS:
            raise InputError(
                f"The script's variable {name} grows past {MAX_VALUE_CHARS >> 20} MiB.",
                "Fix the script: launch scripts hold values of a few hundred characters.",
            )
        self.variables[name] = value
        self.arrays.pop(name, None)

    def assign_array(self, name: str, values: list[str], append: bool = False) -> None:
        values = (self.arrays.get(name, []) if append else []) + values
        if sum(map(len, values)) > MAX_VALUE_CHARS:
            raise InputError(f"The script's array {name} grows past 1 MiB.", "Fix the script.")
        self.arrays[name] = values
        self.variables[name] = values[0] if values else ""

    def param(self, name: str, index: str | None = None) -> str | list[str] | None:
        """The value of a parameter (a list for `@`, `*` and `NAME[@]`), None when unset."""
        if name in ("@", "*"):
            return list(self.positional)
        if name == "#":
            return str(len(self.positional))
        if name.isdigit():
            k = int(name)
            if k == 0:
                return "script"
            return self.positional[k - 1] if k <= len(self.positional) else None
        if name in ("?", "$", "!", "-"):
            return "0" if name == "?" else ""
        if index is not None:
            items = self.arrays.get(name, [self.variables[name]] if name in self.variables else [])
            if index in ("@", "*"):
                return list(items)
            try:
                k = arithmetic(self.string(index), self.variables)
            except InputError:
                return None
            return items[k] if -len(items) <= k < len(items) else None
        return self.variables.get(name)

    def lookup(self, name: str, index: str | None = None) -> str | list[str]:
        value = self.param(name, index)
        if value is None:
            if _NAME.fullmatch(name) and name not in self.unset:
                self.unset.append(name)
            return ""
        return value

    # ---- words ----
    def fields(self, raw: str) -> list[str]:
        """The fields of one raw word (quotes removed, expanded, unquoted expansions split at blanks)."""
        out = _Fields()
        self._word(raw, out)
        return out.split()

    def string(self, raw: str) -> str:
        """One raw word expanded without field splitting (assignment values, case words, `[[ ]]`)."""
        out = _Fields()
        self._word(raw, out)
        return out.joined()

    def _word(self, raw: str, out: _Fields) -> None:
        i = 0
        while i < len(raw):
            ch = raw[i]
            if ch == "\\":
                if not raw.startswith("\\\n", i):
                    out.add(raw[i + 1 : i + 2], False)
                i += 2
            elif ch == "'":
                j = skip_single(raw, i)
                out.add(raw[i + 1 : j - 1], False)
                out.quoted, i = True, j
            elif raw.startswith("$'", i):
                j = skip_single(raw, i + 1)
                out.add(_ansi(raw[i + 2 : j - 1]), False)
                out.quoted, i = True, j
            elif ch == '"':
                j = skip_double(raw, i)
                self._double(raw[i + 1 : j - 1], out)
                out.quoted, i = True, j
            elif ch == "$":
                i = self._dollar(raw, i, out, quoted=False)
            elif ch == "`":
                j = skip_backquote(raw, i)
                out.add(self.substitute(raw[i + 1 : j - 1], raw[i:j]), True)
                i = j
            else:
                out.add(ch, False)
                i += 1

    def _double(self, inner: str, out: _Fields) -> None:
        i = 0
        while i < len(inner):
            ch = inner[i]
            if ch == "\\" and i + 1 < len(inner) and inner[i + 1] in '$`"\\\n':
                if inner[i + 1] != "\n":
                    out.add(inner[i + 1], False)
                i += 2
            elif ch == "$":
                i = self._dollar(inner, i, out, quoted=True)
            elif ch == "`":
                j = skip_backquote(inner, i)
                out.add(self.substitute(inner[i + 1 : j - 1], inner[i:j]), False)
                i = j
            else:
                out.add(ch, False)
                i += 1

    def _dollar(self, text: str, i: int, out: _Fields, quoted: bool) -> int:
        """Expand the `$...` at text[i] into `out`; returns the index after it."""
        if text.startswith("$((", i):
            j = skip_balanced(text, i + 1, "(", ")")
            out.add(str(self.arith(text[i + 3 : j - 2])), not quoted)
            return j
        if text.startswith("$(", i):
            j = skip_balanced(text, i + 1, "(", ")")
            out.add(self.substitute(text[i + 2 : j - 1], text[i:j]), not quoted)
            return j
        if text.startswith("${", i):
            j = skip_balanced(text, i + 1, "{", "}")
            self._brace(text[i + 2 : j - 1], out, quoted)
            return j
        match = _PLAIN.match(text, i + 1)  # `$10` is `${1}0`, `$a[0]` is `$a` then the text `[0]`
        if not match:
            out.add("$", False)
            return i + 1
        self._put(self.lookup(match.group(0)), match.group(0), out, quoted)
        return match.end()

    def _put(self, value: str | list[str], name: str, out: _Fields, quoted: bool) -> None:
        if isinstance(value, list):
            if quoted and name.endswith("*"):
                out.add(" ".join(value), False)
            else:
                out.separate(value, not quoted)
        else:
            out.add(value, not quoted)

    def _brace(self, body: str, out: _Fields, quoted: bool) -> None:
        if body.startswith("#") and len(body) > 1:  # ${#NAME}: length (${#} alone is $#)
            value = self.lookup(*self._split_param(body[1:])[:2])
            out.add(str(len(value)), not quoted)
            return
        if body.startswith("!") and _NAME.fullmatch(body[1:]):  # ${!NAME}: indirection
            target = self.lookup(body[1:])
            out.add(self.variables.get(target, "") if isinstance(target, str) else "", not quoted)
            return
        name, index, rest = self._split_param(body)
        if not name:
            raise InputError(f"Bad substitution ${{{body[:80]}}} in the script.", "Fix the script.")
        label = name + ("[@]" if index in ("@", "*") else "")
        self._put(self._operate(name, index, rest), label, out, quoted)

    def _split_param(self, body: str) -> tuple[str, str | None, str]:
        match = _PARAM.match(body)
        if not match:
            return "", None, body
        index = match.group(2)[1:-1] if match.group(2) else None
        return match.group(1), index, body[match.end() :]

    def _operate(self, name: str, index: str | None, rest: str) -> str | list[str]:
        """The `${name<rest>}` operators (module docstring)."""
        current = self.param(name, index)
        for op in (":-", ":=", ":+", ":?", "-", "=", "+", "?"):
            if rest.startswith(op):
                empty = current is None or (op.startswith(":") and current in ("", []))
                word = rest[len(op) :]
                if op.endswith("+"):
                    return "" if empty else self.string(word)
                if not empty:
                    return current  # type: ignore[return-value]
                if op.endswith("?"):
                    raise InputError(f"The script requires ${{{name}}}: {self.string(word)}", "Set it (--override).")
                default = self.string(word)
                if op.endswith("=") and _NAME.fullmatch(name):
                    self.assign(name, default)
                return default
        value = self.lookup(name, index)
        if not rest:
            return value
        if isinstance(value, list):
            if rest.startswith(":"):  # ${@:offset:length}
                start, _, length = rest[1:].partition(":")
                offset = arithmetic(self.string(start), self.variables) - (1 if name in ("@", "*") else 0)
                end = None if not length else max(offset, 0) + arithmetic(self.string(length), self.variables)
                return value[max(offset, 0) : end]
            return [self._string_op(v, rest) for v in value]
        return self._string_op(value, rest)

    def _string_op(self, value: str, rest: str) -> str:
        if len(value) > MAX_PATTERN_VALUE_CHARS and rest[:1] in ("#", "%", "/"):
            raise InputError(
                f"${{...{rest[:40]}}} applies a pattern to a value of {len(value)} characters.",
                "Fix the script: launch scripts hold values of a few hundred characters.",
            )
        for op in ("##", "#", "%%", "%"):
            if rest.startswith(op):
                return trim(value, op, self.string(rest[len(op) :]))
        if rest.startswith("/"):
            every = rest.startswith("//")
            pattern, _, replacement = rest[2 if every else 1 :].partition("/")
            return _replace(value, self.string(pattern), self.string(replacement), every)
        if rest in ("^^", ",,", "^", ","):
            return value.upper() if rest.startswith("^") else value.lower()
        if rest.startswith(":"):
            start, _, length = rest[1:].partition(":")
            offset = arithmetic(self.string(start), self.variables)
            offset = max(len(value) + offset, 0) if offset < 0 else offset
            return (
                value[offset : offset + arithmetic(self.string(length), self.variables)] if length else value[offset:]
            )
        raise InputError(f"Unsupported expansion operator '{rest[:40]}' in the script.", "Simplify the script.")

    def arith(self, expr: str) -> int:
        """`$((expr))`: parameter expansions inside first (`$1`, `$#`, `${x}`), then the arithmetic."""
        return arithmetic(self.string(expr), self.variables)

    # ---- command substitution: never run ----
    def substitute(self, inner: str, whole: str) -> str:
        """`$(expr ...)` over integers and `$(echo ...)` are evaluated; anything else expands to nothing."""
        tokens = tokenize(inner)
        words: list[str] = []
        if all(t.kind in ("word", "eof") for t in tokens):
            for token in tokens[:-1]:
                words += self.fields(token.text)
        value = None
        if words and words[0] == "expr" and _integer_expression(words[1:]):
            value = str(arithmetic(" ".join(words[1:]), {}))
        elif words and words[0] == "echo":
            args = words[1:]
            while args and args[0] in ("-n", "-e", "-E"):
                args = args[1:]
            value = " ".join(args)
        if value is None:
            if whole[:200] not in self.substitutions:
                self.substitutions.append(whole[:200])
            return ""
        return value


def _integer_expression(args: list[str]) -> bool:
    """`expr` arguments that are integer arithmetic: numbers joined by + - * / %, with parentheses."""
    core = [a for a in args if a not in ("(", ")")]
    if not core or len(core) % 2 == 0 or args.count("(") != args.count(")"):
        return False
    return all(_EXPR_NUMBER.match(a) if k % 2 == 0 else a in ("+", "-", "*", "/", "%") for k, a in enumerate(core))


def _replace(value: str, pattern: str, replacement: str, every: bool) -> str:
    """`${v/p/r}` and `${v//p/r}` (glob pattern, longest match at each position)."""
    out, i = [], 0
    while i < len(value):
        match = next((j for j in range(len(value), i, -1) if fnmatch.fnmatchcase(value[i:j], pattern)), None)
        if match is None:
            out.append(value[i])
            i += 1
            continue
        out.append(replacement)
        i = match
        if not every:
            out.append(value[i:])
            break
    return "".join(out)
