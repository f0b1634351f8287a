"""`RewardSettings`: run-level settings of the rewards that are not part of a reward spec."""

from __future__ import annotations

from pydantic import Field

from grpo_pilot.engine.data.callables import DEFAULT_USER_CODE_TIMEOUT_S
from grpo_pilot.models import Frozen


class RewardSettings(Frozen):
    """How user code and the `code` reward may run (from the run config / grpo-run flags)."""

    user_code_timeout_s: float = Field(
        default=DEFAULT_USER_CODE_TIMEOUT_S, gt=0, le=86_400, description="Limit per call of a user reward function."
    )
    allow_unsandboxed_code: bool = Field(
        default=False, description="Let the `code` reward run without a sandbox where the machine has none."
    )
