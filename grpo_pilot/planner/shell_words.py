"""Just enough of bash to read a launch script as published: every command's words, variables expanded.

Nothing is ever run. The script is lexed (`shell_lex.py`: quotes and `$(...)` spanning lines,
continuations, comments, here-documents), parsed (`shell_parse.py`) and evaluated here over its own
variables and the arguments it was given (`args`, as in `bash train.sh --model_name X ...`):
- assignments (`A=1`, `export A=1`, `local`, `declare`, `A+=x`, arrays `A=(x y)`), prefix assignments of a
  command (its `env`), `unset`, `shift`, `set -- ...`;
- `if`/`elif`/`else`, `case`, `while`/`until`, `for`, `&&`/`||` are followed where their condition can be
  known: `[ ... ]`, `[[ ... ]]`, `test`, `(( ... ))`, `true`, `false` over the script's values
  (`shell_cond.py`) — this is what makes the common argument loop work:
  `while [[ $# -gt 0 ]]; do case $1 in --x) X="$2"; shift 2;; esac; done`;
- a condition that needs the machine (a file test, a command's status) cannot be known: an `if` then reads
  every branch in order (later assignments win), a loop body is read once, `exit` inside is ignored, each
  said in `notes`; a command that is not evaluated is taken to succeed in `&&` / `||` chains (published
  scripts are run on machines where their `cd dir || exit 1` succeeds);
- functions run when called, with their own positional parameters and `local` variables;
- `exit` stops the script (`exit_line`); `source` and `eval` are not followed (noted).
Expansions are `shell_expand.py`'s. Limits keep hostile input bounded: values (1 MiB), loop rounds,
commands evaluated, call and nesting depth.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Mapping, NamedTuple, Sequence

from grpo_pilot.errors import InputError
from grpo_pilot.planner.shell_cond import condition_status
from grpo_pilot.planner.shell_expand import Expander, arithmetic
from grpo_pilot.planner.shell_lex import skip_double, skip_single, tokenize
from grpo_pilot.planner.shell_parse import AndOr, Arith, Case, Cond, For, Function, Group, If, Loop, Simple, parse

__all__ = ["Command", "Script", "arithmetic", "read_script", "split_words"]

MAX_STEPS = 200_000  # commands evaluated in all (loops included)
MAX_ROUNDS = 10_000  # rounds of one loop before it is cut (with a note)
MAX_CALL_DEPTH = 64
MAX_COMMANDS = 10_000
MAX_RECORDED_CHARS = 64 << 20  # the words of every command kept, in all (a launch command is a few KiB)
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=(.*)$", re.S)
_DECLARE = ("export", "declare", "typeset", "local", "readonly")


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
    notes: tuple[str, ...] = ()  # what could not be evaluated, and what was done instead
    exit_line: int | None = None  # the line of the `exit` that ended the script, if one did


class _Exit(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _Return(Exception):
    """A `return` inside a sourced function body: unwinds to the function's caller."""


class _Jump(Exception):
    """`break` / `continue` out of `levels` loops."""

    def __init__(self, kind: str, levels: int) -> None:
        self.kind, self.levels = kind, levels


def _has_unquoted_glob(raw: str) -> bool:
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\":
            i += 2
        elif ch == "'":
            i = skip_single(raw, i)
        elif ch == '"':
            i = skip_double(raw, i)
        elif ch in "*?[":
            return True
        else:
            i += 1
    return False


