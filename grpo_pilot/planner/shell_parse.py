"""Bash's grammar for `shell_words.py`: tokens (`shell_lex.py`) → a tree of commands, nothing run.

Lists (`;`, `&`, newlines), `&&` / `||`, pipelines, simple commands (assignments, words, redirections),
`if`/`elif`/`else`, `while`/`until`, `for NAME in ...` and `for ((...))`, `case ... esac`, `{ ...; }`,
`( ... )`, `[[ ... ]]`, `(( ... ))` and function definitions (`name() { ... }`, `function name { ... }`),
as bash(1) SHELL GRAMMAR defines them. Words stay raw (expanded when the tree is evaluated).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_pilot.errors import InputError
from grpo_pilot.planner.shell_lex import Token, tokenize

MAX_NESTING = 200  # compound commands inside compound commands (a script nests a handful)
_REDIRECTIONS = ("<", ">", ">>", ">&", "<&", "&>", "&>>", ">|", "<<<", "<<", "<<-", "<>")


@dataclass
class Simple:
    words: list[str]  # raw words, assignments in front included
    line: int


@dataclass
class Pipeline:
    commands: list
    negate: bool = False


@dataclass
class AndOr:
    first: Pipeline
    rest: list[tuple[str, Pipeline]] = field(default_factory=list)


@dataclass
class If:
    clauses: list[tuple[list, list]]  # (condition list, body list)
    otherwise: list | None
    line: int


@dataclass
class Loop:
    condition: list
    body: list
    until: bool
    line: int


@dataclass
class For:
    name: str
    words: list[str] | None  # None: `for NAME` (the positional parameters)
    body: list
    line: int
    arith: str | None = None  # `for ((...))`


@dataclass
class Case:
    word: str
    arms: list[tuple[list[str], list, str]]  # (patterns, body, terminator ;; ;& ;;&)
    line: int


@dataclass
class Group:
    body: list
    subshell: bool


@dataclass
class Cond:
    words: list[str]  # raw words between [[ and ]]
    line: int


@dataclass
class Arith:
    expr: str
    line: int


@dataclass
class Function:
    name: str
    body: object


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    def peek(self) -> Token:
        return self.tokens[self.i]

    def next(self) -> Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def is_word(self, *texts: str) -> bool:
        token = self.peek()
        return token.kind == "word" and token.text in texts

    def is_op(self, *texts: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.text in texts

    def expect_word(self, text: str, opened: Token) -> None:
        self.skip_newlines()
        if not self.is_word(text):
            got = self.peek().text.strip() or "the end of the script"
            raise InputError(
                f"The script's '{opened.text}' on line {opened.line} has no '{text}' (found '{got[:40]}').",
                "Fix the script: bash would refuse it too.",
            )
        self.next()

    def skip_newlines(self) -> None:
        while self.peek().kind == "newline":
            self.next()

    def command_list(self, *stops: str) -> list:
        """Commands up to (not including) a reserved word or operator in `stops`, or the end."""
        items: list = []
        while True:
            while self.peek().kind == "newline" or self.is_op(";", "&"):
                self.next()
            token = self.peek()
            if token.kind == "eof" or (token.kind in ("word", "op") and token.text in stops):
                return items
            if token.kind == "op" and token.text != "(" and token.text not in _REDIRECTIONS:
                raise InputError(
                    f"Unexpected '{token.text}' on line {token.line} of the script.", "Fix the script's syntax."
                )
            items.append(self.and_or())

    def and_or(self) -> AndOr:
        node = AndOr(self.pipeline())
        while self.is_op("&&", "||"):
            op = self.next().text
            self.skip_newlines()
            node.rest.append((op, self.pipeline()))
        return node

    def pipeline(self) -> Pipeline:
        negate = False
        if self.is_word("!"):
            self.next()
            negate = True
        node = Pipeline([self.command()], negate)
        while self.is_op("|", "|&"):
            self.next()
            self.skip_newlines()
            node.commands.append(self.command())
        return node

    def command(self):
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise InputError(f"The script nests compound commands more than {MAX_NESTING} deep.", "Fix the script.")
        try:
            node = self._command()
        finally:
            self.depth -= 1
        self._redirections()
        return node

    def _command(self):
        token = self.peek()
        if token.kind == "arith":
            self.next()
            return Arith(token.text, token.line)
        if token.kind == "op" and token.text == "(":
            self.next()
            body = self.command_list(")")
            self._close(")", token)
            return Group(body, subshell=True)
        if token.kind == "word":
            compound = {
                "if": self._if,
                "while": self._loop,
                "until": self._loop,
                "for": self._for,
                "case": self._case,
                "{": self._brace,
                "[[": self._cond,
                "function": self._function,
            }.get(token.text)
            if compound:
                return compound()
            after = self.tokens[self.i + 1 : self.i + 3]
            if len(after) == 2 and [t.text for t in after] == ["(", ")"] and after[0].kind == "op":
                self.i += 3
                self.skip_newlines()
                return Function(token.text, self.command())
        return self._simple()

    def _close(self, text: str, opened: Token) -> None:
        if not self.is_op(text) and not self.is_word(text):
            raise InputError(
                f"The '{opened.text}' on line {opened.line} of the script is never closed with '{text}'.",
                "Fix the script's syntax.",
            )
        self.next()

    def _simple(self) -> Simple:
        words: list[str] = []
        line = self.peek().line
        while True:
            token = self.peek()
            if token.kind == "word":
                words.append(self.next().text)
            elif token.kind == "op" and token.text in _REDIRECTIONS:
                self._redirections()
            else:
                break
        return Simple(words, line)

    def _redirections(self) -> None:
        while self.is_op(*_REDIRECTIONS):
            self.next()
            if self.peek().kind == "word":
                self.next()

    def _if(self) -> If:
        opened = self.next()
        clauses = []
        condition = self.command_list("then")
        self.expect_word("then", opened)
        body = self.command_list("elif", "else", "fi")
        clauses.append((condition, body))
        otherwise = None
        while True:
            self.skip_newlines()
            if self.is_word("elif"):
                self.next()
                condition = self.command_list("then")
                self.expect_word("then", opened)
                clauses.append((condition, self.command_list("elif", "else", "fi")))
            elif self.is_word("else"):
                self.next()
                otherwise = self.command_list("fi")
            else:
                self.expect_word("fi", opened)
                return If(clauses, otherwise, opened.line)

    def _loop(self) -> Loop:
        opened = self.next()
        condition = self.command_list("do")
        self.expect_word("do", opened)
        body = self.command_list("done")
        self.expect_word("done", opened)
        return Loop(condition, body, opened.text == "until", opened.line)

    def _for(self) -> For:
        opened = self.next()
        if self.peek().kind == "arith":
            expr = self.next().text
            self._for_body_start(opened)
            body = self.command_list("done")
            self.expect_word("done", opened)
            return For("", [], body, opened.line, arith=expr)
        name = self.next().text
        words: list[str] | None = None
        self.skip_newlines()
        if self.is_word("in"):
            self.next()
            words = []
            while self.peek().kind == "word":
                words.append(self.next().text)
        self._for_body_start(opened)
        body = self.command_list("done")
        self.expect_word("done", opened)
        return For(name, words, body, opened.line)

    def _for_body_start(self, opened: Token) -> None:
        while self.is_op(";") or self.peek().kind == "newline":
            self.next()
        if self.is_word("{"):  # the old `for x in a; { ...; }` form
            return
        self.expect_word("do", opened)

    def _case(self) -> Case:
        opened = self.next()
        word = self.next().text
        self.expect_word("in", opened)
        arms = []
        while True:
            self.skip_newlines()
            if self.is_word("esac") or self.peek().kind == "eof":
                break
            if self.is_op("("):
                self.next()
            patterns = [self.next().text]
            while self.is_op("|"):
                self.next()
                patterns.append(self.next().text)
            self._close(")", opened)
            body = self.command_list(";;", ";&", ";;&", "esac")
            terminator = self.next().text if self.is_op(";;", ";&", ";;&") else ";;"
            arms.append((patterns, body, terminator))
        self.expect_word("esac", opened)
        return Case(word, arms, opened.line)

    def _brace(self) -> Group:
        opened = self.next()
        body = self.command_list("}")
        self.expect_word("}", opened)
        return Group(body, subshell=False)

    def _cond(self) -> Cond:
        opened = self.next()
        words = []
        while not self.is_word("]]"):
            token = self.next()
            if token.kind in ("eof",):
                raise InputError(f"The '[[' on line {opened.line} of the script has no ']]'.", "Fix the script.")
            if token.kind != "newline":
                words.append(token.text)
        self.next()
        return Cond(words, opened.line)

    def _function(self) -> Function:
        self.next()
        name = self.next().text
        if self.is_op("("):
            self.next()
            self._close(")", self.tokens[self.i - 1])
        self.skip_newlines()
        return Function(name, self.command())


def parse(text: str) -> list:
    """The script's top-level command list."""
    parser = _Parser(tokenize(text))
    items = parser.command_list()
    token = parser.peek()
    if token.kind != "eof":
        raise InputError(f"Unexpected '{token.text}' on line {token.line} of the script.", "Fix the script.")
    return items
