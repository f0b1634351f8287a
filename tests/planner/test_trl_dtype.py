"""TRL's element sizes follow the dtype the model is loaded in (`Knobs.model_dtype`) and the launcher
(`Knobs.state_sharding`): memory/precision.py `trl_precision`, planner/trl_dtype.py. Exact per-GPU state bytes of
Qwen2.5-7B on 4xH100 under each rule, the reader's dtype sources, and that verl and our engine are unchanged."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from grpo_pilot.cli.plan import app
from grpo_pilot.errors import InputError
from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.export import trl_settings
from grpo_pilot.planner.from_trl import trl_launch
from grpo_pilot.planner.memory.context import memory_context
from grpo_pilot.planner.memory.model_states import shard_elements
from grpo_pilot.planner.memory.precision import precision_for
from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
from grpo_pilot.planner.plan import load_plan
from grpo_pilot.planner.support import unsupported
from grpo_pilot.planner.traits import traits_for
from grpo_pilot.planner.trl_dtype import checkpoint_model_dtype
from grpo_pilot.profiles.catalog import resolve_model

SPEC = resolve_model("qwen2.5-7b").spec
P = SPEC.num_params
N = 4
PART = shard_elements(P, N)
KL = Workload(use_kl_loss=True)


def _ctx(mode: str, dtype: str, gpus: str = "4xH100", target: str = "trl"):
    knobs = Knobs(state_sharding=mode, model_dtype=dtype, rollout_backend="hf", rollout_tp=1)
    return memory_context(
        SPEC, parse_cluster(gpus), KL, knobs, executor=traits_for(target), overheads=DEFAULT_OVERHEADS
    )


def _states(ctx) -> tuple[int, int, int, int, int]:
    return ctx.master_bytes, ctx.grad_bytes, ctx.adam_bytes, ctx.ref_bytes, ctx.ddp_bucket_bytes


def test_ddp_of_a_bf16_model_trains_every_state_in_bf16() -> None:
    # nothing upcasts under DDP; torch AdamW's moments take the parameter's dtype (torch/optim/adam.py)
    ctx = _ctx("ddp", "bf16")
    assert _states(ctx) == (2 * P, 2 * P, 4 * P, 2 * P, 2 * P)
    assert not ctx.autocast and ctx.policy_cast_bytes == ctx.ref_cast_bytes == 0  # nothing for autocast to cast
    one = _ctx("ddp", "bf16", "1xH100")  # one process: no DDP wrapper, no buckets
    assert _states(one) == (2 * P, 2 * P, 4 * P, 2 * P, 0)


def test_ddp_of_an_fp32_model_keeps_fp32_states_under_autocast() -> None:
    ctx = _ctx("ddp", "fp32")
    assert _states(ctx) == (4 * P, 4 * P, 8 * P, 4 * P, 4 * P)
    assert ctx.autocast


def test_fsdp_upcasts_a_bf16_policy_and_keeps_the_reference_bf16() -> None:
    # accelerate upcasts trainable parameters to fp32 under mixed precision; TRL's prepare_fsdp does not upcast
    bf16 = _ctx("full", "bf16")
    assert _states(bf16) == (4 * PART, 4 * PART, 8 * PART, 2 * PART, 0)
    fp32 = _ctx("full", "fp32")
    assert _states(fp32) == (4 * PART, 4 * PART, 8 * PART, 4 * PART, 0)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_zero2_is_bf16_weights_with_fp32_master_and_adam_whatever_the_load_dtype(dtype: str) -> None:
    ctx = _ctx("zero2", dtype)
    assert _states(ctx) == (2 * P + 4 * PART, 2 * PART, 8 * PART, 2 * P, 0)
    assert ctx.step_grad_bytes == 4 * PART


def test_verl_and_our_engine_are_unchanged_and_refuse_a_load_dtype() -> None:
    for target in ("verl", "grpo-pilot"):
        ctx = _ctx("full", "fp32", target=target)
        assert (ctx.master_bytes, ctx.grad_bytes, ctx.adam_bytes, ctx.ref_bytes) == (
            4 * PART,
            4 * PART,
            8 * PART,
            2 * PART,
        )
        assert any("model_dtype" in p for p in unsupported(target, Workload(), Knobs(model_dtype="bf16")))
    assert not any("model_dtype" in p for p in unsupported("trl", Workload(), Knobs(model_dtype="bf16")))
    cpu = precision_for(traits_for("trl"), parse_cluster("1xcpu").device, model_dtype="bf16", state_sharding="ddp")
    assert set(cpu) == {4, 8}  # the cpu pseudo-device stays fp32 whatever the load dtype


def test_lora_base_follows_the_load_dtype_under_ddp() -> None:
    from grpo_pilot.planner.adapters import AdapterSettings

    lora = Workload(
        use_kl_loss=True,
        adapter=AdapterSettings(framework="trl", method="lora", rank=16, alpha=32.0, target_modules=("all-linear",)),
    )
    knobs = dict(state_sharding="ddp", rollout_backend="hf", rollout_tp=1)
    base = {}
    for dtype in ("fp32", "bf16"):
        ctx = memory_context(
            SPEC,
            parse_cluster("1xH100"),
            lora,
            Knobs(model_dtype=dtype, **knobs),
            executor=traits_for("trl"),
            overheads=DEFAULT_OVERHEADS,
        )
        base[dtype] = ctx.frozen_base_bytes
    assert base["fp32"] == 2 * base["bf16"] > 0


def test_reader_takes_the_dtype_from_model_init_kwargs_first() -> None:
    cfg = {"model_name_or_path": "m", "dtype": "float32"}
    assert trl_launch(cfg, 2).knobs["model_dtype"] == "fp32"
    assert trl_launch({**cfg, "model_init_kwargs": {"dtype": "bfloat16"}}, 2).knobs["model_dtype"] == "bf16"
    assert trl_launch({**cfg, "model_init_kwargs": '{"torch_dtype": "float16"}'}, 2).knobs["model_dtype"] == "fp16"
    assert trl_launch({"model_name_or_path": "m", "torch_dtype": "bfloat16"}, 2).knobs["model_dtype"] == "bf16"
    unnamed = trl_launch({"model_name_or_path": "m"}, 2)
    assert unnamed.knobs["model_dtype"] == "fp32" and any("--override dtype=bfloat16" in n for n in unnamed.notes)
    assert "model_dtype" not in trl_launch({"model_name_or_path": "m", "dtype": "auto"}, 2).knobs
    with pytest.raises(InputError, match="not a dtype TRL loads"):
        trl_launch({"model_name_or_path": "m", "torch_dtype": "int8"}, 2)
    with pytest.raises(InputError, match="model_init_kwargs"):
        trl_launch({"model_name_or_path": "m", "model_init_kwargs": "{bad"}, 2)


def test_zero3_partitions_both_models_in_bf16_and_axolotl_follows_its_bf16_flag() -> None:
    zero3 = trl_launch({"model_name_or_path": "m", "deepspeed": "zero3", "dtype": "float32"}, 4)
    assert zero3.knobs["model_dtype"] == "bf16" and any("zero.Init" in n for n in zero3.notes)
    axolotl = {"rl": "grpo", "base_model": "m", "micro_batch_size": 8}
    assert trl_launch({**axolotl, "bf16": "auto"}, 1).knobs["model_dtype"] == "bf16"
    assert trl_launch({**axolotl, "fp16": True}, 1).knobs["model_dtype"] == "fp16"
    assert trl_launch(axolotl, 1).knobs["model_dtype"] == "fp32"


def test_auto_reads_the_checkpoint_dtype() -> None:
    notes: list[str] = []
    assert resolve_model("qwen2.5-7b").checkpoint_dtype == "bfloat16"
    assert checkpoint_model_dtype("bfloat16", state_sharding="ddp", notes=notes) == "bf16"
    assert checkpoint_model_dtype(None, state_sharding="ddp", notes=notes) == "fp32"


def test_cli_plans_a_bf16_ddp_launch_smaller_and_exports_its_dtype(tmp_path) -> None:
    base = "model_name_or_path: Qwen/Qwen2.5-1.5B\nper_device_train_batch_size: 4\nnum_generations: 4\nbeta: 0.04\n"
    peaks = {}
    for name, extra in (("fp32", ""), ("auto", "dtype: auto\n"), ("bf16", "torch_dtype: bfloat16\n")):
        src = tmp_path / f"{name}.yaml"
        src.write_text(base + extra)
        out = tmp_path / f"{name}.json"
        result = CliRunner().invoke(app, ["--from-trl", str(src), "--gpus", "2xH100", "--out", str(out)])
        assert result.exit_code == 0, result.output
        plan = load_plan(out)
        peaks[name] = plan.peak_gpu_bytes
        assert plan.knobs.model_dtype == ("fp32" if name == "fp32" else "bf16")
        if name == "bf16":
            assert trl_settings(plan)[0]["model_init_kwargs"] == {"dtype": "bfloat16"}
    spec = resolve_model("qwen2.5-1.5b").spec
    # update phase: params 2, grads 2, Adam 4, buckets 2, reference 2 bytes fewer per parameter, and no autocast cache
    assert peaks["fp32"] - peaks["bf16"] >= 12 * spec.num_params
    assert peaks["auto"] == peaks["bf16"]
