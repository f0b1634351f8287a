"""Sealed tests: what the sandbox sees of an assert, and how the parent judges the values it reports."""

from __future__ import annotations

import time

import pytest

from grpo_pilot.engine.rewards.sealed import decode, judge, seal_tests, unjudgeable_tests


def probe(assert_id: int, *values: object) -> dict[str, object]:
    return {"k": "probe", "a": assert_id, "v": list(values)}


def ended(*indices: int) -> list[dict[str, object]]:
    return [{"k": "test", "i": i, "ok": True} for i in indices]


def test_expected_literals_never_reach_the_sandbox() -> None:
    sealed = seal_tests(
        ["assert add(2, 3) == 5", "assert abs(area(2) - 12.566370614) < 1e-6", "assert f('x') == 'SEKRIT'"]
    )
    assert sealed.sources[0] == "__grpo_probe__(0, lambda: add(2, 3))"
    assert sealed.sources[1] == "__grpo_probe__(1, lambda: area(2))"
    assert "SEKRIT" not in sealed.sources[2] and "12.566" not in sealed.sources[1] and "5" not in sealed.sources[0]


@pytest.mark.parametrize(
    ("test", "value", "expected"),
    [
        ("assert add(2, 3) == 5", 5, True),
        ("assert add(2, 3) == 5", 6, False),
        ("assert add(2, 3) == 5", "5", False),
        ("assert pair() == (1, 2)", {"t": [1, 2]}, True),
        ("assert pair() == (1, 2)", [1, 2], False),
        ("assert abs(area(2) - 12.566) < 1e-3", 12.5663, True),
        ("assert math.isclose(area(2), 12.566, rel_tol=1e-3)", 12.5663, True),
        ("assert f(3) is None", None, True),
        ("assert 0 < f(3) <= 8", 8, True),
        ("assert f(3) in (1, 2)", 3, False),
        ("assert sorted(f(3)) == [1, 2, 3]", [3, 1, 2], True),  # the sandbox reports f(3); sorted() runs here
        ("assert not is_prime(4)", False, True),  # the sandbox reports is_prime(4); `not` runs here
        ("assert not is_prime(4)", True, False),
        ("assert f(1) and f(2)", False, False),  # the second probe is not needed: `and` short-circuits here
        ("assert f() == {'a': 1}", {"d": [["a", 1]]}, True),
        ("assert f() == {1, 2}", {"s": [2, 1]}, True),
        ("assert f() == 5", {"o": "Equal"}, False),
        ("assert f() == 5", {"r": "ValueError"}, False),
        ("assert f() != 5", {"o": "Equal"}, True),
    ],
)
def test_the_parent_evaluates_each_assert(test: str, value: object, expected: bool) -> None:
    sealed = seal_tests([test])
    assert judge(sealed, [probe(0, value), *ended(0)]) == (expected,)


def test_every_assert_must_report_and_the_end_message_is_not_enough() -> None:
    tests = [
        "assert f(1) == 2",
        "def check(c):\n    assert c(1) == 2\n    assert c(2) == 3\ncheck(f)",
        "if __name__ == '__main__':\n    assert f(5) == 6",
    ]
    sealed = seal_tests(tests)
    assert sealed.problems == (None, None, None)
    assert sealed.sources[2] == "__grpo_probe__(3, lambda: f(5))"  # the guard is unwrapped: the assert runs
    # a forged end-of-test message for every test, with no report of the asserts: nothing passes
    assert judge(sealed, ended(0, 1, 2)) == (False, False, False)
    # the asserts of `check` report but one never does: that test fails, the others pass
    assert judge(sealed, [probe(0, 2), probe(1, 2), probe(3, 6), *ended(0, 1, 2)]) == (True, False, True)
    # every report must hold: a second, failing report of an assert fails its test
    assert judge(sealed, [probe(0, 2), probe(0, 3), *ended(0)])[0] is False
    # values that hold but no end-of-test message (the snippet raised or was killed): not a pass either
    assert judge(sealed, [probe(0, 2)])[0] is False


UNJUDGEABLE = [
    ("if add(2, 3) != 5:\n    raise AssertionError", "has no assert"),
    ("add(2, 3)", "has no assert"),
    ("if x:\n    assert f(1) == 2", "run only on some paths"),
    ("for i in range(3):\n    assert sq(i) == 4", "run only on some paths"),
    ("while True:\n    assert f() == 1\n    break", "run only on some paths"),
    ("try:\n    assert f() == 1\nexcept Exception:\n    pass", "run only on some paths"),
    ("def check(c):\n    if c(0) is None:\n        assert False\ncheck(f)", "run only on some paths"),
    ("assert f(1) == 2\nif f(3) != 4:\n    raise ValueError", "fails by `raise`"),
    ("expected = 5\nassert f() == expected", "compares two values computed in the sandbox ('f()' and 'expected')"),
    ("assert f(1) == f(2)", "compares two values computed in the sandbox"),
    ("assert all(f(x) == y for x, y in [(1, 2)])", "would run in the sandbox"),
    ("ok = f(1) == 2\nassert ok", "'ok' is set by the test from a comparison"),
    ("def same(a, b):\n    return a == b\nassert same(f(1), 2)", "uses 'same'"),
    ("def broken(:", "not valid Python"),
]


@pytest.mark.parametrize(("test", "reason"), UNJUDGEABLE)
def test_shapes_the_parent_cannot_judge_never_pass(test: str, reason: str) -> None:
    sealed = seal_tests([test])
    assert sealed.problems[0] is not None and reason in sealed.problems[0], sealed.problems[0]
    assert unjudgeable_tests(["assert f(1) == 2", test]) == [(1, sealed.problems[0])]
    # whatever the sandbox reports (every assert holding, the test ending), the test does not pass
    holding = [probe(a, *([2] * 4)) for a in range(len(sealed.asserts))]
    assert judge(sealed, [*holding, *ended(0)]) == (False,)


def test_unfinished_and_unparsable_tests_fail() -> None:
    sealed = seal_tests(["assert f() == 1", "def broken(:"])
    assert sealed.sources[1] is None and sealed.problems[1] == "it is not valid Python"
    assert judge(sealed, [probe(0, 1)]) == (False, False)  # no end-of-test message: the snippet raised
    assert judge(sealed, [probe(0, 1), {"k": "test", "i": 0, "ok": False}, *ended(0, 1)]) == (False, False)


def test_hostile_values_cost_bounded_time() -> None:
    sealed = seal_tests(["assert 'ab' * f() == 'abab'", "assert 2 ** f() == 4", "assert f() == [1]"])
    deep: object = 1
    for _ in range(10_000):
        deep = [deep]
    start = time.perf_counter()
    verdict = judge(sealed, [probe(0, 10**12), probe(1, 10**12), probe(2, deep), *ended(0, 1, 2)])
    assert verdict == (False, False, False) and time.perf_counter() - start < 1.0


def test_decode_keeps_plain_types_apart() -> None:
    assert decode({"t": [1, {"fs": [2]}]}) == (1, frozenset({2}))
    assert decode({"b": "6869"}) == b"hi" and decode({"c": [1, 2]}) == 1 + 2j
    assert decode({"s": [[1]]}) != {1}  # an unhashable member: opaque, equal to nothing
    assert decode({"x": 1, "y": 2}) != {"x": 1, "y": 2}