class _Shell:
    def __init__(self, ex: Expander) -> None:
        self.ex = ex
        self.commands: list[Command] = []
        self.functions: dict[str, object] = {}
        self.notes: list[str] = []
        self.steps = 0
        self.recorded = 0  # characters of the recorded commands' words
        self.uncertain = 0  # > 0 while reading a branch whose condition cannot be known
        self.frames: list[dict[str, tuple[str | None, list[str] | None]]] = []  # `local` saves, per call

    def note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < 50:
            self.notes.append(text)

    # ---- lists ----
    def run_list(self, items: list) -> bool | None:
        status: bool | None = True
        for item in items:
            status = self.run_and_or(item)
        return status

    def run_and_or(self, node: AndOr) -> bool | None:
        status = self.run_pipeline(node.first)
        for op, pipeline in node.rest:
            succeeded = status is not False  # a command not evaluated is taken to succeed
            if (op == "&&") != succeeded:
                continue
            status = self.run_pipeline(pipeline)
        return status

    def run_pipeline(self, node) -> bool | None:
        if len(node.commands) == 1:
            status = self.run_command(node.commands[0])
        else:  # each element of a pipeline runs in a subshell: its assignments do not last
            saved = self._save()
            try:
                status = None
                for command in node.commands:
                    status = self.run_command(command)
            finally:
                self._restore(saved)
        return (None if status is None else not status) if node.negate else status

    def run_command(self, node) -> bool | None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise InputError(
                f"The script evaluates more than {MAX_STEPS} commands (a loop that does not end?).",
                "Fix the script, or pass the launch command alone.",
            )
        if isinstance(node, Simple):
            return self.run_simple(node)
        if isinstance(node, If):
            return self.run_if(node)
        if isinstance(node, Loop):
            return self.run_loop(node)
        if isinstance(node, For):
            return self.run_for(node)
        if isinstance(node, Case):
            return self.run_case(node)
        if isinstance(node, Group):
            return self.run_group(node)
        if isinstance(node, Cond):
            return condition_status([self.ex.string(w) for w in node.words], double=True)
        if isinstance(node, Arith):
            try:
                return self.ex.arith(node.expr) != 0
            except InputError:
                self.note(f"(( {node.expr.strip()[:60]} )) on line {node.line} is not evaluated")
                return None
        if isinstance(node, Function):
            self.functions[node.name] = node.body
            return True
        raise AssertionError(f"unknown node {node!r}")  # the parser makes no other node

    def _uncertainly(self, items: list) -> bool | None:
        self.uncertain += 1
        try:
            return self.run_list(items)
        finally:
            self.uncertain -= 1

    # ---- compound commands ----
    def run_if(self, node: If) -> bool | None:
        unknown = False
        for condition, body in node.clauses:
            status = self.run_list(condition) if not unknown else self._uncertainly(condition)
            if status is True and not unknown:
                return self.run_list(body)
            if status is not False:
                unknown = True
                self._uncertainly(body)
        if node.otherwise is not None:
            if unknown:
                self._uncertainly(node.otherwise)
            else:
                return self.run_list(node.otherwise)
        if unknown:
            self.note(f"the 'if' on line {node.line} has a condition that cannot be evaluated: every branch is read")
        return None if unknown else True

    def _body(self, body: list) -> str | None:
        """Run a loop body; 'break' / 'continue' when one leaves it, else None."""
        try:
            self.run_list(body)
        except _Jump as jump:
            if jump.levels > 1:
                jump.levels -= 1
                raise
            return jump.kind
        return None

    def run_loop(self, node: Loop) -> bool | None:
        for _ in range(MAX_ROUNDS):
            status = self.run_list(node.condition)
            if node.until and status is not None:
                status = not status
            if status is False:
                return True
            if status is None:
                self.note(
                    f"the loop on line {node.line} has a condition that cannot be evaluated: its body is read once"
                )
                self.uncertain += 1
                try:
                    self._body(node.body)
                finally:
                    self.uncertain -= 1
                return None
            before = self._save()
            if self._body(node.body) == "break":
                return True
            if self._save() == before:  # the next round would read the same: bash would loop forever here
                self.note(f"the loop on line {node.line} changes nothing it tests: read once")
                return None
        self.note(f"the loop on line {node.line} was cut after {MAX_ROUNDS} rounds")
        return None

    def run_for(self, node: For) -> bool | None:
        if node.arith is not None:
            self.note(f"the 'for ((...))' on line {node.line} is not evaluated: its body is read once")
            self.uncertain += 1
            try:
                self._body(node.body)
            finally:
                self.uncertain -= 1
            return None
        items = self.ex.positional if node.words is None else [f for w in node.words for f in self.ex.fields(w)]
        for item in items[:MAX_ROUNDS]:
            self.ex.assign(node.name, item)
            if self._body(node.body) == "break":
                break
        return True

    def run_case(self, node: Case) -> bool | None:
        word = self.ex.string(node.word)
        falling = False
        for patterns, body, terminator in node.arms:
            if falling or any(self._matches(word, p) for p in patterns):
                status = self.run_list(body)
                falling = terminator == ";&"
                if terminator == ";;":
                    return status
        return True

    def _matches(self, word: str, raw: str) -> bool:
        pattern = self.ex.string(raw)
        return fnmatch.fnmatchcase(word, pattern) if _has_unquoted_glob(raw) else word == pattern

    def run_group(self, node: Group) -> bool | None:
        if not node.subshell:
            return self.run_list(node.body)
        saved = self._save()
        try:
            return self.run_list(node.body)
        except _Exit:
            return None  # `exit` leaves the subshell only
        finally:
            self._restore(saved)

    def _save(self) -> tuple:
        ex = self.ex
        return dict(ex.variables), {k: list(v) for k, v in ex.arrays.items()}, list(ex.positional)

    def _restore(self, saved: tuple) -> None:
        variables, arrays, positional = saved
        self.ex.variables.clear()
        self.ex.variables.update(variables)
        self.ex.arrays = arrays
        self.ex.positional = positional

    # ---- simple commands ----
    def run_simple(self, node: Simple) -> bool | None:
        k = 0
        while k < len(node.words) and _ASSIGNMENT.match(node.words[k]):
            k += 1
        prefix, rest = node.words[:k], node.words[k:]
        fields = [f for raw in rest for f in self.ex.fields(raw)]
        if not fields:
            for raw in prefix:
                self.assign_raw(raw)
            return True
        name = fields[0]
        if name in _DECLARE:
            self.declare(name, rest[1:])
            return True
        builtin = self._builtin(name, fields[1:], node.line)
        if builtin is not NotImplemented:
            return builtin
        if name in self.functions:
            return self.call(name, fields[1:])
        if len(self.commands) >= MAX_COMMANDS:
            raise InputError(f"The script runs more than {MAX_COMMANDS} commands.", "Pass the launch command alone.")
        env = {}
        for raw in prefix:
            match = _ASSIGNMENT.match(raw)
            env[match.group(1)] = self.ex.string(match.group(4))  # type: ignore[union-attr]
        self.recorded += sum(map(len, fields))
        if self.recorded > MAX_RECORDED_CHARS:
            raise InputError(
                f"The script's commands expand to more than {MAX_RECORDED_CHARS >> 20} MiB of words.",
                "Pass the launch command alone.",
            )
        self.commands.append(Command(tuple(fields), env, node.line))
        return None

    def _builtin(self, name: str, args: list[str], line: int):
        """The builtins that change what the script reads; NotImplemented for any other command."""
        if name == "shift":
            count = int(args[0]) if args and args[0].isdigit() else 1
            if count > len(self.ex.positional):
                return False
            self.ex.positional = self.ex.positional[count:]
            return True
        if name == "set":
            if "--" in args:
                self.ex.positional = args[args.index("--") + 1 :]
            elif args and not args[0].startswith(("-", "+")):
                self.ex.positional = list(args)
            return True
        if name == "unset":
            for var in (a for a in args if not a.startswith("-")):
                self.ex.variables.pop(var, None)
                self.ex.arrays.pop(var, None)
            return True
        if name in ("[", "test"):
            return condition_status(args[:-1] if name == "[" and args[-1:] == ["]"] else args)
        if name in ("true", ":", "false"):
            return name != "false"
        if name in ("exit", "return", "break", "continue"):
            return self._jump(name, args, line)
        if name in (".", "source", "eval"):
            self.note(f"'{name}' on line {line} is not followed: what it sets is unknown here")
            return None
        return NotImplemented

    def _jump(self, name: str, args: list[str], line: int):
        if self.uncertain:
            self.note(f"'{name}' on line {line}, under a condition that cannot be evaluated, is ignored")
            return None
        if name == "exit":
            raise _Exit(line)
        if name == "return":
            raise _Return()
        raise _Jump(name, int(args[0]) if args and args[0].isdigit() else 1)

    def declare(self, builtin: str, raws: list[str]) -> None:
        for raw in raws:
            if _ASSIGNMENT.match(raw):
                name = _ASSIGNMENT.match(raw).group(1)  # type: ignore[union-attr]
                self._local(builtin, name)
                self.assign_raw(raw)
                continue
            for word in self.ex.fields(raw):
                if word.startswith(("-", "+")):
                    continue
                if _ASSIGNMENT.match(word):  # an assignment made by an expansion: `export $NAME=1`
                    self._local(builtin, _ASSIGNMENT.match(word).group(1))  # type: ignore[union-attr]
                    self.ex.assign(_ASSIGNMENT.match(word).group(1), _ASSIGNMENT.match(word).group(4))  # type: ignore
                elif builtin == "local" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", word):
                    self._local(builtin, word)
                    self.ex.variables.pop(word, None)

    def _local(self, builtin: str, name: str) -> None:
        if builtin == "local" and self.frames and name not in self.frames[-1]:
            self.frames[-1][name] = (self.ex.variables.get(name), self.ex.arrays.get(name))

    def assign_raw(self, raw: str) -> None:
        match = _ASSIGNMENT.match(raw)
        assert match is not None  # callers match first
        name, index, append, value_raw = match.groups()
        if value_raw.startswith("(") and value_raw.endswith(")") and not index:
            inner = [t.text for t in tokenize(value_raw[1:-1]) if t.kind == "word"]
            self.ex.assign_array(name, [f for w in inner for f in self.ex.fields(w)], append=bool(append))
            return
        value = self.ex.string(value_raw)
        if index:
            items = list(self.ex.arrays.get(name, [self.ex.variables[name]] if name in self.ex.variables else []))
            position = arithmetic(self.ex.string(index[1:-1]), self.ex.variables)
            if not 0 <= position < MAX_ROUNDS:
                raise InputError(f"The script assigns {name}[{position}], an index this reader refuses.", "")
            items += [""] * (position + 1 - len(items))
            items[position] = (items[position] if append else "") + value
            self.ex.assign_array(name, items)
            return
        self.ex.assign(name, (self.ex.variables.get(name, "") if append else "") + value)

    def call(self, name: str, args: list[str]) -> bool | None:
        if len(self.frames) >= MAX_CALL_DEPTH:
            raise InputError(f"The script's function {name} calls itself more than {MAX_CALL_DEPTH} deep.", "")
        saved, self.ex.positional = self.ex.positional, list(args)
        self.frames.append({})
        try:
            return self.run_command(self.functions[name])
        except _Return:
            return True
        finally:
            self.ex.positional = saved
            for var, (value, array) in self.frames.pop().items():
                self.ex.variables.pop(var, None)
                self.ex.arrays.pop(var, None)
                if array is not None:
                    self.ex.arrays[var] = array
                if value is not None:
                    self.ex.variables[var] = value


