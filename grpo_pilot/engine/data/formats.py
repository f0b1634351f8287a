"""Turn one raw JSON object (one JSONL line) into a `PromptRecord`, per input format.

Formats (the keys a line carries; any other key goes to `PromptRecord.meta`):

- `prompt_answer`: {"prompt": str | [messages], "answer"?: str | number}
  (TRL-style lines whose "prompt" is a list of chat turns become chat records.)
- `instruction_response` (Alpaca): {"instruction": str, "input"?: str, "response"? | "output"?: str};
  a non-empty "input" is appended to the instruction after a blank line.
- `input_output`: {"input": str, "output"?: str}
- `messages` (chat): {"messages": [{"role": str, "content": str}, ...], "answer"?: ...}; a final
  assistant turn is the answer and is removed from the prompt turns; otherwise "answer" is used.

Every format may carry "tests": a list of Python assert statements (or one string) for the `code`
reward. Auto-detection looks for, in order, "messages", "prompt", "instruction", "input".
A problem raises `RecordError(field, problem)`; the loader adds file and line.
"""

from __future__ import annotations

from typing import Any, Callable

from grpo_pilot.engine.data.records import PromptRecord

CHAT_ROLES = ("system", "user", "assistant", "tool")


class RecordError(Exception):
    """A record that cannot be used: `field` names the offending key, `problem` says what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field '{field}': {problem}")
        self.field = field
        self.problem = problem


def _type_name(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _text(raw: dict[str, Any], key: str, *, required: bool) -> str | None:
    """A non-empty string field (a missing optional field or JSON null gives None)."""
    if key not in raw or raw[key] is None:
        if required:
            raise RecordError(key, "missing (required for this format)")
        return None
    value = raw[key]
    if not isinstance(value, str):
        raise RecordError(key, f"expected a string, got {_type_name(value)}")
    if required and not value.strip():
        raise RecordError(key, "is empty")
    return value


def _answer(raw: dict[str, Any], key: str) -> str | None:
    """A reference answer: a string, or a number written back as text (JSON 72 -> "72")."""
    if key not in raw or raw[key] is None:
        return None
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise RecordError(key, f"expected a string or a number, got {_type_name(value)}")
    return value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)


def _tests(raw: dict[str, Any]) -> tuple[str, ...]:
    if "tests" not in raw or raw["tests"] is None:
        return ()
    value = raw["tests"]
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if not isinstance(value, list):
        raise RecordError("tests", f"expected a list of strings, got {_type_name(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RecordError(f"tests[{i}]", f"expected a string, got {_type_name(item)}")
    return tuple(t for t in value if t.strip())


def _messages(value: object, key: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise RecordError(key, f"expected a list of {{role, content}} objects, got {_type_name(value)}")
    if not value:
        raise RecordError(key, "is an empty list")
    for i, turn in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise RecordError(where, f"expected an object with 'role' and 'content', got {_type_name(turn)}")
        role, content = turn.get("role"), turn.get("content")
        if role not in CHAT_ROLES:
            raise RecordError(f"{where}.role", f"expected one of {', '.join(CHAT_ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise RecordError(f"{where}.content", f"expected a string, got {_type_name(content)}")
    return [dict(turn) for turn in value]


def _record(line: int, raw: dict[str, Any], used: set[str], **fields: Any) -> PromptRecord:
    meta = {k: v for k, v in raw.items() if k not in used | {"tests"}}
    return PromptRecord(line=line, tests=_tests(raw), meta=meta, **fields)


def _chat_record(line: int, raw: dict[str, Any], key: str) -> PromptRecord:
    turns = _messages(raw[key], key)
    answer = _answer(raw, "answer")
    if turns[-1]["role"] == "assistant":
        answer = turns.pop()["content"]
        if not turns:
            raise RecordError(key, "holds only an assistant turn; there is no prompt to answer")
    if not any(t["content"].strip() for t in turns):
        raise RecordError(key, "every prompt turn is empty")
    return _record(line, raw, {key, "answer"}, messages=tuple(turns), answer=answer)


def parse_prompt_answer(line: int, raw: dict[str, Any]) -> PromptRecord:
    if isinstance(raw.get("prompt"), list):
        return _chat_record(line, raw, "prompt")
    prompt = _text(raw, "prompt", required=True)
    return _record(line, raw, {"prompt", "answer"}, prompt=prompt, answer=_answer(raw, "answer"))


def parse_instruction_response(line: int, raw: dict[str, Any]) -> PromptRecord:
    instruction = _text(raw, "instruction", required=True)
    context = _text(raw, "input", required=False)
    prompt = f"{instruction}\n\n{context}" if context and context.strip() else instruction
    answer_key = "response" if raw.get("response") is not None else "output"
    answer = _text(raw, answer_key, required=False)
    return _record(line, raw, {"instruction", "input", "response", "output"}, prompt=prompt, answer=answer)


def parse_input_output(line: int, raw: dict[str, Any]) -> PromptRecord:
    prompt = _text(raw, "input", required=True)
    return _record(line, raw, {"input", "output"}, prompt=prompt, answer=_text(raw, "output", required=False))


def parse_messages(line: int, raw: dict[str, Any]) -> PromptRecord:
    if "messages" not in raw or raw["messages"] is None:
        raise RecordError("messages", "missing (required for this format)")
    return _chat_record(line, raw, "messages")


PARSERS: dict[str, Callable[[int, dict[str, Any]], PromptRecord]] = {
    "prompt_answer": parse_prompt_answer,
    "instruction_response": parse_instruction_response,
    "input_output": parse_input_output,
    "messages": parse_messages,
}

# Auto-detection: the first key present decides the format.
DETECT_ORDER = (
    ("messages", "messages"),
    ("prompt", "prompt_answer"),
    ("instruction", "instruction_response"),
    ("input", "input_output"),
)


def detect_format(raw: dict[str, Any]) -> str:
    for key, fmt in DETECT_ORDER:
        if key in raw:
            return fmt
    keys = ", ".join(sorted(raw)) or "none"
    raise RecordError(
        "prompt", f"no prompt field found (keys: {keys}); expected one of messages, prompt, instruction, input"
    )


def parse_record(line: int, raw: object, fmt: str) -> tuple[PromptRecord, str]:
    """The record for one parsed JSON value and the format used (`fmt` or the detected one)."""
    if not isinstance(raw, dict):
        raise RecordError("<line>", f"expected a JSON object, got {_type_name(raw)}")
    used = detect_format(raw) if fmt == "auto" else fmt
    return PARSERS[used](line, raw), used
