"""render_prompt: chat template when the tokenizer has one, plain text otherwise."""

from __future__ import annotations

import pytest

from grpo_pilot.engine.data import PromptRecord, render_prompt
from grpo_pilot.engine.model_factory import build_char_tokenizer
from grpo_pilot.errors import InputError

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CHAT = PromptRecord(
    line=3,
    messages=({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}),
    answer="4",
)
PLAIN = PromptRecord(line=1, prompt="say a: ")


@pytest.fixture(scope="module")
def templated():
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def test_plain_tokenizer_returns_prompt_unchanged_and_joins_turns() -> None:
    tok = build_char_tokenizer()
    assert render_prompt(PLAIN, tok) == "say a: "
    assert render_prompt(CHAT, tok) == "system: Be brief.\nuser: 2+2?\nassistant: "


def test_chat_template_with_generation_prompt(templated) -> None:
    assert render_prompt(CHAT, templated) == "<|system|>Be brief.\n<|user|>2+2?\n<|assistant|>"
    assert render_prompt(PLAIN, templated) == "<|user|>say a: \n<|assistant|>"
    assert render_prompt(PLAIN, templated, use_chat_template=False) == "say a: "


def test_requesting_a_missing_template_is_an_input_error() -> None:
    with pytest.raises(InputError, match="has none"):
        render_prompt(PLAIN, build_char_tokenizer(), use_chat_template=True)


def test_template_failure_names_the_line() -> None:
    tok = build_char_tokenizer()
    tok.chat_template = "{{ raise_exception('system must come last') }}"
    with pytest.raises(InputError, match="Line 3: the tokenizer's chat template rejected"):
        render_prompt(CHAT, tok)
