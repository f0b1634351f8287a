"""The embedded GRPO engine: data, rewards, rollout, the GRPO math (`algos`), actor, step loop, profiling.

`compute_advantages` and `policy_loss` are re-exported here. They are resolved on first access
(PEP 562), so importing a light engine module (e.g. data loading) does not import torch; touching
either name imports torch and `grpo_pilot.engine.algos`, nothing heavier (no vLLM, no Ray).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_pilot.engine.algos.advantages import compute_advantages
    from grpo_pilot.engine.algos.policy_loss import policy_loss

__all__ = ["compute_advantages", "policy_loss"]

_EXPORTS = {
    "compute_advantages": "grpo_pilot.engine.algos.advantages",
    "policy_loss": "grpo_pilot.engine.algos.policy_loss",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'grpo_pilot.engine' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
