"""The normalised prompt record every input format is turned into, and a loaded prompt set.

A record holds either a plain-text `prompt` or a chat `messages` conversation (exactly one of the
two), the optional reference `answer` a reward may compare against, optional code `tests`
(assert statements, for the `code` reward) and `meta` (every other key of the input line, for user
reward functions).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from grpo_pilot.models import Frozen

FORMATS = ("prompt_answer", "instruction_response", "input_output", "messages")
"""Input formats `load_prompts` understands (the keys a JSONL line carries)."""


class PromptRecord(Frozen):
    """One prompt of a prompt set, whatever format its line had."""

    line: int = Field(ge=1, description="1-based line number in the source file (for messages that point at it).")
    prompt: str | None = Field(default=None, description="Plain-text prompt; None when `messages` is set.")
    messages: tuple[dict[str, Any], ...] | None = Field(
        default=None,
        description="Chat turns [{'role', 'content'}, ...] ending before the answer; None when `prompt` is set.",
    )
    answer: str | None = Field(default=None, description="Reference answer (final answer or full solution), if any.")
    tests: tuple[str, ...] = Field(default=(), description="Python assert statements for the `code` reward.")
    meta: dict[str, Any] = Field(default_factory=dict, description="Other keys of the input line, untouched.")

    @model_validator(mode="after")
    def _one_of_prompt_or_messages(self) -> "PromptRecord":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a PromptRecord needs exactly one of `prompt` and `messages`")
        return self


class PromptSet(Frozen):
    """A validated prompt set: records in file order plus what was left out and why."""

    source: str = Field(description="Path of the JSONL file the records came from.")
    records: tuple[PromptRecord, ...] = Field(min_length=1, description="Valid records, in file order.")
    skipped: int = Field(default=0, ge=0, description="Invalid lines left out (only with skip_invalid=True).")
    dropped: int = Field(default=0, ge=0, description="Lines the user transform dropped by returning None.")
    fmt: str = Field(description="Detected or requested format; 'mixed' when auto-detection found several.")
    skip_reasons: tuple[str, ...] = Field(
        default=(), description="Messages for the first skipped lines (at most 20), 'file:line: field ...'."
    )

    def __len__(self) -> int:
        return len(self.records)
