"""Bad prompt files: the error names file, line and field; skip_invalid counts what it leaves out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_pilot.engine.data import load_prompts
from grpo_pilot.errors import InputError


def write(tmp_path: Path, *lines: str, name: str = "p.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"prompt": "ok", "answer": "1"})


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ("{not json", "field '<line>': not valid JSON"),
        ("[1, 2]", "expected a JSON object, got array"),
        (json.dumps({"answer": "3"}), "field 'prompt': no prompt field found (keys: answer)"),
        (json.dumps({"prompt": 5}), "field 'prompt': expected a string, got number"),
        (json.dumps({"prompt": "   "}), "field 'prompt': is empty"),
        (json.dumps({"prompt": "p", "answer": ["x"]}), "field 'answer': expected a string or a number, got array"),
        (json.dumps({"prompt": "p", "tests": ["assert 1", 2]}), "field 'tests[1]': expected a string, got number"),
        (json.dumps({"instruction": "i", "output": 3}), "field 'output': expected a string, got number"),
        (json.dumps({"messages": []}), "field 'messages': is an empty list"),
        (json.dumps({"messages": [{"role": "bot", "content": "x"}]}), "field 'messages[0].role': expected one of"),
        (
            json.dumps({"messages": [{"role": "user", "content": None}]}),
            "field 'messages[0].content': expected a string, got null",
        ),
        (json.dumps({"messages": [{"role": "assistant", "content": "x"}]}), "holds only an assistant turn"),
    ],
)
def test_error_names_file_line_and_field(tmp_path: Path, bad_line: str, expected: str) -> None:
    path = write(tmp_path, GOOD, "", bad_line, GOOD)  # blank line 2: the bad record is on line 3
    with pytest.raises(InputError) as info:
        load_prompts(path)
    message = info.value.paragraph()
    assert f"{path}:3: " in message and expected in message
    assert "--skip-invalid" in message


def test_all_problems_are_counted_and_first_ones_listed(tmp_path: Path) -> None:
    path = write(tmp_path, *(["{bad"] * 7 + [GOOD]))
    with pytest.raises(InputError) as info:
        load_prompts(path)
    message = info.value.message
    assert message.startswith("7 invalid line(s)") and f"{path}:5:" in message and f"{path}:6:" not in message
    assert "(and 2 more)" in message


def test_skip_invalid_keeps_good_lines_and_counts_bad_ones(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD, "{bad", json.dumps({"prompt": 1}), json.dumps({"prompt": "fine"}))
    ps = load_prompts(path, skip_invalid=True)
    assert [r.line for r in ps.records] == [1, 4] and ps.skipped == 2
    assert ps.skip_reasons[0].startswith(f"{path}:2: ") and "field 'prompt'" in ps.skip_reasons[1]


def test_empty_and_all_invalid_files_are_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no usable prompt: it has no JSON lines"):
        load_prompts(write(tmp_path, "", "  ", name="empty.jsonl"))
    with pytest.raises(InputError, match="all 2 non-blank line"):
        load_prompts(write(tmp_path, "{x", "{y", name="bad.jsonl"), skip_invalid=True)


def test_missing_file_directory_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match="not a regular file"):
        load_prompts(tmp_path)
    with pytest.raises(InputError, match="Unknown prompt format 'csv'") as info:
        load_prompts(write(tmp_path, GOOD), fmt="csv")
    assert "prompt_answer, instruction_response, input_output, messages" in info.value.hint


def test_explicit_format_requires_its_field(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps({"prompt": "p"}))
    with pytest.raises(InputError, match=r":1: field 'messages': missing"):
        load_prompts(path, fmt="messages")


def test_non_utf8_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + '{"prompt": "caf\xe9"}'.encode("latin-1") + b"\n")
    with pytest.raises(InputError, match=r"latin1.jsonl:2: not valid UTF-8"):
        load_prompts(path)


def test_transform_errors_name_line_and_transform(tmp_path: Path) -> None:
    (tmp_path / "tf.py").write_text(
        "def pick(raw):\n    return {'prompt': raw['q']}\n\ndef wrong(raw):\n    return ['prompt']\n"
    )
    data = write(tmp_path, json.dumps({"q": "a"}), json.dumps({"x": "b"}))
    with pytest.raises(InputError) as info:
        load_prompts(data, transform=f"{tmp_path / 'tf.py'}:pick")
    assert f"{data}:2: field '<transform>'" in info.value.message and "KeyError" in info.value.message
    ps = load_prompts(data, transform=f"{tmp_path / 'tf.py'}:pick", skip_invalid=True)
    assert len(ps) == 1 and ps.skipped == 1
    with pytest.raises(InputError, match="returned list; it must return a dict or None"):
        load_prompts(data, transform=f"{tmp_path / 'tf.py'}:wrong")


def test_bad_transform_references(tmp_path: Path) -> None:
    data = write(tmp_path, GOOD)
    with pytest.raises(InputError, match="not of the form module:function"):
        load_prompts(data, transform="no_colon")
    with pytest.raises(InputError, match="not a file"):
        load_prompts(data, transform="missing/file.py:f")
    (tmp_path / "tf2.py").write_text("def real(raw):\n    return raw\n")
    with pytest.raises(InputError, match="has no attribute 'nope'") as info:
        load_prompts(data, transform=f"{tmp_path / 'tf2.py'}:nope")
    assert info.value.hint == "Functions defined there: real."
    (tmp_path / "boom.py").write_text("raise RuntimeError('at import')\n")
    with pytest.raises(InputError, match="raised RuntimeError: at import"):
        load_prompts(data, transform=f"{tmp_path / 'boom.py'}:f")
    with pytest.raises(InputError, match="module 'surely_not_a_module_xyz' is not importable"):
        load_prompts(data, transform="surely_not_a_module_xyz:f")
