"""Tuner test fixtures."""

from __future__ import annotations

import pytest
from tune_helpers import Events


@pytest.fixture
def events() -> Events:
    return Events()
