"""The public contract of `estimate_memory`: signature, purity, calibratable overheads, speed."""

from __future__ import annotations

import inspect

from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS, Overheads


def test_signature_is_the_agreed_one() -> None:
    sig = inspect.signature(estimate_memory)
    assert list(sig.parameters)[:4] == ["model", "cluster", "workload", "knobs"]
    assert (
        sig.parameters["target"].kind is inspect.Parameter.KEYWORD_ONLY
        and sig.parameters["target"].default == "grpo-pilot"
    )
    assert (
        sig.parameters["overheads"].kind is inspect.Parameter.KEYWORD_ONLY
        and sig.parameters["overheads"].default is DEFAULT_OVERHEADS
    )


def test_pure_same_inputs_same_report(spec_of, cluster_of) -> None:
    args = (spec_of("qwen3-8b"), cluster_of("2x8xH100-80G"), Workload(), Knobs(max_token_len_per_gpu=12000))
    assert estimate_memory(*args, target="verl") == estimate_memory(*args, target="verl")


def test_overheads_are_calibratable(spec_of, cluster_of) -> None:
    args = (spec_of("qwen2.5-7b"), cluster_of("8xA100-80G"), Workload(), Knobs())
    base = estimate_memory(*args)
    custom = Overheads(
        cuda_context_bytes=1 << 30,
        fragmentation_factor=1.0,
        nccl_bytes_per_communicator=0,
        weight_sync_bucket_bytes=1 << 29,
    )
    cal = estimate_memory(*args, overheads=custom)
    upd = cal.phases["update"].items
    assert upd["overhead_cuda_context"] == 1 << 30 and upd["overhead_fragmentation"] == 0 and upd["overhead_nccl"] == 0
    assert cal.phases["weight_sync"].items["weight_sync_bucket"] == 1 << 29
    # tensor items do not depend on overheads
    assert cal.phases["update"].tensor_bytes == base.phases["update"].tensor_bytes
    # fragmentation is (factor − 1) × the trainer's tensor bytes of the phase (the vLLM pool is not the trainer's)
    upd = base.phases["update"]
    trainer = upd.tensor_bytes - sum(v for k, v in upd.items.items() if k.startswith("vllm_"))
    assert trainer < upd.tensor_bytes
    assert upd.items["overhead_fragmentation"] == int(0.10 * trainer)
