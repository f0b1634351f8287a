"""vLLM's own `max_num_seqs` when its caller leaves it unset, by engine, vLLM version and device.

verl before beb624610 (#2960) never passed rollout.max_num_seqs (`verl_versions.CHANGES` "max_num_seqs_passed"),
so this default is what its engine ran with. verl builds the engine with `vllm.LLM(...)` (vllm_rollout_spmd.py),
whose usage context is LLM_CLASS; the async server's OPENAI_API_SERVER context has the same max_num_seqs in every
version below, so the context does not matter here.

- V0 engine: 256 in every version (vllm/engine/arg_utils.py `_set_default_args_v0`, v0.8.3; EngineArgs.max_num_seqs
  in verl's vendored vLLM 0.5.4, third_party/vllm/vllm_v_0_5_4/arg_utils.py line 87).
- V1 engine up to vLLM 0.8.3: 1024 on every device (arg_utils.py `_set_default_args_v1`, v0.8.3; 0.7.x's
  `EngineArgs.__post_init__`, "256 if not envs.VLLM_USE_V1 else 1024").
- V1 from vLLM 0.8.4: 1024 only where the device reports at least 70 GiB (`current_platform.
  get_device_total_memory()`), 256 below (vllm-project/vllm #16158 "[V1] Revert the default max_num_seqs to V0
  values for most hardware", opened 2025-04-07, after v0.8.3 was tagged on 2025-04-06).
- V1 from vLLM 0.9.0: the large-device branch also requires a device name without "a100" (#17885, "[Perf] Use
  small max_num_batched_tokens for A100", opened 2025-05-09, after v0.8.5): an A100-80GB gets 256. The same test
  stands in `EngineArgs.get_batch_defaults` today (vllm 0.32.0 arg_utils.py, read from the installed wheel).

The release each PR first shipped in is read from the PR dates against the release dates (v0.8.3 2025-04-06,
v0.8.4 2025-04-14, v0.9.0 2025-05-15), not from a tag checkout.
"""

from __future__ import annotations

import re

from grpo_pilot.hardware.gpus import GPUSpec
from grpo_pilot.units import GiB

VLLM_DEFAULT_MAX_NUM_SEQS = {"v0": 256, "v1": 1024}  # vLLM 0.8.3 (see the module docstring)
V1_SMALL_DEVICE_MAX_NUM_SEQS = 256  # #16158 (vLLM >= 0.8.4): devices under the threshold
V1_LARGE_DEVICE_BYTES = 70 * GiB  # #16158: `device_memory >= 70 * GiB_bytes`
DEVICE_RULE_FROM = (0, 8, 4)  # first release with #16158
A100_RULE_FROM = (0, 9, 0)  # first release with #17885
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def parse_vllm_version(text: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version string such as '0.8.5.post1' or '0.6.3+rocm624'; None if unreadable."""
    m = _VERSION.match(text.strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def device_gets_large_default(gpu: GPUSpec, version: tuple[int, int, int]) -> bool:
    """Whether vLLM `version`'s V1 engine gives this device the large (1024) default."""
    if version < DEVICE_RULE_FROM:
        return True
    a100 = version >= A100_RULE_FROM and "a100" in gpu.name.lower()
    return gpu.memory_bytes >= V1_LARGE_DEVICE_BYTES and not a100


def vllm_default_max_num_seqs(engine: str, version: tuple[int, int, int], gpu: GPUSpec | None) -> int | None:
    """vLLM `version`'s default max_num_seqs for the engine ('v0' / 'v1') on `gpu`; None where it depends on a
    device that is not known (V1 from 0.8.4 without a GPU, or the cpu pseudo-device, whose platform differs)."""
    if engine == "v0":
        return VLLM_DEFAULT_MAX_NUM_SEQS["v0"]
    if version < DEVICE_RULE_FROM:
        return VLLM_DEFAULT_MAX_NUM_SEQS["v1"]
    if gpu is None or gpu.is_cpu:
        return None
    return VLLM_DEFAULT_MAX_NUM_SEQS["v1"] if device_gets_large_default(gpu, version) else V1_SMALL_DEVICE_MAX_NUM_SEQS
