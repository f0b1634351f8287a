"""Per-token KL estimators between the policy and the frozen reference policy.

Shapes: `logprobs`, `ref_logprobs` [B, T] (log π_θ and log π_ref of the sampled tokens); result [B, T].
With d = log π_θ − log π_ref (Schulman, "Approximating KL divergence", 2020, joschu.net/blog/kl-approx.html):

| kind                     | value                  | ∂/∂ log π_θ        |
|--------------------------|------------------------|--------------------|
| `k1` (alias `kl`)        | d                      | 1                  |
| `k2` (alias `mse`)       | ½ d²                   | d                  |
| `k3` (alias `low_var_kl`)| e^{−d} + d − 1         | 1 − e^{−d}         |
| `abs`                    | |d|                    | sign(d)            |

k3 follows verl's `kl_penalty` ("low_var_kl", verl/trainer/ppo/core_algos.py): the exponent
argument −d is clamped to [−20, 20] and the value to [−10, 10] (outside those ranges the gradient
is 0). TRL's `beta` term is the same k3 without the clamps (TRL 1.16 `_compute_loss`), and by
default TRL ≥ 1.x multiplies it by the importance ratio (`use_bias_correction_kl`); we do not.
The KL is a loss term (GRPO, arXiv 2402.03300 eq. 3), never folded into the reward here.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from grpo_pilot.errors import InputError

KLType = Literal["k1", "k2", "k3", "low_var_kl", "kl", "mse", "abs"]
_CANONICAL: dict[str, str] = {
    "k1": "k1",
    "kl": "k1",
    "k2": "k2",
    "mse": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
    "abs": "abs",
}
KL_TYPES: tuple[str, ...] = tuple(_CANONICAL)

# verl's low_var_kl clamps (core_algos.kl_penalty): exponent argument ±20, value ±10.
K3_EXP_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def canonical_kl_type(kind: str) -> str:
    """'k1' | 'k2' | 'k3' | 'abs' for a kind or alias; `InputError` for an unknown one."""
    try:
        return _CANONICAL[kind]
    except KeyError:
        raise InputError(
            f"Unknown KL estimator '{kind}'.",
            f"Use one of {', '.join(KL_TYPES)} (k3 = low_var_kl, the GRPO default).",
        ) from None


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate [B, T] of π_θ against π_ref (table above); differentiable in `logprobs`.

    `ref_logprobs` is treated as a constant (detached).
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} must match")
    canonical = canonical_kl_type(kind)
    diff = logprobs - ref_logprobs.detach()
    if canonical == "k1":
        return diff
    if canonical == "k2":
        return 0.5 * diff.square()
    if canonical == "abs":
        return diff.abs()
    neg = torch.clamp(-diff, min=-K3_EXP_CLAMP, max=K3_EXP_CLAMP)  # log(π_ref/π_θ)
    return torch.clamp(torch.exp(neg) - neg - 1.0, min=-K3_VALUE_CLAMP, max=K3_VALUE_CLAMP)
