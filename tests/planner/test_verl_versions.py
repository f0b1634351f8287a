"""--from-verl across verl versions: keys date a launch, the old defaults and batch semantics follow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_pilot.cli.plan import app
from grpo_pilot.errors import InputError
from grpo_pilot.planner.from_verl import read_verl, verl_launch
from grpo_pilot.planner.memory.vllm_budget import VllmSettings, vllm_budget
from grpo_pilot.planner.overheads import Overheads
from grpo_pilot.planner.verl_versions import CHANGES, window
from grpo_pilot.profiles import resolve_model
from grpo_pilot.profiles.config_overrides import apply_config_overrides

A = "actor_rollout_ref."
REAL = Path(__file__).resolve().parent / "real_runs" / "scripts"

# Logic-RL main_grpo.sh's keys (verl of late January 2025): a mini-batch above the batch, global micro-batches
LOGIC_RL = {
    "algorithm.adv_estimator": "grpo",
    "data.train_batch_size": "8",
    "data.max_prompt_length": "400",
    "data.max_response_length": "2048",
    A + "model.path": "m",
    A + "actor.ppo_mini_batch_size": "256",
    A + "actor.ppo_micro_batch_size": "64",
    A + "actor.use_kl_loss": "True",
    A + "actor.fsdp_config.grad_offload": "True",
    A + "rollout.log_prob_micro_batch_size": "160",
    A + "ref.log_prob_micro_batch_size": "160",
    A + "rollout.n": "16",
    "trainer.n_gpus_per_node": "4",
}


def test_keys_date_the_verl_and_old_defaults_apply() -> None:
    win = window(LOGIC_RL, [])
    assert (win.after, win.before) == ("2025-01-23T12:25", "2025-02-17T06:07")  # use_kl_loss .. grad_offload
    launch = verl_launch(LOGIC_RL)
    assert launch.workload["entropy_coeff"] == 0.001  # verl before 25b0f2262 (#1100)
    assert launch.knobs["entropy_every_pass"] is True  # ... which computes it in every pass
    assert launch.knobs["enforce_eager"] is True  # before ff6978c14 (#2956)
    assert launch.remove_padding is False and launch.knobs["remove_padding"] is False  # before 561752996 (#4461)
    # the mini-batch above the batch is one mini-batch of the whole batch (not a refusal)
    assert launch.workload["mini_batch_prompts"] == 8 and any("exceeds train_batch_size" in n for n in launch.notes)
    # #136 (2025-01-27) lies inside the window: today's division, and the override that gives the old one
    assert launch.knobs["micro_batch_size_per_gpu"] == 16
    assert any("ppo_micro_batch_size_per_gpu=256" in n for n in launch.notes)
    # a plus-added key the config later gained: the verl predates that addition
    assert window({"a.b": "1"}, ["trainer.val_before_train"]).before == "2025-03-31T06:05"


def test_pinned_verl_before_136_multiplies_micro_batches_by_n() -> None:
    launch = verl_launch(LOGIC_RL, version="2025-01-23")
    k = launch.knobs
    # 64 // 4 x 16 = 256 per GPU, but a GPU's mini-batch is 8 x 16 / 4 = 32 sequences: one micro-batch of 32
    assert k["micro_batch_size_per_gpu"] == 32 and k["log_prob_micro_batch_size_per_gpu"] == 32
    newer = verl_launch(LOGIC_RL | {A + "actor.ppo_mini_batch_size": "8"}, version="0.4.1")
    assert newer.knobs["micro_batch_size_per_gpu"] == 16 and newer.workload["entropy_coeff"] == 0.0
    assert newer.knobs["entropy_every_pass"] is False  # since #1100: only with a coefficient
    with pytest.raises(InputError, match="VERL_VERSION"):
        verl_launch(LOGIC_RL, version="latest")
    # a verl that validates the mini-batch (since 4d27461d0, #559) refuses to start
    with pytest.raises(InputError, match="refuses to start"):
        verl_launch(LOGIC_RL, version="0.4.1")
    pinned = read_verl("\n".join(f"{k}={v}" for k, v in LOGIC_RL.items()), ["VERL_VERSION=2025-01-23"])
    assert pinned.knobs["micro_batch_size_per_gpu"] == 32


def test_changes_are_ordered_and_sourced() -> None:
    times = [c.at for c in CHANGES]
    assert times == sorted(times) and all(c.source.startswith("verl ") for c in CHANGES)


def test_model_path_missing_takes_model_flag() -> None:
    keys = {k: v for k, v in LOGIC_RL.items() if k != A + "model.path"} | {A + "model.path": ""}
    with pytest.raises(InputError, match="model.path is not set") as info:
        verl_launch(keys)
    assert "--model" in info.value.hint
    launch = verl_launch(keys, model_fallback="qwen2.5-7b")
    assert launch.model == "qwen2.5-7b" and any("--model qwen2.5-7b" in n for n in launch.notes)


def test_override_config_reaches_the_model_spec() -> None:
    keys = dict(LOGIC_RL) | {
        A + "model.override_config.max_position_embeddings": "32768",
        A + "model.override_config.rope_scaling": "{type:yarn,factor:4.0}",
        A + "model.override_config.attention_dropout": "0.1",
    }
    launch = verl_launch(keys)
    assert launch.hf_overrides == {
        "max_position_embeddings": 32768,
        "rope_scaling": {"type": "yarn", "factor": 4.0},
        "attention_dropout": 0.1,
    }
    spec = resolve_model("qwen2.5-math-7b").spec
    assert spec.max_position_embeddings == 4096
    changed, notes = apply_config_overrides(spec, launch.hf_overrides)
    assert changed.max_position_embeddings == 32768 and changed.num_params == spec.num_params
    assert any("rope_scaling" in n for n in notes) and any("attention_dropout ignored" in n for n in notes)
    with pytest.raises(InputError, match="num_key_value_heads"):
        apply_config_overrides(spec, {"num_key_value_heads": 5})
    with pytest.raises(InputError, match="not an integer"):
        apply_config_overrides(spec, {"max_position_embeddings": "long"})


def test_cli_applies_override_config_and_script_args(tmp_path: Path) -> None:
    """The one-step-off recipe on the bundled Qwen2.5-Math-7B (4,096 positions): its override_config lengthens
    the context to 32,768, so the 10,240-token sequences pass the context check."""
    script = REAL / "verl_recipe_one_step_off_policy_dapo_7b_math_fsdp2_colocate.sh"
    args = ["--from-verl", str(script), "--gpus", "H20", "--model", "qwen2.5-math-7b", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 3), result.output
    plan = json.loads(result.stdout)
    assert plan["model"]["spec"]["max_position_embeddings"] == 32768
    assert not any("positions" in v for v in plan["violations"])
    without = tmp_path / "run.sh"
    without.write_text(
        script.read_text().replace("+actor_rollout_ref.model.override_config.max_position_embeddings", "+x.y")
    )
    result = CliRunner().invoke(app, ["--from-verl", str(without), *args[2:]])
    assert any("4096 positions" in v for v in json.loads(result.stdout)["violations"])


def test_numeric_keys_are_checked_by_name() -> None:
    for key, value, fragment in [
        (A + "actor.ppo_micro_batch_size", "abc", "not a positive integer"),
        (A + "actor.entropy_coeff", "inf", "not a finite number"),
        (A + "actor.entropy_coeff", "abc", "not a finite number"),
        (A + "rollout.gpu_memory_utilization", "nan", "not a finite number"),
        (A + "actor.use_dynamic_bsz", "abc", "not True or False"),
        (A + "rollout.log_prob_max_token_len_per_gpu", "abc", "not a positive integer"),
    ]:
        with pytest.raises(InputError, match=fragment) as info:
            verl_launch(dict(LOGIC_RL) | {A + "actor.use_dynamic_bsz": "True", key: value})
        assert key in info.value.message


def test_the_allocator_and_cache_releases_follow_the_verl_version() -> None:
    """verl before #556 emptied the cache after every worker method; before #3020 it ran PyTorch's default
    allocator; today's verl: expandable segments and releases around the weight sync and after the rollout."""
    old = verl_launch(LOGIC_RL).knobs  # window ends 2025-02-17: before both changes
    assert (old["allocator"], old["release_cache"]) == ("default", "each_phase")
    new = verl_launch(LOGIC_RL | {A + "actor.ppo_mini_batch_size": "8"}, version="2025-09-01").knobs
    assert (new["allocator"], new["release_cache"]) == ("expandable", "verl")
    # verl v0.3.0 (#575 to #1081): the sharding manager emptied the cache before the sync, not after it
    between = verl_launch(LOGIC_RL | {A + "actor.ppo_mini_batch_size": "8"}, version="0.3.0.post1").knobs
    assert (between["allocator"], between["release_cache"]) == ("default", "before_sync_after_rollout")
    later = verl_launch(LOGIC_RL | {A + "actor.ppo_mini_batch_size": "8"}, version="0.4.0").knobs
    assert (later["allocator"], later["release_cache"]) == ("default", "verl")
    # an old verl whose launch sets expandable segments itself runs them
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    assert verl_launch(LOGIC_RL, env).knobs["allocator"] == "expandable"
    assert (
        verl_launch(LOGIC_RL, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}).knobs["allocator"] == "default"
    )


