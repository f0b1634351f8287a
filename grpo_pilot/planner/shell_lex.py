"""Bash's lexical layer for `shell_words.py`: a script's text → words and operators, as bash splits them.

Words keep their raw text (quotes, `$...`, backslashes), so that a loop body can be expanded again
with other variables; `shell_expand.py` removes the quotes and expands. What bash does here, and this
lexer too (bash(1), QUOTING and DEFINITIONS):
- single and double quotes, `$(...)`, `$((...))`, `${...}` and backquotes may span lines: an open quote
  carries over newlines (the `--runtime-env-json='{` ... `}'` of a `ray job submit`);
- backslash-newline outside single quotes joins lines; `#` at the start of a word comments to the end
  of the line; a newline outside quotes ends a command;
- operators: `;` `;;` `&` `&&` `|` `||` `|&` `(` `)` and redirections (`>`, `>>`, `2>&1`, `&>`, `<<`, ...);
- here-documents (`<<EOF`, `<<-EOF`, `<<'EOF'`): the body lines are consumed up to the delimiter line
  and never read as commands;
- `((...))` is one arithmetic word (the `(( $# > 0 ))` command and `for ((...))`).
"""

from __future__ import annotations

from typing import NamedTuple

from grpo_pilot.errors import InputError

_OPERATORS = ("&&", "||", ";;&", ";;", ";&", "|&", "&>>", "&>", ">>", ">&", "<&", ">|", "<<<", "<<-", "<<", "<>")
_OPERATOR_START = set(";&|()<>")
_BLANK = " \t"


class Token(NamedTuple):
    kind: str  # "word", "op", "newline", "arith" (the inside of `(( ))`), "eof"
    text: str
    line: int


def _line_of(text: str, i: int) -> int:
    return text.count("\n", 0, i) + 1


def _unterminated(text: str, start: int, what: str) -> InputError:
    line = _line_of(text, start)
    shown = text[start : start + 60].split("\n")[0]
    return InputError(
        f"Unterminated {what} opened on line {line}: {shown!r} (bash would wait for more input).",
        "Fix the script's quoting.",
    )


def skip_single(text: str, i: int) -> int:
    """Index after the single-quoted string starting at text[i] == "'"."""
    j = text.find("'", i + 1)
    if j < 0:
        raise _unterminated(text, i, "single quote")
    return j + 1


def skip_double(text: str, i: int) -> int:
    """Index after the double-quoted string starting at text[i] == '"' (nested `$(...)` may hold quotes)."""
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
        elif ch == '"':
            return j + 1
        elif text.startswith("$(", j) or text.startswith("${", j):
            j = skip_dollar(text, j)
        elif ch == "`":
            j = skip_backquote(text, j)
        else:
            j += 1
    raise _unterminated(text, i, "double quote")


def skip_backquote(text: str, i: int) -> int:
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == "`":
            return j + 1
        else:
            j += 1
    raise _unterminated(text, i, "backquote")


def skip_balanced(text: str, i: int, opener: str, closer: str) -> int:
    """Index after the bracket matching text[i] == opener, skipping quoted strings and nested `$...`."""
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "'":
            j = skip_single(text, j)
            continue
        if ch == '"':
            j = skip_double(text, j)
            continue
        if ch == "`":
            j = skip_backquote(text, j)
            continue
        if ch == "$" and j + 1 < len(text) and text[j + 1] in "({" and j != i:
            j = skip_dollar(text, j)
            continue
        if ch == opener:
            depth += 1
        elif ch == closer:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise _unterminated(text, i, f"'{opener}'")


def skip_dollar(text: str, i: int) -> int:
    """Index after the `$(...)`, `$((...))` or `${...}` starting at text[i] == '$'."""
    if text.startswith("${", i):
        return skip_balanced(text, i + 1, "{", "}")
    return skip_balanced(text, i + 1, "(", ")")