def read_script(text: str, environment: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> Script:
    """Evaluate the script (nothing run) with `environment` set and `args` as its arguments ($1, $2, ...)."""
    ex = Expander(dict(environment or {}), list(args))
    shell = _Shell(ex)
    exit_line = None
    try:
        shell.run_list(parse(text))
    except _Exit as done:
        exit_line = done.line
    except (_Return, _Jump):
        pass  # `return` / `break` outside a function or loop ends the script's reading here
    except RecursionError:
        raise InputError(
            "The script nests expansions or commands too deep to read.", "Fix the script: bash would struggle too."
        ) from None
    return Script(
        commands=tuple(shell.commands),
        variables=dict(ex.variables),
        unset=tuple(n for n in ex.unset if n not in ex.variables),  # used before it was set
        substitutions=tuple(ex.substitutions),
        notes=tuple(shell.notes),
        exit_line=exit_line,
    )


class _Literal(Expander):
    """Quote removal only: `$...` and backquotes stay as written (a command line already expanded)."""

    def _dollar(self, text: str, i: int, out, quoted: bool) -> int:
        out.add("$", False)
        return i + 1

    def substitute(self, inner: str, whole: str) -> str:
        return whole


def split_words(text: str) -> list[str]:
    """Words of a command line as bash splits them (quotes removed, nothing expanded): `--script-args`."""
    words: list[str] = []
    for token in tokenize(text):
        if token.kind == "word":
            words += _Literal({}).fields(token.text)
        elif token.kind in ("op", "arith"):
            raise InputError(
                f"'{token.text}' in the script arguments is shell syntax, not an argument.",
                "Give the arguments alone, e.g. --script-args '--model_name Qwen2.5-7B --max_response_length 8192'.",
            )
    return words