def test_verl_before_2960_runs_vllm_at_its_default_max_num_seqs() -> None:
    """verl passed rollout.max_num_seqs to vLLM only from beb624610 (#2960): before, V0 ran at 256 and V1 at
    1024 (vLLM 0.8.3 arg_utils), whatever the key said; a window that straddles keeps the key, with a note."""
    keys = {k: v for k, v in LOGIC_RL.items() if "grad_offload" not in k}
    keys |= {A + "actor.ppo_mini_batch_size": "8", A + "rollout.max_num_seqs": "512"}
    old_v0 = verl_launch(keys, {"VLLM_ATTENTION_BACKEND": "XFORMERS"}, version="0.4.1")
    assert old_v0.knobs["vllm_engine"] == "v0" and old_v0.knobs["max_num_seqs"] == 256
    assert any("max_num_seqs = 256: vLLM's default, not the key's 512" in n for n in old_v0.notes)
    assert verl_launch(keys, version="0.4.1").knobs["max_num_seqs"] == 1024  # V1
    assert verl_launch(keys, version="0.6.0").knobs["max_num_seqs"] == 512  # passed since #2960
    # entropy_checkpointing dates the verl after 2025-06-11 only: the window straddles #2960
    straddling = verl_launch(keys | {A + "actor.entropy_checkpointing": "False"})
    assert straddling.knobs["max_num_seqs"] == 512
    assert any("max_num_seqs planned at the key's 512" in n and "#2960" in n for n in straddling.notes)


