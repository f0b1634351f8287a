"""Loading every supported JSONL format into PromptRecords (examples/data and the tiny example set)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_pilot.engine.data import FORMATS, PromptRecord, load_prompts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DATA = EXAMPLES / "data"


def test_prompt_answer_format_keeps_answers_numbers_and_meta() -> None:
    ps = load_prompts(DATA / "prompt_answer.jsonl")
    assert ps.fmt == "prompt_answer" and ps.skipped == 0 and len(ps) == 4
    first, _, third, fourth = ps.records
    assert first.line == 1 and first.prompt.startswith("What is 12 + 30?") and first.answer == "42"
    assert third.answer.endswith("#### 72") and third.meta == {"source": "gsm8k-style"}
    assert fourth.answer == "1000"  # a JSON number becomes text
    assert all(r.messages is None and r.tests == () for r in ps.records)


def test_instruction_response_appends_input_and_reads_response_or_output() -> None:
    ps = load_prompts(DATA / "instruction_response.jsonl")
    assert ps.fmt == "instruction_response"
    capital, add, prime = ps.records
    assert capital.prompt == "Give the capital of France in one word." and capital.answer == "Paris"
    assert add.prompt == "Add the two numbers.\n\n17 and 25" and add.answer == "42"
    assert prime.answer == "11"


def test_input_output_format() -> None:
    ps = load_prompts(DATA / "input_output.jsonl")
    assert ps.fmt == "input_output"
    assert [(r.prompt, r.answer) for r in ps.records] == [
        ("Reverse the string: abc", "cba"),
        ("How many legs does a spider have?", "8"),
    ]


def test_chat_answer_is_final_assistant_turn_else_answer_field() -> None:
    ps = load_prompts(DATA / "messages.jsonl")
    assert ps.fmt == "messages"
    solved, asked, open_ended = ps.records
    assert [t["role"] for t in solved.messages] == ["system", "user"]
    assert solved.answer == "6 * 7 = \\boxed{42}" and solved.prompt is None
    assert asked.messages == ({"role": "user", "content": "What is 2 ** 10?"},) and asked.answer == "1024"
    assert open_ended.answer is None


def test_code_tests_are_loaded() -> None:
    ps = load_prompts(DATA / "code.jsonl")
    assert ps.records[0].tests == ("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(0, 0) == 0")
    assert len(ps.records[1].tests) == 3


def test_trl_style_prompt_list_becomes_chat(tmp_path: Path) -> None:
    path = tmp_path / "trl.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "answer": "hello"}) + "\n")
    (record,) = load_prompts(path).records
    assert record.messages == ({"role": "user", "content": "hi"},) and record.answer == "hello"


def test_auto_detects_per_line_and_reports_mixed(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    lines = [{"prompt": "p"}, {"instruction": "i", "output": "o"}, {"input": "x", "output": "y"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")  # a trailing blank line is fine
    ps = load_prompts(path)
    assert ps.fmt == "mixed" and [r.prompt for r in ps.records] == ["p", "i", "x"]
    assert [r.line for r in ps.records] == [1, 2, 3]


def test_explicit_format_uses_that_formats_keys(tmp_path: Path) -> None:
    path = tmp_path / "alpaca.jsonl"
    path.write_text(json.dumps({"instruction": "Sum", "input": "1 2", "output": "3"}) + "\n")
    by_input = load_prompts(path, fmt="input_output").records[0]
    assert by_input.prompt == "1 2" and by_input.answer == "3" and by_input.meta == {"instruction": "Sum"}
    assert load_prompts(path, fmt="instruction_response").records[0].prompt == "Sum\n\n1 2"


def test_transform_file_maps_fields_and_drops_lines() -> None:
    ps = load_prompts(DATA / "custom.jsonl", transform=str(DATA / "transform.py") + ":to_prompt")
    assert ps.dropped == 1 and ps.skipped == 0 and len(ps) == 2
    assert ps.records[0].prompt == "What is 9 - 4?" and ps.records[0].answer == "5"
    assert ps.records[1].line == 2 and ps.records[1].meta == {"difficulty": "easy"}


def test_transform_module_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_transforms.py").write_text(
        "def upper(raw):\n    return {'prompt': raw['q'].upper(), 'answer': raw['a']}\n"
    )
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"q": "abc", "a": "1"}) + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (record,) = load_prompts(data, transform="my_transforms:upper").records
    assert record.prompt == "ABC" and record.answer == "1"


def test_tiny_example_prompt_set_fits_the_char_tokenizer() -> None:
    ps = load_prompts(EXAMPLES / "tiny" / "prompts.jsonl")
    assert ps.fmt == "prompt_answer" and 48 <= len(ps) <= 80
    prompts = [r.prompt for r in ps.records]
    assert len(set(prompts)) == len(prompts)
    assert all(1 <= len(p) <= 24 and all(32 <= ord(c) < 127 for c in p) for p in prompts)


def test_record_needs_exactly_one_of_prompt_and_messages() -> None:
    with pytest.raises(ValueError):
        PromptRecord(line=1)
    with pytest.raises(ValueError):
        PromptRecord(line=1, prompt="a", messages=({"role": "user", "content": "b"},))
    assert set(FORMATS) == {"prompt_answer", "instruction_response", "input_output", "messages"}
