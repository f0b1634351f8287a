"""Bash's `test` / `[ ... ]` / `[[ ... ]]` over expanded words, for `shell_words.py`: True, False, or None.

Evaluated (bash(1), CONDITIONAL EXPRESSIONS): `-z` / `-n` / a lone word, `=` `==` `!=` (in `[[ ]]` the
right side of `==` / `!=` is a glob pattern), `<` `>` on strings, `-eq -ne -lt -le -gt -ge` on integers,
`!`, `-a` / `-o` and `&&` / `||`, parentheses. What needs the machine the script would run on (file tests
such as `-f`, `-d`; `-v`; `=~` regular expressions) is None: unknown, never guessed.
"""

from __future__ import annotations

import fnmatch
import re

_INTEGER = re.compile(r"^\s*-?[0-9]+\s*$")
_NUMERIC = {
    "-eq": lambda a, b: a == b,
    "-ne": lambda a, b: a != b,
    "-lt": lambda a, b: a < b,
    "-le": lambda a, b: a <= b,
    "-gt": lambda a, b: a > b,
    "-ge": lambda a, b: a >= b,
}
_UNKNOWN_UNARY = set("-a -b -c -d -e -f -g -h -k -p -r -s -t -u -w -x -G -L -N -O -S -v -R -o".split())


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _binary(left: str, op: str, right: str, double: bool) -> bool | None:
    if op in ("=", "=="):
        return fnmatch.fnmatchcase(left, right) if double else left == right
    if op == "!=":
        return not fnmatch.fnmatchcase(left, right) if double else left != right
    if op in ("<", ">"):
        return left < right if op == "<" else left > right
    if op in _NUMERIC:
        if not (_INTEGER.match(left) and _INTEGER.match(right)):
            return None
        return _NUMERIC[op](int(left), int(right))
    return None  # =~, -nt, -ot, -ef: not evaluated


def _primary(words: list[str], i: int, double: bool) -> tuple[bool | None, int]:
    """One primary at words[i]; (status, index after it)."""
    if words[i] == "!":
        status, j = _primary(words, i + 1, double) if i + 1 < len(words) else (False, i + 1)
        return (None if status is None else not status), j
    if words[i] == "(":
        status, j = _expression(words, i + 1, double)
        return status, (j + 1 if j < len(words) and words[j] == ")" else j)
    if i + 2 < len(words) and words[i + 1] in ("=", "==", "!=", "<", ">", "=~", "-nt", "-ot", "-ef", *_NUMERIC):
        return _binary(words[i], words[i + 1], words[i + 2], double), i + 3
    if words[i] in ("-z", "-n") and i + 1 < len(words):
        empty = words[i + 1] == ""
        return (empty if words[i] == "-z" else not empty), i + 2
    if words[i] in _UNKNOWN_UNARY and i + 1 < len(words):
        return None, i + 2
    return words[i] != "", i + 1


def _expression(words: list[str], i: int, double: bool) -> tuple[bool | None, int]:
    ands, ors = ("&&", "-a") if double else ("-a",), ("||", "-o") if double else ("-o",)
    status, i = _primary(words, i, double)
    while i < len(words) and words[i] in ands + ors:
        op = words[i]
        right, i = _primary(words, i + 1, double) if i + 1 < len(words) else (None, i + 1)
        status = _and(status, right) if op in ands else _or(status, right)
    return status, i


def condition_status(words: list[str], double: bool = False) -> bool | None:
    """The status of `[ words ]` (`double`: `[[ words ]]`): True, False, or None where it cannot be known."""
    if not words:
        return False
    try:
        status, end = _expression(list(words), 0, double)
    except RecursionError:
        return None
    return status if end >= len(words) else None
