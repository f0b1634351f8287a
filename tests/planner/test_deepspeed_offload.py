"""DeepSpeed offload in TRL launches: ZeRO-1/2 offload_optimizer (memory/zero.py) and ZeRO-3 offload (planned as
the FSDP offload knobs), the `deepspeed:` reader, the offload.needs_sharding rule and the update time."""

from __future__ import annotations

import json

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.constraints import violations
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.evaluate import PlanInputs, assess, model_ref
from grpo_pilot.planner.from_trl import read_trl
from grpo_pilot.planner.memory.context import memory_context
from grpo_pilot.planner.memory.model_states import shard_elements
from grpo_pilot.planner.memory.zero import DEEPSPEED_REDUCE_BUCKET_ELEMENTS
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
from grpo_pilot.planner.roofline import host_link_bytes_per_s
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS
from grpo_pilot.planner.timing import update_time_s
from grpo_pilot.planner.train_side import ADAM_BYTES_PER_PARAM, cpu_adam_s
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles.catalog import resolve_model

SPEC = resolve_model("qwen2.5-7b").spec
P = SPEC.num_params
N = 4
PART = shard_elements(P, N)
# the largest tensor of Qwen2.5-7B: the 152064 × 3584 embedding (and the untied lm_head)
LARGEST = SPEC.vocab_size * SPEC.hidden_size
KL = Workload(use_kl_loss=True)
BASE = "model_name_or_path: Qwen/Qwen2.5-7B\nnum_generations: 8\n"


def _knobs(mode: str, **offload: bool) -> Knobs:
    return Knobs(state_sharding=mode, rollout_backend="hf", rollout_tp=1, **offload)


def _ctx(knobs: Knobs):
    return memory_context(
        SPEC, parse_cluster("4xH100"), KL, knobs, executor=traits_for("trl"), overheads=DEFAULT_OVERHEADS
    )


def test_largest_tensor_is_the_embedding() -> None:
    assert LARGEST == 152064 * 3584


@pytest.mark.parametrize("mode", ["zero2", "zero1"])
def test_zero_offload_optimizer_keeps_bf16_params_and_staging_on_the_gpu(mode: str) -> None:
    ctx = _ctx(_knobs(mode, optimizer_offload=True))
    assert ctx.optimizer_offload
    assert ctx.master_bytes == 2 * P + 2 * LARGEST  # bit16_groups_flat + temp_grad_buffer_for_gpu_offload
    assert ctx.grad_bytes == (2 * P if mode == "zero1" else 0)  # no grads_in_partition under offload
    assert ctx.step_grad_bytes == 0  # Adam steps on the host's fp32 gradient partition
    assert ctx.backward_buffer_bytes == 2 * DEEPSPEED_REDUCE_BUCKET_ELEMENTS  # the IPG bucket stays
    assert ctx.adam_bytes == 8 * PART  # placed on the host by `resident` / host_items
    # fp32 master + fp32 gradient + bf16 partitions, the host staging buffer
    assert ctx.zero_host_bytes == (4 + 4 + 2) * PART + 2 * LARGEST


def test_zero2_offload_phases_and_host_bytes() -> None:
    cluster = parse_cluster("4xH100")
    plain = estimate_memory(SPEC, cluster, KL, _knobs("zero2"), target="trl")
    off = estimate_memory(SPEC, cluster, KL, _knobs("zero2", optimizer_offload=True), target="trl")
    update, before = off.phases["update"].items, plain.phases["update"].items
    assert update["actor_params"] == 2 * P + 2 * LARGEST
    assert update["optimizer_states"] == 0 and before["optimizer_states"] == 8 * PART
    assert update["actor_grads"] == 0 and before["actor_grads"] == 2 * PART
    assert off.host.items["zero_offloaded_partitions"] == 4 * ((4 + 4 + 2) * PART + 2 * LARGEST)  # 4 ranks on the node
    assert off.host.items["optimizer_states_offloaded"] == 4 * 8 * PART
    assert off.host.items["actor_params_offloaded"] == 0 and "zero_offloaded_partitions" not in plain.host.items


def test_zero3_offload_moves_master_grads_and_adam() -> None:
    ctx = _ctx(_knobs("full", param_offload=True, optimizer_offload=True))
    off = estimate_memory(
        SPEC, parse_cluster("4xH100"), KL, _knobs("full", param_offload=True, optimizer_offload=True), target="trl"
    )
    host = off.host.items
    assert (host["actor_params_offloaded"], host["actor_grads_offloaded"]) == (4 * 4 * PART, 4 * 4 * PART)
    assert off.host.items["optimizer_states_offloaded"] == 4 * 8 * PART
    assert off.phases["update"].items["actor_params"] == 0 and ctx.zero_host_bytes == 0


