"""verl's FSDP reference is under FSDP CPUOffload whatever ref.fsdp_config.param_offload since fefca4172 (#121;
FSDP2 CPUOffloadPolicy from db84a4007, #1026): planner/ref_offload.py. The estimate keeps no reference shard on
the GPU in any phase of such a launch, streams it in per micro-batch for its pass, and the search does not offer the
key for it; our engine, TRL, a pre-#121 verl and verl's Megatron reference keep following the key."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_pilot.hardware.cluster import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.knob_space import ANALYTIC_GRID, knob_choices
from grpo_pilot.planner.ref_offload import ref_offload_mode
from grpo_pilot.planner.timing import log_prob_time_s
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles import resolve_model

KL = Workload(use_kl_loss=True)
PHASES = ("rollout", "log_prob", "update", "weight_sync")


@pytest.mark.parametrize(
    ("target", "knobs", "mode"),
    [
        ("verl", {}, "streamed"),  # today's verl: forced whatever the key
        ("verl", {"ref_param_offload": True}, "streamed"),
        ("verl", {"ref_forced_cpu_offload": False}, "resident"),  # before #121
        ("verl", {"ref_forced_cpu_offload": False, "ref_param_offload": True}, "loaded"),  # load/offload around
        ("verl", {"strategy": "megatron"}, "resident"),  # megatron_workers honour ref.megatron.param_offload
        ("verl", {"strategy": "megatron", "ref_param_offload": True}, "loaded"),
        ("grpo-pilot", {}, "resident"),  # the knob's default is True but only verl forces
        ("grpo-pilot", {"ref_param_offload": True}, "streamed"),  # FSDP2 CPUOffloadPolicy
        ("trl", {}, "resident"),
    ],
)
def test_the_reference_mode_per_executor(target: str, knobs: dict[str, Any], mode: str) -> None:
    assert ref_offload_mode(Knobs(**knobs), traits_for(target)) == mode


def test_todays_verl_keeps_no_reference_shard_on_the_gpu(est: Any) -> None:
    """Qwen2-7B on 2 H800 with the KL loss and ref param_offload off: the bf16 reference shard (7.6e9 × 2 B / 2)
    counted in every phase before #121, in none since (the old planner counted it whatever the verl)."""
    today = est("qwen2-7b", "2xH800", target="verl", workload=KL)
    older = est("qwen2-7b", "2xH800", target="verl", workload=KL, ref_forced_cpu_offload=False)
    shard = older.phases["update"].items["ref_params"]
    assert 7.0e9 < shard < 8.0e9
    for phase in PHASES:
        assert today.phases[phase].items["ref_params"] == 0
        assert older.phases[phase].items["ref_params"] == shard
        assert older.phases[phase].total_bytes - today.phases[phase].total_bytes == shard
    # the key changes nothing for today's verl; it lives in host RAM either way
    keyed = est("qwen2-7b", "2xH800", target="verl", workload=KL, ref_param_offload=True)
    assert keyed.peak_gpu_bytes == today.peak_gpu_bytes
    assert today.host.items["ref_params_offloaded"] == 2 * shard  # both ranks of the node
    # our engine keeps following the key
    ours = est("qwen2-7b", "2xH800", target="grpo-pilot", workload=KL)
    assert ours.phases["update"].items["ref_params"] == shard


def test_the_streamed_reference_pays_its_transfer_every_micro_batch() -> None:
    """A streamed reference copies its shard in for each micro-batch (FSDP unshard of a CPU-offloaded unit), a
    loaded one once per pass: with several log-prob micro-batches the streamed pass is the slower."""
    m, c = resolve_model("qwen2-7b").spec, parse_cluster("2xH800")
    verl = traits_for("verl")
    base = dict(log_prob_micro_batch_size_per_gpu=4)

    def t(**k: Any) -> float:
        return log_prob_time_s(m, c, KL, Knobs(**base, **k), executor=verl)

    streamed, loaded = t(), t(ref_forced_cpu_offload=False, ref_param_offload=True)
    resident = t(ref_forced_cpu_offload=False)
    assert streamed > loaded > resident


def test_the_search_offers_no_reference_key_for_verls_fsdp() -> None:
    m, c = resolve_model("qwen2.5-7b").spec, parse_cluster("8xH100")

    def dims(target: str, include: Knobs) -> dict:
        return knob_choices(m, c, KL, include=include, executor=traits_for(target), grid=ANALYTIC_GRID)

    assert "ref_param_offload" not in dims("verl", Knobs())
    assert dims("verl", Knobs(ref_forced_cpu_offload=False))["ref_param_offload"] == (False, True)
    assert dims("verl", Knobs(strategy="megatron"))["ref_param_offload"] == (False, True)
    assert dims("grpo-pilot", Knobs())["ref_param_offload"] == (False, True)
