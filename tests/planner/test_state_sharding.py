"""TRL under DeepSpeed ZeRO-1 / ZeRO-2 / DDP (`Knobs.state_sharding`, planner/memory/zero.py): per-GPU state bytes
against the formulas, the TRL reader, and the collectives."""

from __future__ import annotations

import pytest

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.constraints import violations
from grpo_pilot.planner.evaluate import PlanInputs, assess, model_ref
from grpo_pilot.planner.from_trl import read_trl
from grpo_pilot.planner.memory.context import memory_context
from grpo_pilot.planner.memory.model_states import shard_elements
from grpo_pilot.planner.memory.zero import DEEPSPEED_REDUCE_BUCKET_ELEMENTS
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
from grpo_pilot.planner.suggest import suggest
from grpo_pilot.planner.support import unsupported
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS
from grpo_pilot.planner.timing import replicated_comm_s, update_time_s
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.profiles.catalog import resolve_model

SPEC = resolve_model("qwen2.5-7b").spec
P = SPEC.num_params
N = 4  # 4xH100: the data-parallel ranks
KL = Workload(use_kl_loss=True)


def _ctx(mode: str, gpus: str = "4xH100", workload: Workload = KL):
    knobs = Knobs(state_sharding=mode, rollout_backend="hf", rollout_tp=1)
    return memory_context(
        SPEC, parse_cluster(gpus), workload, knobs, executor=traits_for("trl"), overheads=DEFAULT_OVERHEADS
    )


def test_full_sharding_is_the_zero_paper_16_psi_over_n() -> None:
    ctx = _ctx("full")
    part = shard_elements(P, N)
    assert (ctx.master_bytes, ctx.grad_bytes, ctx.adam_bytes) == (4 * part, 4 * part, 8 * part)
    assert ctx.ref_bytes == 4 * part  # TRL's reference in the policy's dtype (fp32), sharded under ZeRO-3 / FSDP
    assert ctx.sharded and ctx.ddp_bucket_bytes == ctx.backward_buffer_bytes == ctx.step_grad_bytes == 0


def test_zero2_replicates_bf16_params_and_partitions_grads_and_optimizer() -> None:
    ctx = _ctx("zero2")
    part = shard_elements(P, N)
    assert ctx.master_bytes == 2 * P + 4 * part  # bit16_groups_flat + single_partition_of_fp32_groups
    assert ctx.grad_bytes == 2 * part  # grads_in_partition (bf16)
    assert ctx.adam_bytes == 8 * part
    assert ctx.ref_bytes == 2 * P  # prepare_deepspeed: stage 0, cast to bf16, whole on every GPU
    assert ctx.backward_buffer_bytes == 2 * DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    assert ctx.step_grad_bytes == 4 * part  # single_grad_partition in fp32 for Adam
    assert not ctx.sharded and not ctx.autocast and ctx.gathered_layers_bytes == 0
    assert ctx.policy_cast_bytes == 0 and ctx.ddp_bucket_bytes == 0


def test_zero1_keeps_every_bf16_gradient_until_the_boundary() -> None:
    ctx = _ctx("zero1")
    part = shard_elements(P, N)
    assert ctx.master_bytes == 2 * P + 4 * part
    assert ctx.grad_bytes == 2 * P + 2 * part
    assert ctx.adam_bytes == 8 * part and ctx.ref_bytes == 2 * P


def test_ddp_replicates_everything_and_holds_the_reducer_buckets() -> None:
    ctx = _ctx("ddp")
    assert (ctx.master_bytes, ctx.grad_bytes, ctx.adam_bytes, ctx.ref_bytes) == (4 * P, 4 * P, 8 * P, 4 * P)
    assert ctx.ddp_bucket_bytes == 4 * P  # gradient_as_bucket_view=False: a second gradient copy
    assert ctx.shard_degree == 1 and not ctx.sharded and ctx.autocast
    assert _ctx("ddp", "1xH100").ddp_bucket_bytes == 0  # one process is not wrapped in DDP


def test_phases_carry_the_replicated_items() -> None:
    from grpo_pilot.planner.estimate import estimate_memory

    def phases(mode: str):
        knobs = Knobs(state_sharding=mode, rollout_backend="hf", rollout_tp=1)
        return estimate_memory(SPEC, parse_cluster("4xH100"), KL, knobs, target="trl").phases

    ddp = phases("ddp")
    assert all(ddp[name].items["ddp_grad_buckets"] == 4 * P for name in ("rollout", "log_prob", "update"))
    zero2, full = phases("zero2")["update"].items, phases("full")["update"].items
    assert zero2["actor_params"] == 2 * P + 4 * shard_elements(P, N) > full["actor_params"]
    assert ddp["update"].total_bytes > phases("zero1")["update"].total_bytes


