"""Hostile code against the sandbox, as root and as an unprivileged user, through bwrap and unshare.

Every case in `sandbox_cases.py` (network, files left outside, surviving processes, forged passes by
exit / frame inspection / patched builtins / channel writes, signals to the parent, secrets) runs
in this process (root here and in CI) and again in a subprocess started as uid 54321 with `setpriv`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from sandbox_cases import CASES, run_case

from grpo_pilot.engine.rewards import isolation

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
UNPRIVILEGED_UID = 54321
MECHANISMS = ("bwrap", "unshare")


def _require(mechanism: str) -> None:
    report = isolation.probe(mechanism)  # type: ignore[arg-type]
    if not report.available:
        pytest.skip(f"{mechanism} gives no isolation on this machine: {report.reason}")


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_code_as_this_user(case: str, mechanism: str) -> None:
    _require(mechanism)
    ok, detail = run_case(case, mechanism)
    assert ok, detail


def _unprivileged_python() -> tuple[list[str], dict[str, str]] | str:
    """(command prefix, env) that runs a Python importing grpo_pilot as uid 54321, or why there is none."""
    if os.geteuid() != 0:
        return "the tests are not running as root, so they already ran as an unprivileged user"
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "setpriv (util-linux) is not installed"
    prefix = [setpriv, f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}", "--clear-groups"]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), sysconfig.get_paths()["purelib"]]),
    }
    version = "%d.%d" % sys.version_info[:2]
    for python in (sys.executable, f"/usr/bin/python{version}", "/usr/local/bin/python" + version):
        probe = subprocess.run(
            [*prefix, python, "-c", "import grpo_pilot, pydantic"], env=env, cwd="/tmp", capture_output=True
        )
        if probe.returncode == 0:
            return [*prefix, python], env
    return f"no Python {version} that uid {UNPRIVILEGED_UID} can run reaches this checkout and its packages"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_hostile_code_as_an_unprivileged_user(mechanism: str) -> None:
    _require(mechanism)
    found = _unprivileged_python()
    if isinstance(found, str):
        pytest.skip(found)
    prefix, env = found
    out = subprocess.run(
        [*prefix, str(HERE / "sandbox_cases.py"), mechanism],
        env=env,
        cwd="/tmp",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(results) == set(CASES)
    failed = {case: detail for case, (ok, detail) in results.items() if not ok}
    assert not failed, failed
    assert "uid 54321" in results["correct_solution_passes"][1] or "uid 0" in results["correct_solution_passes"][1]


def test_check_sandbox_reports_both_mechanisms() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from grpo_pilot.cli import run_entry; run_entry()", "--check-sandbox"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert "bubblewrap:" in out.stdout and "util-linux unshare:" in out.stdout
    available = [m for m in MECHANISMS if isolation.probe(m).available]  # type: ignore[arg-type]
    if available:
        assert out.returncode == 0 and f"=> the code reward runs in: {available[0]}" in out.stdout
        assert "Network is unreachable" in out.stdout and "Read-only file system" in out.stdout
    else:
        assert out.returncode == 1 and "--allow-unsandboxed-code" in out.stdout
