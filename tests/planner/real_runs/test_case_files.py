"""The held-out and launch-family case files (cases_heldout.json, cases_families.json) are well formed.

These cases are not asserted against grpo-plan's verdicts here (HELDOUT.md records what it says today);
this checks what every case must carry so a reader can find the run: sources, stored launch files,
outcomes in the documented vocabulary, and no length statistics without a source.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import HERE, command, evaluate, load_cases, main  # noqa: E402

FILES = ("cases_heldout.json", "cases_families.json")
FAMILIES = {"ppo-critic", "megatron", "lora", "sglang", "trl-lora", "trl-qlora"}
EVERY_ID = {c["id"] for name in FILES for c in load_cases(HERE / name)}
PHASES = {"rollout", "old_log_prob", "ref", "values", "update_critic", "update"}


@pytest.mark.parametrize("name", FILES)
def test_case_file_is_documented(name: str) -> None:
    cases = load_cases(HERE / name)
    ids = {c["id"] for c in cases}
    assert len(ids) == len(cases) >= 10
    for case in cases:
        assert case["source"]["launch"] and case["source"]["outcome"], case["id"]
        assert case["outcome"]["status"] in ("ran", "oom"), case["id"]
        launch = case["launch"]
        assert (HERE / launch["file"]).is_file(), case["id"]
        if launch.get("transcribed_from"):
            assert (HERE / launch["transcribed_from"]).is_file() and launch.get("why_transcribed"), case["id"]
        for extra in ("overrides", "pins"):
            if launch.get(extra):
                assert launch.get(f"why_{extra}"), (case["id"], extra)
        lengths = case.get("lengths")
        assert lengths is None or lengths.get("source"), case["id"]
        assert set(case["outcome"].get("phase_s", {})) <= PHASES, case["id"]
        for key in ("fixed_by", "fixes", "contrast"):  # a case of either file (the same launch, another commit)
            if key in case["outcome"]:
                assert case["outcome"][key] in ids | EVERY_ID, (case["id"], key)
        if name == "cases_families.json":
            family = case["family"]
            assert set(family if isinstance(family, list) else [family]) <= FAMILIES, case["id"]


def test_oom_cases_and_phase_times_are_present() -> None:
    heldout = load_cases(HERE / "cases_heldout.json")
    assert sum(c["outcome"]["status"] == "oom" for c in heldout) >= 3
    assert any(c["outcome"].get("phase_s") for c in heldout)
    families = load_cases(HERE / "cases_families.json")
    for family in ("ppo-critic", "megatron", "lora", "sglang"):
        members = [c for c in families if family in (c["family"] if isinstance(c["family"], list) else [c["family"]])]
        assert len(members) >= 2, family


def test_a_refusal_is_recorded_not_raised() -> None:
    """evaluate() returns grpo-plan's exit code and message for a launch it refuses (exit 2)."""
    case = next(c for c in load_cases(HERE / "cases_families.json") if c["id"].startswith("verl-qwen3moe"))
    answer = evaluate(case)
    assert answer["exit_code"] == 2 and answer["plan"] is None
    assert "Mixture-of-Experts model under Megatron" in answer["error"]
    assert command(case)[:2] == ["--from-verl", str(HERE / case["launch"]["file"])]


def test_corpus_prints_a_case_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--file", "cases_families.json"]) == 0
    out = capsys.readouterr().out
    assert "| verl-one-step-off-colocate-fsdp2-sglang" in out and "Refused:" in out
    assert "| verl-mi300-ppo-deepseek-llm-7b-8xMI300X | values |" in out  # the critic's phases are tabled
