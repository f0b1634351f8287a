"""grpo-run's engine against hostile input: code tests it cannot judge, forged rewards, poisoned checkpoints,
non-finite numbers, foreign files in --out, signals (issue 16). Each case checks the exit status the README
documents, the one-paragraph message, and that nothing was left half-written."""

from __future__ import annotations

import json

import pytest
from hostile_helpers import RUN_GOOD, TINY_PLAN, assert_refused, invoke

from grpo_pilot.cli_run import app

RUN_CODE = [a if a != "char_fraction:char=a" else "code:timeout_s=5" for a in RUN_GOOD] + ["--allow-unsandboxed-code"]

UNJUDGEABLE_TESTS = [
    ("raise-instead-of-assert", "if add(2, 3) != 5:\n    raise AssertionError", "has no assert"),
    ("no-assert", "add(2, 3)", "has no assert"),
    ("assert-under-if", "if add(2, 3):\n    assert add(2, 3) == 5", "run only on some paths"),
    ("expected-in-sandbox", "x = 5\nassert add(2, 3) == x", "compares two values computed in the sandbox"),
]


@pytest.mark.parametrize("name,test,fragment", UNJUDGEABLE_TESTS, ids=[c[0] for c in UNJUDGEABLE_TESTS])
def test_code_tests_that_cannot_be_judged_are_refused(scratch, tmp_path, name, test, fragment):
    data = tmp_path / "code.jsonl"
    lines = [{"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3"]}] * 2
    lines.append({"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3", test]})
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    scratch.mark()
    args = [TINY_PLAN, *RUN_CODE, "--dataset", data, "--out", scratch.root / "run"]
    assert_refused(invoke(app, args), 2, "cannot judge test 2 of line 3", fragment)
    scratch.check()
