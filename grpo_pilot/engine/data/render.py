"""Turn a `PromptRecord` into the text the policy is prompted with.

- The tokenizer has a chat template (`tokenizer.chat_template` is set) and `use_chat_template` is
  not False: the record's turns (a plain prompt counts as one user turn) go through
  `apply_chat_template(..., tokenize=False, add_generation_prompt=True)`.
- Otherwise: a plain prompt is returned unchanged; chat turns are written one per line as
  "role: content\\n" followed by "assistant: " as the cue for the model's turn.
"""

from __future__ import annotations

from typing import Any

from grpo_pilot.engine.data.records import PromptRecord
from grpo_pilot.errors import InputError

PLAIN_GENERATION_CUE = "assistant: "


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_plain(record: PromptRecord) -> str:
    if record.messages is None:
        return str(record.prompt)
    turns = "".join(f"{turn['role']}: {turn['content']}\n" for turn in record.messages)
    return turns + PLAIN_GENERATION_CUE


def render_prompt(record: PromptRecord, tokenizer: Any, *, use_chat_template: bool | None = None) -> str:
    """The prompt text; `use_chat_template=None` uses the template when the tokenizer has one."""
    templated = has_chat_template(tokenizer) if use_chat_template is None else use_chat_template
    if not templated:
        return render_plain(record)
    if not has_chat_template(tokenizer):
        raise InputError(
            "A chat template was requested but the tokenizer has none.",
            "Use a tokenizer directory whose tokenizer_config.json has a chat_template, or turn the template off.",
        )
    turns = list(record.messages) if record.messages is not None else [{"role": "user", "content": record.prompt}]
    try:
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # a template may reject a role order (e.g. system not first)
        raise InputError(
            f"Line {record.line}: the tokenizer's chat template rejected the turns ({type(exc).__name__}: {exc}).",
            "Check the roles and their order on that line, or turn the chat template off.",
        ) from exc
    if not isinstance(text, str):
        raise InputError(
            "The tokenizer's apply_chat_template did not return text.", "Use a tokenizer with a Jinja chat template."
        )
    return text