def test_verl_before_209_or_vllm_063_sizes_the_kv_cache_of_free_memory() -> None:
    """verl's vendored vLLM worker (third_party/vllm/vllm_v_0_6_3/worker.py) ran before f8b4d0857 (#209) and,
    later, whenever vLLM 0.6.3 was installed: vllm_memory=free. vLLM 0.8 on V1 is 'device', V0 'instance'."""
    keys = {k: v for k, v in LOGIC_RL.items() if "grad_offload" not in k} | {A + "actor.ppo_mini_batch_size": "8"}
    assert verl_launch(LOGIC_RL, version="0.1").knobs["vllm_memory"] == "free"
    assert verl_launch(keys, version="0.4.1").knobs["vllm_memory"] == "instance"
    assert verl_launch(keys, {"VLLM_VERSION": "0.6.3"}, version="0.4.1").knobs["vllm_memory"] == "free"
    assert verl_launch(keys, {"VLLM_VERSION": "0.6.3+rocm624"}, version="0.4.1").knobs["vllm_memory"] == "free"
    assert verl_launch(keys, {"VLLM_VERSION": "0.8.3"}, version="0.4.1").knobs["vllm_memory"] == "device"
    v0 = {"VLLM_VERSION": "0.8.3", "VLLM_USE_V1": "0"}
    assert verl_launch(keys, v0, version="0.4.1").knobs["vllm_memory"] == "instance"


def test_vendored_worker_takes_utilization_of_the_memory_left_free() -> None:
    """KV = util × (device − trainer − weights − profile peak − non-torch); graphs stay outside it."""
    model = resolve_model("qwen2.5-3b").spec
    gib = 2**30
    settings = VllmSettings(0.4, 1, 8192, 256, cuda_graphs=True, non_torch_buffers=True, engine="v0", of_free=True)
    b = vllm_budget(
        model=model,
        settings=settings,
        device_bytes=80 * gib,
        weight_bytes=2,
        overheads=Overheads(),
        preexisting_bytes=20 * gib,
    )
    free = 80 * gib - 20 * gib - b.weights_bytes - b.activation_bytes - b.non_torch_bytes
    assert b.kv_signed_bytes == int(0.4 * free) and b.cuda_graph_bytes > 0
    total = vllm_budget(
        model=model,
        settings=settings._replace(of_free=False),
        device_bytes=80 * gib,
        weight_bytes=2,
        overheads=Overheads(),
        preexisting_bytes=20 * gib,
    )
    own = b.weights_bytes + b.activation_bytes + b.non_torch_bytes + b.cuda_graph_bytes
    assert total.kv_signed_bytes == int(0.4 * 80 * gib) - 20 * gib - own


@pytest.mark.parametrize(
    ("version", "fsdp", "megatron"),
    [
        ("0.2", ("default", "each_phase"), ("default", "after_rollout")),  # #556 touched only the FSDP workers
        ("0.3.0.post1", ("default", "before_sync_after_rollout"), ("default", "after_rollout")),
        ("0.5.0", ("default", "verl"), ("default", "after_rollout")),  # 2025-07-23: before #2678 (07-25)
        ("2025-08-15", ("expandable", "verl"), ("default", "verl")),  # after #3020, before #3181
        ("0.6.0", ("expandable", "verl"), ("expandable", "verl")),
    ],
)
def test_the_megatron_workers_have_their_own_release_and_allocator_history(
    version: str, fsdp: tuple[str, str], megatron: tuple[str, str]
) -> None:
    """verl_versions.CHANGES per backend (planner/memory/releases.py): the Megatron sharding manager empties the
    cache after the weight sync since dc8b5076c (#2678) and switches expandable segments on since bf56a2aa2
    (#3181); its worker methods always released (memory/releases.py adds those beside the policy)."""
    keys = LOGIC_RL | {A + "actor.ppo_mini_batch_size": "8"}
    f = verl_launch(keys, version=version).knobs
    m = verl_launch(keys, version=version, config_name="ppo_megatron_trainer").knobs
    assert m["strategy"] == "megatron" and f.get("strategy", "fsdp") == "fsdp"
    assert (f["allocator"], f["release_cache"]) == fsdp
    assert (m["allocator"], m["release_cache"]) == megatron
