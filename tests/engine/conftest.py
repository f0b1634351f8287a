"""Engine tests run tiny models on one thread: steadier on a shared 2-core box (environment.md)."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
