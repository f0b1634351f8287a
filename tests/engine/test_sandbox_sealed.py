"""Sealed tests: what the sandbox sees of an assert, and how the parent judges the values it reports."""

from __future__ import annotations

import time

import pytest

from grpo_pilot.engine.rewards.sealed import decode, judge, seal_tests


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
        ("assert sorted(f(3)) == [1, 2, 3]", [1, 2, 3], True),  # sorted(f(3)) runs in the sandbox
        ("assert not is_prime(4)", True, True),  # nothing to hide: the sandbox reports `not is_prime(4)`
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


def test_required_and_optional_asserts() -> None:
    tests = [
        "assert f(1) == 2",
        "for a in range(3):\n    assert sq(a) == a * a",
        "def check(c):\n    assert c(1) == 2\n    if c(0) is None:\n        assert False\ncheck(f)",
    ]
    sealed = seal_tests(tests)
    assert [a.required for a in sealed.asserts] == [True, True, True, False]
    # the test ended, but its required assert never reported: a forged end-of-test message is not a pass
    assert judge(sealed, ended(0, 1, 2)) == (False, False, False)
    loop = [probe(1, True), probe(1, True), probe(1, False)]  # one failing iteration fails the test
    assert judge(sealed, [probe(0, 2), *loop, probe(2, 2), *ended(0, 1, 2)]) == (True, False, True)
    assert judge(sealed, [probe(0, 2), probe(0, 3), probe(2, 2), probe(3), *ended(0, 2)]) == (False, False, False)


def test_unfinished_and_unparsable_tests_fail() -> None:
    sealed = seal_tests(["assert f() == 1", "def broken(:"])
    assert sealed.sources[1] is None
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