def _word_end(text: str, i: int) -> int:
    """Index where the word starting at text[i] ends (unquoted blank, newline or operator)."""
    j = i
    while j < len(text):
        ch = text[j]
        if ch in _BLANK or ch == "\n" or ch in _OPERATOR_START:
            if ch == "(" and j > i and text[j - 1] == "=":  # NAME=(array words)
                j = skip_balanced(text, j, "(", ")")
                continue
            return j
        if ch == "\\":
            j += 2
        elif ch == "'":
            j = skip_single(text, j)
        elif ch == '"':
            j = skip_double(text, j)
        elif ch == "`":
            j = skip_backquote(text, j)
        elif ch == "$" and text.startswith("$'", j):
            j = _skip_ansi(text, j)
        elif ch == "$" and j + 1 < len(text) and text[j + 1] in "({":
            j = skip_dollar(text, j)
        else:
            j += 1
    return min(j, len(text))


def _skip_ansi(text: str, i: int) -> int:
    j = i + 2
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == "'":
            return j + 1
        else:
            j += 1
    raise _unterminated(text, i, "$'...' quote")


def _heredoc_end(text: str, i: int, delimiter: str, strip_tabs: bool) -> int:
    """`i` is the start of the first body line; index after the delimiter line (or the end of the text)."""
    while i < len(text):
        end = text.find("\n", i)
        line = text[i : end if end >= 0 else len(text)]
        if (line.lstrip("\t") if strip_tabs else line) == delimiter:
            return end + 1 if end >= 0 else len(text)
        if end < 0:
            return len(text)
        i = end + 1
    return i


def tokenize(text: str) -> list[Token]:
    """The script's tokens in order, ending with an "eof" token."""
    tokens: list[Token] = []
    pending: list[tuple[str, bool]] = []  # here-documents whose bodies start after this line
    i, line = 0, 1
    while i < len(text):
        ch = text[i]
        if ch in _BLANK:
            i += 1
        elif ch == "\\" and text.startswith("\\\n", i):
            i, line = i + 2, line + 1
        elif ch == "\n":
            tokens.append(Token("newline", "\n", line))
            i, line = i + 1, line + 1
            for delimiter, strip_tabs in pending:
                end = _heredoc_end(text, i, delimiter, strip_tabs)
                line += text.count("\n", i, end)
                i = end
            pending = []
        elif ch == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif text.startswith("((", i):
            end = skip_balanced(text, i, "(", ")")
            tokens.append(Token("arith", text[i + 2 : end - 2], line))
            line += text.count("\n", i, end)
            i = end
        elif text.startswith(("<(", ">("), i):  # process substitution: one word, never run
            end = skip_balanced(text, i + 1, "(", ")")
            tokens.append(Token("word", text[i:end], line))
            line += text.count("\n", i, end)
            i = end
        elif ch in _OPERATOR_START:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), ch)
            tokens.append(Token("op", op, line))
            i += len(op)
            if op in ("<<", "<<-"):
                i, line = _heredoc_delimiter(text, i, line=line, strip_tabs=op == "<<-", pending=pending, tokens=tokens)
        else:
            end = _word_end(text, i)
            word = text[i:end]
            if word.isdigit() and end < len(text) and text[end] in "<>":  # `2>`: the digits name a descriptor
                i = end
                continue
            tokens.append(Token("word", word, line))
            line += word.count("\n")
            i = end
    tokens.append(Token("eof", "", line))
    return tokens


def _heredoc_delimiter(
    text: str, i: int, *, line: int, strip_tabs: bool, pending: list[tuple[str, bool]], tokens: list[Token]
) -> tuple[int, int]:
    """Read the delimiter word after `<<`; the body is skipped at the end of the line."""
    while i < len(text) and text[i] in _BLANK:
        i += 1
    end = _word_end(text, i)
    raw = text[i:end]
    if not raw:
        raise InputError(f"A here-document on line {line} has no delimiter word.", "Fix the script.")
    delimiter = raw.replace("'", "").replace('"', "").replace("\\", "")
    pending.append((delimiter, strip_tabs))
    tokens.append(Token("word", raw, line))
    return end, line
