"""The torch device a run (and each of its workers) computes on, from the run config's `device` setting."""

from __future__ import annotations

import torch

from grpo_pilot.errors import InputError


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise InputError("device = cuda was asked for but torch sees no CUDA device.", "Use --device cpu or auto.")
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