def test_rule_allows_only_the_modelled_offloads() -> None:
    inputs = PlanInputs(model=model_ref(resolve_model("qwen2.5-7b")), cluster=parse_cluster("4xH100"), target="trl")

    def broken(knobs: Knobs) -> bool:
        return "offload.needs_sharding" in {c.rule for c in violations(assess(inputs, knobs).checks)}

    assert not broken(_knobs("zero2", optimizer_offload=True))
    assert not broken(_knobs("zero1", optimizer_offload=True))
    assert broken(_knobs("zero2", param_offload=True))  # offload_param is ZeRO-3's
    assert broken(_knobs("zero2", optimizer_offload=True, ref_param_offload=True))
    assert broken(_knobs("ddp", optimizer_offload=True))
    assert not broken(_knobs("full", param_offload=True, optimizer_offload=True))


def test_zero2_offload_update_time_is_cpu_adam_and_the_partition_traffic() -> None:
    cluster, wl, trl = parse_cluster("4xH100"), Workload(), traits_for("trl")
    coef = DEFAULT_TIME_COEFFICIENTS
    plain = update_time_s(SPEC, cluster, wl, _knobs("zero2"), executor=trl)
    off = update_time_s(SPEC, cluster, wl, _knobs("zero2", optimizer_offload=True), executor=trl)
    host = host_link_bytes_per_s(cluster.gpu, coef)
    # per optimizer step: HBM Adam replaced by CPU Adam plus fp32 gradients out and bf16 parameters back
    hbm_adam = (P / N) * ADAM_BYTES_PER_PARAM / cluster.gpu.hbm_bytes_per_s
    steps = wl.ppo_epochs * -(-wl.prompts_per_step // wl.mini_batch_prompts)
    expected = steps * (cpu_adam_s(P / N, cluster, coef) + (4 + 2) * (P / N) / host - hbm_adam)
    assert off - plain == pytest.approx(expected, rel=1e-9)


def test_reader_maps_deepspeed_offload_sections() -> None:
    z2 = "deepspeed={zero_optimization: {stage: 2, offload_optimizer: {device: cpu}}}"
    knobs = read_trl(BASE, 4, [z2]).knobs
    assert knobs["state_sharding"] == "zero2" and knobs["optimizer_offload"] and not knobs["param_offload"]
    both = {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    }
    launch = read_trl(BASE + f"deepspeed: '{json.dumps(both)}'\n", 4)  # a JSON string, as accelerate reads it
    assert launch.knobs["state_sharding"] == "full"
    assert launch.knobs["param_offload"] and launch.knobs["optimizer_offload"]
    only_param = read_trl(BASE, 4, ["deepspeed={zero_optimization: {stage: 3, offload_param: {device: cpu}}}"])
    assert not only_param.knobs["param_offload"] and any("bf16 parameter partitions" in n for n in only_param.notes)
    plugin = read_trl(BASE, 4, ["deepspeed={zero_stage: 2, offload_optimizer_device: cpu}"]).knobs
    assert plugin["state_sharding"] == "zero2" and plugin["optimizer_offload"]
    accel = read_trl(BASE + "deepspeed_config: {zero_stage: 1, offload_optimizer_device: cpu}\n", 4).knobs
    assert accel["state_sharding"] == "zero1" and accel["optimizer_offload"]
    z2_param = read_trl(BASE, 4, ["deepspeed={zero_optimization: {stage: 2, offload_param: {device: cpu}}}"])
    assert not z2_param.knobs["param_offload"] and not z2_param.knobs["optimizer_offload"]
    plain = read_trl(BASE + "deepspeed: zero2\n", 4).knobs
    assert not plain["optimizer_offload"] and not plain["param_offload"]


def test_reader_file_names() -> None:
    named = read_trl(BASE + "deepspeed: ds_z3_offload.json\n", 4)
    assert named.knobs["state_sharding"] == "full" and named.knobs["param_offload"] and named.knobs["optimizer_offload"]
    assert any("does not read" in n and "--override" in n for n in named.notes)
    plain = read_trl(BASE + "deepspeed: ds_z2_config.json\n", 4)
    assert not plain.knobs["optimizer_offload"] and any("does not read" in n for n in plain.notes)
    z2 = read_trl(BASE + "deepspeed: zero2_offload.json\n", 4).knobs
    assert z2["state_sharding"] == "zero2" and z2["optimizer_offload"] and not z2["param_offload"]


def test_reader_rejects_bad_offload_values() -> None:
    with pytest.raises(InputError, match="offload_optimizer.device"):
        read_trl(BASE, 4, ["deepspeed={zero_optimization: {stage: 2, offload_optimizer: {device: gpu}}}"])
    with pytest.raises(InputError, match="valid JSON"):
        read_trl(BASE + "deepspeed: '{not json'\n", 4)


def test_a_deepspeed_file_whose_stage_is_not_told_is_planned_as_zero3() -> None:
    launch = read_trl(BASE + "deepspeed: my_config.json\n", 4)  # raised KeyError before
    assert launch.knobs["state_sharding"] == "full" and any("not told" in n for n in launch.notes)