def test_trl_reader_maps_the_launcher() -> None:
    base = "model_name_or_path: Qwen/Qwen2.5-7B\nnum_generations: 8\n"
    assert read_trl(base + "deepspeed: zero2\n", 4).knobs["state_sharding"] == "zero2"
    assert read_trl(base + "deepspeed: ds_z1_config.json\n", 4).knobs["state_sharding"] == "zero1"
    assert read_trl(base + "deepspeed: zero3\n", 4).knobs["state_sharding"] == "full"
    mapping = read_trl(base, 4, ["deepspeed={zero_optimization: {stage: 2}}"])
    assert mapping.knobs["state_sharding"] == "zero2"
    assert read_trl(base + "fsdp: full_shard auto_wrap\n", 4).knobs["state_sharding"] == "full"
    plain = read_trl(base, 4)
    assert plain.knobs["state_sharding"] == "ddp" and any("planned as DDP" in n for n in plain.notes)
    assert not any("planned as DDP" in n for n in read_trl(base, 1).notes)  # one process: no DDP wrapper
    assert read_trl(base, 4, ["deepspeed=zero2"]).knobs["state_sharding"] == "zero2"


def test_only_trl_has_the_setting() -> None:
    knobs = Knobs(state_sharding="zero2")
    assert any("state_sharding" in p for p in unsupported("verl", Workload(), knobs))
    assert not any("state_sharding" in p for p in unsupported("trl", Workload(), knobs))


@pytest.mark.parametrize("mode", ["ddp", "zero1", "zero2"])
def test_collectives_per_mode(mode: str) -> None:
    coef, bw = DEFAULT_TIME_COEFFICIENTS, 100e9
    overlapped, serial, step = replicated_comm_s(mode, P, ranks=N, bw=bw, coef=coef, grad_bytes=4)
    ring = 2 * P * (N - 1) / N / bw  # one bf16 reduce-scatter or all-gather of the model
    assert overlapped == 0.0
    if mode == "ddp":  # one fp32 all-reduce per optimizer step
        assert (serial, step) == (0.0, pytest.approx(coef.allreduce_latency_s + 2 * 4 * P * (N - 1) / N / bw))
    elif mode == "zero1":  # reduce at the boundary + all-gather of the updated parameters
        assert (serial, step) == (0.0, pytest.approx(2 * ring))
    else:  # ZeRO-2 reduces every backward, serially (overlap_comm False), all-gathers per step
        assert (serial, step) == (pytest.approx(ring), pytest.approx(ring))


def test_update_time_moves_with_the_mode() -> None:
    cluster, wl = parse_cluster("4xH100"), Workload()

    def t(mode: str) -> float:
        knobs = Knobs(state_sharding=mode, rollout_backend="hf", rollout_tp=1)
        return update_time_s(SPEC, cluster, wl, knobs, executor=traits_for("trl"))

    assert len({t("full"), t("zero2"), t("zero1"), t("ddp")}) == 4


def test_replicated_states_cannot_offload_and_the_suggestion_is_to_shard_them() -> None:
    """DDP has no offload (ZeRO-1/2 offload only the optimizer: tests/planner/test_deepspeed_offload.py): an offload
    knob under DDP breaks a rule (so no search or suggestion offers it); the suggestion for a DDP launch that
    does not fit is sharding its states, with the peak that gives."""
    small = Workload(
        prompts_per_step=8, mini_batch_prompts=8, n=2, prompt_len_tokens=256, response_len_tokens=512, use_kl_loss=True
    )
    inputs = PlanInputs(
        model=model_ref(resolve_model("qwen2.5-7b")), cluster=parse_cluster("4xH20"), workload=small, target="trl"
    )
    ddp = Knobs(state_sharding="ddp", rollout_backend="hf", rollout_tp=1)
    offloaded = assess(inputs, ddp.model_copy(update={"param_offload": True, "optimizer_offload": True}))
    assert "offload.needs_sharding" in {c.rule for c in violations(offloaded.checks)}
    failed = assess(inputs, ddp)
    assert not failed.fits
    kept = {"state_sharding": "ddp", "rollout_backend": "hf"}
    first = suggest(inputs, failed, {}, kept=kept)[0]
    sharded = assess(inputs, ddp.model_copy(update={"state_sharding": "full"}))
    assert sharded.fits
    assert first.startswith("sharding every model state instead of ddp fits")
    assert f"peak {sharded.memory.peak_gpu_bytes / 2**30:.1f} GiB" in first
    assert all("turning on" not in s for s in suggest(inputs, failed, {}, kept=kept))
