"""Fixtures of the hostile-input suite (helpers in hostile_helpers.py)."""

from __future__ import annotations

from hostile_helpers import one_thread, scratch

__all__ = ["one_thread", "scratch"]
