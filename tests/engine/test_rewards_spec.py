"""Reward spec grammar: terms, weights, options, quoting, and the errors for bad specs."""

from __future__ import annotations

import pytest

from grpo_pilot.engine.data import PromptRecord
from grpo_pilot.engine.rewards import BUILTINS, build_reward, parse_spec
from grpo_pilot.engine.rewards.spec import split_top_level
from grpo_pilot.errors import InputError

NAMES = tuple(BUILTINS)


def terms(spec: str) -> list[tuple[str, str, float, dict[str, str]]]:
    return [(t.kind, t.name, t.weight, t.options) for t in parse_spec(spec, NAMES)]


def test_weights_and_options() -> None:
    assert terms("exact_match") == [("builtin", "exact_match", 1.0, {})]
    assert terms("exact_match=1.0, format=0.5") == [
        ("builtin", "exact_match", 1.0, {}),
        ("builtin", "format", 0.5, {}),
    ]
    assert terms("overlong=-0.5:max_len=512;cache_len=128") == [
        ("builtin", "overlong", -0.5, {"max_len": "512", "cache_len": "128"})
    ]
    assert terms("char_fraction:char=a;weight=2") == [("builtin", "char_fraction", 2.0, {"char": "a"})]


def test_callables_with_and_without_weight() -> None:
    assert terms("mypkg.mod:fn") == [("callable", "mypkg.mod:fn", 1.0, {})]
    assert terms("path/to/file.py:fn=0.5,exact_match") == [
        ("callable", "path/to/file.py:fn", 0.5, {}),
        ("builtin", "exact_match", 1.0, {}),
    ]
    # a module whose name starts like a built-in is still a module
    assert terms("format_utils.x:score") == [("callable", "format_utils.x:score", 1.0, {})]


def test_regex_values_keep_backslashes_and_bracketed_commas() -> None:
    (term,) = parse_spec(r"format:pattern=\d{1,3}$;match=partial", NAMES)
    assert term.options == {"pattern": r"\d{1,3}$", "match": "partial"}
    (term, second) = parse_spec(r'format:pattern="a,b;c\"d\s",length:max_len=4', NAMES)
    assert term.options == {"pattern": r'a,b;c"d\s'} and second.options == {"max_len": "4"}
    assert split_top_level(r"a\,b,c", ",") == [r"a\,b", "c"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "The reward spec is empty"),
        ("exact_match,,format", "has an empty term"),
        ("exact", "Unknown reward 'exact'. Did you mean 'exact_match'?"),
        ("format=abc", "weight 'abc' is not a finite number"),
        ("format=inf", "weight 'inf' is not a finite number"),
        ("format=0.5:weight=2", "gives its weight twice"),
        ("format:pattern=a;pattern=b", "option 'pattern' is given twice"),
        ("format:pattern", "is not of the form key=value"),
        ("format:flavour=x", "The 'format' reward has no option 'flavour'"),
        ("format:pattern=(", "not a valid regular expression"),
        ("format:match=middle", "Bad options for the 'format' reward: match"),
        ("overlong:max_len=10", "cache_len: Field required"),
        ("overlong:max_len=10;cache_len=20", "cache_len (20) must not exceed max_len (10)"),
        ("length:max_len=0", "max_len: Input should be greater than 0"),
        ("char_fraction:char=ab", "char: String should have at most 1 character"),
        ("code:timeout_s=fast", "timeout_s: Input should be a valid number"),
    ],
)
def test_bad_specs_are_input_errors(spec: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        build_reward(spec)
    assert message in info.value.message


def test_unknown_reward_lists_the_builtins() -> None:
    with pytest.raises(InputError) as info:
        build_reward("bogus")
    for name in ("exact_match", "format", "code", "length", "overlong", "char_fraction"):
        assert name in info.value.hint
    assert "module:function" in info.value.hint


def test_option_errors_list_the_options() -> None:
    with pytest.raises(InputError) as info:
        build_reward("overlong:max_len=10;cachelen=2")
    assert "cache_len (int, required)" in info.value.hint and "unit (tokens|chars, default 'tokens')" in info.value.hint


def test_repeated_builtins_get_distinct_labels() -> None:
    model = build_reward("format, format=2:pattern=x;match=partial")
    assert model.labels == ("format", "format#2") and model.describe() == "1 x format + 2 x format#2"
    result = model.score(["<think>a</think> b", "x"], [PromptRecord(line=1, prompt="p")] * 2)
    assert result.parts == {"format": (1.0, 0.0), "format#2": (0.0, 1.0)}
    assert result.total == (1.0, 2.0) and result.weights == {"format": 1.0, "format#2": 2.0}
