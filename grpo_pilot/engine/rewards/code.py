"""The `code` built-in: run the completion's code against the record's assert tests in a sandbox.

Code extraction: the last fenced block tagged python/py/python3 or untagged (```...```); an
unclosed fence (a truncated completion) runs to the end of the text; with no fence at all the
whole completion is the code. Score: the fraction of the record's tests that pass
(`mode=fraction`), or 1.0 only when all pass (`mode=all`). Each completion runs in its own
sandbox (see sandbox.py and isolation.py), `workers` at a time; the tests are judged in this process.
`sandbox=auto` uses bubblewrap, else util-linux unshare; where neither isolates, building the reward
fails unless the run allows unsandboxed code (`--allow-unsandboxed-code`).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Literal, Sequence

from pydantic import Field

from grpo_pilot.engine.data.records import PromptRecord
from grpo_pilot.engine.rewards.result import ScoreBatch, Scorer
from grpo_pilot.engine.rewards.sandbox import MIB, Isolation, SandboxLimits, resolve_isolation, run_many
from grpo_pilot.engine.rewards.sealed import unjudgeable_tests
from grpo_pilot.engine.rewards.settings import RewardSettings
from grpo_pilot.errors import InputError
from grpo_pilot.models import Frozen

_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
PYTHON_TAGS = frozenset({"", "python", "py", "python3"})


def extract_code(completion: str) -> str:
    """The Python code a completion gives (see the module docstring for the rule)."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(completion)]
    python = [body for tag, body in blocks if tag in PYTHON_TAGS]
    if python:
        return python[-1]
    if blocks:
        return ""
    return completion


def check_code_tests(records: Sequence[PromptRecord]) -> None:
    """Refuse records holding a test the parent cannot judge from reported values (sealed.py, judgeable.py):
    such a test would pass whatever the completion's code reports about itself."""
    bad = [(r.line, i, reason) for r in records for i, reason in unjudgeable_tests(r.tests)]
    if not bad:
        return
    line, index, reason = bad[0]
    others = sorted({b[0] for b in bad[1:]} - {line})
    more = f" (also line(s) {', '.join(map(str, others[:10]))}{' ...' if len(others) > 10 else ''})" if others else ""
    raise InputError(
        f"The 'code' reward cannot judge test {index + 1} of line {line}{more}: {reason}.",
        "A test passes only on what its asserts report, judged by grpo-run: write plain top-level asserts that "
        "compare the solution's result with a literal (assert add(2, 3) == 5), one per case.",
    )


def _default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class CodeOptions(Frozen):
    timeout_s: float = Field(default=5.0, gt=0, le=600, description="Wall-clock limit per completion.")
    cpu_s: float | None = Field(default=None, gt=0, le=600, description="CPU-time limit; default timeout_s.")
    memory_mb: int = Field(default=512, ge=64, description="Address-space limit per completion, MiB.")
    max_procs: int = Field(default=32, ge=1, le=4096, description="Processes/threads the code may start.")
    workers: int = Field(default_factory=_default_workers, ge=1, le=64, description="Completions run at once.")
    mode: Literal["fraction", "all"] = Field(default="fraction", description="fraction of tests, or all-or-nothing.")
    sandbox: Isolation = Field(default="auto", description="auto | bwrap | unshare | none (none needs the flag).")

    def limits(self) -> SandboxLimits:
        return SandboxLimits(
            timeout_s=self.timeout_s,
            cpu_s=self.cpu_s if self.cpu_s is not None else self.timeout_s,
            memory_bytes=self.memory_mb * MIB,
            max_procs=self.max_procs,
        )


def make_code(opts: CodeOptions, settings: RewardSettings) -> Scorer:
    limits = opts.limits()
    allow = settings.allow_unsandboxed_code
    mechanism = resolve_isolation(opts.sandbox, allow_unsandboxed=allow)  # refuse before any training
    if mechanism == "none":
        print(
            "warning: the 'code' reward runs completions' code WITHOUT a sandbox (resource limits only): "
            "it can read your files and use the network.",
            file=sys.stderr,
        )

    def score(batch: ScoreBatch) -> list[float]:
        jobs = [(extract_code(c), r.tests) for c, r in zip(batch.completions, batch.records)]
        results = run_many(jobs, limits, workers=opts.workers, isolation=mechanism, allow_unsandboxed=allow)
        if opts.mode == "all":
            return [1.0 if r.passed and all(r.passed) else 0.0 for r in results]
        return [r.fraction for r in results]

    return score
