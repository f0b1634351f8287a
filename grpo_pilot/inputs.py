"""Reading what a user hands us: one layer every input file goes through before anything parses it.

- `input_file(path, what)`: the path names an existing, readable *regular* file (a directory, a named
  pipe, a device or a socket is refused by name: reading a pipe would block, a device never ends);
- `read_input_text(path, what)`: its text, UTF-8 (a BOM is dropped), at most `max_bytes`; a binary
  file (NUL bytes, bytes that are not UTF-8) is refused with the line of the first bad byte;
- `loads_json(text, what)` / `parse_json(text)`: strict JSON — no `NaN`/`Infinity` literals, no number
  that overflows to infinity (`1e999`), nesting at most `MAX_JSON_DEPTH` levels (a line nested 200,000
  deep is refused, not a `RecursionError`);
- `validation_problem(exc)`: the first problem of a pydantic `ValidationError` as "field 'a.b': message
  (got X)", for the one-paragraph errors of every config, plan and result model.

Every refusal is an `InputError` (exit status 2) naming the input, the problem and what to do.
Only the standard library is imported here: the planner uses it too.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from grpo_pilot.errors import InputError

MAX_JSON_DEPTH = 64  # far deeper than any config, plan or dataset record (a chat record is ~4 levels)
MAX_CONFIG_BYTES = 64 << 20  # config.json, plan.json, run configs, launch scripts: KiB in practice


class JsonProblem(ValueError):
    """Text that is not strict JSON; `str(exc)` says why (line-oriented readers add file and line)."""


def kind_of(mode: int) -> str:
    """What a file is, in words ('a regular file', 'a directory', 'a named pipe', ...)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "an unknown kind of file"


def input_file(path: str | os.PathLike[str], what: str, hint: str = "Check the path.") -> Path:
    """`path` if it names an existing regular file (symbolic links followed); else an `InputError`."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"No {what} at '{p}'.", hint) from None
    except NotADirectoryError:
        raise InputError(f"No {what} at '{p}': a parent of that path is a file, not a directory.", hint) from None
    except OSError as exc:
        raise InputError(f"Cannot read the {what} '{p}' ({exc.strerror or exc}).", hint) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"The {what} '{p}' is {kind_of(st.st_mode)}, not a regular file.", hint)
    return p


def read_input_bytes(
    path: str | os.PathLike[str], what: str, *, max_bytes: int | None = MAX_CONFIG_BYTES, hint: str = "Check the path."
) -> bytes:
    """The bytes of a regular input file of at most `max_bytes` (None: no limit)."""
    p = input_file(path, what, hint)
    try:
        # O_NONBLOCK: should the path be swapped for a pipe after the check, opening it must not hang
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"The {what} '{p}' is {kind_of(st.st_mode)}, not a regular file.", hint)
            if max_bytes is not None and st.st_size > max_bytes:
                raise InputError(
                    f"The {what} '{p}' is {st.st_size} bytes, more than the {max_bytes >> 20} MiB such a file can be.",
                    hint,
                )
            with os.fdopen(fd, "rb", closefd=False) as handle:
                return handle.read()
        finally:
            os.close(fd)
    except OSError as exc:
        raise InputError(f"Cannot read the {what} '{p}' ({exc.strerror or exc}).", hint) from None


def decode_text(data: bytes, where: str, what: str, hint: str) -> str:
    """UTF-8 text (BOM dropped); NUL bytes or invalid UTF-8 name the line of the first bad byte."""
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data[:nul].count(b"\n") + 1
        raise InputError(f"The {what} '{where}' is binary, not text (a NUL byte on line {line}).", hint)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(
            f"The {what} '{where}' is not UTF-8 text (byte {exc.start}, line {line}).",
            f"{hint} Save the file as UTF-8.".strip(),
        ) from None


def read_input_text(
    path: str | os.PathLike[str], what: str, *, max_bytes: int | None = MAX_CONFIG_BYTES, hint: str = "Check the path."
) -> str:
    """The UTF-8 text of a regular input file (see the module docstring)."""
    return decode_text(read_input_bytes(path, what, max_bytes=max_bytes, hint=hint), str(path), what, hint)


def _no_constant(name: str) -> Any:
    raise JsonProblem(f"{name} is not a JSON number (write a finite number or null)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonProblem(f"the number {text[:40]} is too large (it overflows to infinity)")
    return value


def json_depth_exceeds(value: Any, max_depth: int) -> bool:
    """Whether a parsed JSON value nests deeper than `max_depth` arrays/objects (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


class _BadNumber:
    """Stands in for a NaN / Infinity / overflowing number while `_path_of_bad_number` looks for its key."""


def _path_of_bad_number(text: str) -> str | None:
    """Where (`a.b[1]`) the first non-finite number of `text` is, found by parsing again with a stand-in."""

    def bad_float(token: str) -> Any:
        value = float(token)
        return value if math.isfinite(value) else _BadNumber()

    try:
        value = json.loads(text, parse_constant=lambda _: _BadNumber(), parse_float=bad_float)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:  # depth first, in document order
        item, path = stack.pop()
        if isinstance(item, _BadNumber):
            return path or "(top level)"
        if isinstance(item, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


def parse_json(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict JSON (module docstring); raises `JsonProblem` saying what is wrong (and where, for a number)."""
    # fewer brackets than the limit cannot nest deeper: the cheap count spares most lines the walk
    shallow = text.count("[") + text.count("{") <= max_depth
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise JsonProblem(f"nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise JsonProblem(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except JsonProblem as exc:  # NaN, Infinity or an overflowing number: name its key
        path = _path_of_bad_number(text)
        raise JsonProblem(f"field '{path}': {exc}" if path else str(exc)) from None
    except ValueError as exc:  # int() of a number with more than 4300 digits
        raise JsonProblem(f"not valid JSON ({exc})") from None
    if not shallow and json_depth_exceeds(value, max_depth):
        raise JsonProblem(f"nested deeper than {max_depth} levels")
    return value


def loads_json(text: str, where: str, what: str, hint: str = "", *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`parse_json` with an `InputError` naming the input."""
    try:
        return parse_json(text, max_depth=max_depth)
    except JsonProblem as exc:
        raise InputError(f"The {what} '{where}' is not usable JSON: {exc}.", hint) from None


def read_json_file(
    path: str | os.PathLike[str],
    what: str,
    *,
    hint: str = "Check the path.",
    max_bytes: int | None = MAX_CONFIG_BYTES,
) -> Any:
    """A regular UTF-8 file holding one strict JSON value."""
    return loads_json(read_input_text(path, what, max_bytes=max_bytes, hint=hint), str(path), what, hint)


def validation_problem(exc: Any) -> str:
    """ "field 'a.b': message (got X)" for the first problem of a pydantic `ValidationError`."""
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or "(top level)"
    shown = repr(first.get("input"))
    quoted = first["type"] != "missing" and first["loc"]  # a whole-object problem does not quote the object
    got = f" (got {shown[:60]}{'…' if len(shown) > 60 else ''})" if quoted else ""
    more = exc.error_count() - 1
    also = f"; {more} more problem(s)" if more > 0 else ""
    return f"field '{where}': {first['msg']}{got}{also}"
