"""Read a JSONL prompt set, validate every line, and return a `PromptSet` — before any training starts.

`load_prompts(path, fmt="auto", transform=None, skip_invalid=False)`:
- one JSON object per line; blank lines are ignored; lines are numbered from 1 as in an editor;
- `fmt` is "auto" (detect per line) or one of `FORMATS` (every line must have that format's keys);
- `transform` ("module:function" or "file.py:function") maps each raw object to one of the formats
  first; returning None drops the line (counted in `PromptSet.dropped`). It runs in a worker process
  (`callables.UserFunction`) with `timeout_s` per call: an exception (SystemExit included) is that
  line's problem; a hang or a crash of its process stops the load with an `InputError`;
- a string holding a lone surrogate (a `\ud800` escape without its pair: valid JSON, but not text any
  tokenizer can encode) makes its line invalid, naming the field;
- every bad line (invalid JSON, not an object, missing or mistyped field, transform error) is
  reported as "file:line: field 'x': problem". By default the whole file is checked and an
  `InputError` lists the first few problems and the count; with `skip_invalid=True` bad lines are
  left out and counted in `PromptSet.skipped` (their messages in `skip_reasons`).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from grpo_pilot.engine.data.callables import (
    DEFAULT_USER_CODE_TIMEOUT_S,
    UserCodeError,
    UserFunction,
    user_code_hint,
)
from grpo_pilot.engine.data.formats import RecordError, parse_record
from grpo_pilot.engine.data.records import FORMATS, PromptRecord, PromptSet
from grpo_pilot.errors import InputError
from grpo_pilot.inputs import JsonProblem, parse_json, read_input_bytes

MAX_LISTED_PROBLEMS = 5
MAX_SKIP_REASONS = 20


def _open_lines(path: Path) -> list[str]:
    if not path.exists():
        raise InputError(
            f"Prompt file '{path}' does not exist.", "Pass the path of a JSONL file (one JSON object per line)."
        )
    hint = "Pass the path of a JSONL file (one JSON object per line)."
    data = read_input_bytes(path, "prompt file", max_bytes=None, hint=hint)  # a pipe or a device is refused
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data[:nul].count(b"\n") + 1
        raise InputError(f"{path}:{line}: a NUL byte: the prompt file is binary, not JSONL text.", hint)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad_line = data[: exc.start].count(b"\n") + 1
        raise InputError(
            f"{path}:{bad_line}: not valid UTF-8 (byte {exc.start}).", "Re-encode the file as UTF-8."
        ) from exc
    return text.split("\n")


def _lone_surrogate(value: object, path: str) -> tuple[str, str, int] | None:
    """(field path, the string, index) of the first string under `value` that is not encodable text."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return path, value, exc.start
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _lone_surrogate(key, f"{path}.<key>") if isinstance(key, str) else None
        found = found or _lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def _check_text(record: PromptRecord) -> None:
    """`RecordError` for a record holding a lone surrogate: the tokenizer would fail on it mid-run."""
    found = _lone_surrogate(record.model_dump(exclude={"line"}, exclude_none=True), "")
    if found:
        field, text, index = found
        code = f"\\u{ord(text[index]):04x}"
        raise RecordError(
            field,
            f"character {index} is a lone surrogate ({code}, an escape without its pair): not text a tokenizer "
            "can encode",
        )


TRANSFORM_CHUNK = 256  # lines sent to the transform's worker process per round trip


def _check_transformed(ref: str, out: object) -> object:
    if out is not None and not isinstance(out, dict):
        raise RecordError("<transform>", f"{ref} returned {type(out).__name__}; it must return a dict or None")
    return out


def _transform_all(worker: UserFunction, ref: str, raws: list[tuple[int, object]]) -> dict[int, object]:
    """Line number -> transformed object, or a `RecordError` for the lines whose call raised.

    Calls run in the transform's worker process, a chunk at a time; a call that raises (SystemExit
    included) is that line's problem; a call that hangs past the timeout or kills its process stops the
    load with an `InputError` naming the function and the line.
    """
    out: dict[int, object] = {}
    start = 0
    while start < len(raws):
        chunk = raws[start : start + TRANSFORM_CHUNK]
        done = 0
        try:
            for value in worker.map([(raw,) for _, raw in chunk]):
                out[chunk[done][0]] = value
                done += 1
        except UserCodeError as exc:
            line = chunk[done][0]
            if exc.kind != "raised":
                raise InputError(
                    f"The data transform '{ref}' {exc.text} on line {line}.",
                    user_code_hint(exc, worker.timeout_s, "return a dict (or None to drop the line)"),
                ) from None
            out[line] = RecordError("<transform>", f"{ref} {exc.text}")
            done += 1
        start += done
    return out


def load_prompts(
    path: str | os.PathLike[str],
    *,
    fmt: str = "auto",
    transform: str | None = None,
    skip_invalid: bool = False,
    timeout_s: float = DEFAULT_USER_CODE_TIMEOUT_S,
) -> PromptSet:
    """Load and validate a JSONL prompt set; see the module docstring for formats and errors."""
    if fmt != "auto" and fmt not in FORMATS:
        raise InputError(f"Unknown prompt format '{fmt}'.", f"Use auto or one of: {', '.join(FORMATS)}.")
    source = Path(path)
    lines = _open_lines(source)
    worker = UserFunction(transform, role="data transform", timeout_s=timeout_s) if transform else None
    records: list[PromptRecord] = []
    numbered_problems: list[tuple[int, str]] = []
    formats: Counter[str] = Counter()
    dropped = 0
    raws: list[tuple[int, object]] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            raws.append((number, parse_json(text)))
        except JsonProblem as exc:
            numbered_problems.append((number, f"{source}:{number}: field '<line>': {exc}"))
    if worker is not None:
        try:
            transformed = _transform_all(worker, str(transform), raws)
        finally:
            worker.close()
    for number, raw in raws:
        try:
            if worker is not None:
                raw = transformed[number]
                if isinstance(raw, RecordError):
                    raise raw
                if _check_transformed(str(transform), raw) is None:
                    dropped += 1
                    continue
            record, used = parse_record(number, raw, fmt)
            _check_text(record)
        except RecordError as exc:
            numbered_problems.append((number, f"{source}:{number}: {exc}"))
            continue
        records.append(record)
        formats[used] += 1
    problems = [text for _, text in sorted(numbered_problems, key=lambda item: item[0])]

    if problems and not skip_invalid:
        listed = "; ".join(problems[:MAX_LISTED_PROBLEMS])
        more = f" (and {len(problems) - MAX_LISTED_PROBLEMS} more)" if len(problems) > MAX_LISTED_PROBLEMS else ""
        raise InputError(
            f"{len(problems)} invalid line(s) in the prompt file: {listed}{more}.",
            "Fix those lines, or pass --skip-invalid to leave them out (they are counted and reported).",
        )
    if not records:
        reason = (
            f"all {len(problems)} non-blank line(s) are invalid"
            if problems
            else (f"the transform dropped all {dropped} line(s)" if dropped else "it has no JSON lines")
        )
        raise InputError(
            f"Prompt file '{source}' holds no usable prompt: {reason}.",
            'Give a JSONL file with one object per line, e.g. {"prompt": "...", "answer": "..."}.',
        )
    detected = fmt if fmt != "auto" else (next(iter(formats)) if len(formats) == 1 else "mixed")
    return PromptSet(
        source=str(source),
        records=tuple(records),
        skipped=len(problems),
        dropped=dropped,
        fmt=detected,
        skip_reasons=tuple(problems[:MAX_SKIP_REASONS]),
    )
