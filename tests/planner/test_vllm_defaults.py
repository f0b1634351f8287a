"""vLLM's default max_num_seqs by engine, version and device (planner/vllm_defaults.py), and how a verl launch
from before #2960, which never passed rollout.max_num_seqs, picks it up (from_verl.engine_max_num_seqs)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from grpo_pilot.cli.plan import app
from grpo_pilot.hardware.gpus import lookup_gpu
from grpo_pilot.planner.from_verl import read_verl, verl_launch
from grpo_pilot.planner.vllm_defaults import parse_vllm_version, vllm_default_max_num_seqs

A = "actor_rollout_ref."
# a verl launch of spring 2025 whose key the engine never saw (verl before beb624610, #2960)
KEYS = {
    "algorithm.adv_estimator": "grpo",
    "data.train_batch_size": "8",
    "data.max_prompt_length": "400",
    "data.max_response_length": "2048",
    A + "model.path": "Qwen/Qwen2.5-0.5B-Instruct",
    A + "actor.ppo_mini_batch_size": "8",
    A + "actor.ppo_micro_batch_size_per_gpu": "4",
    A + "rollout.log_prob_micro_batch_size_per_gpu": "4",
    A + "ref.log_prob_micro_batch_size_per_gpu": "4",
    A + "rollout.n": "4",
    A + "rollout.max_num_seqs": "512",
    "trainer.n_gpus_per_node": "4",
}


def _gpu(name: str):  # noqa: ANN202 - GPUSpec
    gpu = lookup_gpu(name)
    assert gpu is not None
    return gpu


@pytest.mark.parametrize(
    ("engine", "version", "gpu", "expected"),
    [
        ("v1", "0.8.3", "L40S", 1024),  # _set_default_args_v1 of 0.8.3: every device
        ("v1", "0.8.4", "L40S", 256),  # #16158: 45 GiB < 70 GiB
        ("v1", "0.8.5.post1", "H100-80G", 1024),
        ("v1", "0.8.5", "A100-80G", 1024),  # 80 GiB, no A100 rule yet
        ("v1", "0.9.1", "A100-80G", 256),  # #17885: 'a100' in the device name
        ("v1", "0.9.1", "A800-80G", 1024),
        ("v1", "0.10.0", "H20", 1024),
        ("v1", "0.9.1", "A100-40G", 256),
        ("v0", "0.9.1", "H100-80G", 256),  # _set_default_args_v0
        ("v1", "0.7.3", "T4", 1024),  # 0.7's V1 opt-in: EngineArgs.__post_init__
    ],
)
def test_vllm_default_max_num_seqs_by_version_and_device(engine: str, version: str, gpu: str, expected: int) -> None:
    parsed = parse_vllm_version(version)
    assert parsed is not None
    assert vllm_default_max_num_seqs(engine, parsed, _gpu(gpu)) == expected


def test_device_dependent_default_without_a_device_is_unknown() -> None:
    assert parse_vllm_version("0.6.3+rocm624") == (0, 6, 3) and parse_vllm_version("main") is None
    assert vllm_default_max_num_seqs("v1", (0, 9, 1), None) is None
    assert vllm_default_max_num_seqs("v1", (0, 9, 1), _gpu("cpu")) is None
    assert vllm_default_max_num_seqs("v1", (0, 8, 3), None) == 1024


def test_verl_before_2960_takes_the_installed_vllms_default_on_the_launchs_gpu() -> None:
    """VLLM_VERSION names the vLLM: 0.8.5 on an L40S ran 256 sequences (the old code planned 1024)."""
    l40s = verl_launch(KEYS, {"VLLM_VERSION": "0.8.5"}, version="0.4.1", gpu=_gpu("L40S"))
    assert l40s.knobs["max_num_seqs"] == 256
    assert any("max_num_seqs = 256: vLLM's default, not the key's 512" in n for n in l40s.notes)
    a100 = {"VLLM_VERSION": "0.9.1"}
    assert verl_launch(KEYS, a100, version="0.5.0", gpu=_gpu("A100-80G")).knobs["max_num_seqs"] == 256
    assert (
        verl_launch(KEYS, {"VLLM_VERSION": "0.8.5"}, version="0.4.1", gpu=_gpu("A100-80G")).knobs["max_num_seqs"]
        == 1024
    )
    assert verl_launch(KEYS, a100, version="0.5.0", gpu=_gpu("H100-80G")).knobs["max_num_seqs"] == 1024
    # the key reaches the engine from #2960 on, whatever the vLLM
    assert verl_launch(KEYS, a100, version="0.6.0", gpu=_gpu("L40S")).knobs["max_num_seqs"] == 512
    # a device-dependent default with no device: vLLM 0.8.3's figure, with a note saying so
    unknown = verl_launch(KEYS, {"VLLM_VERSION": "0.9.1"}, version="0.4.1")
    assert unknown.knobs["max_num_seqs"] == 1024
    assert any("depends on the device" in n for n in unknown.notes)


def test_without_vllm_version_a_verl_that_allowed_vllm_084_notes_the_smaller_default() -> None:
    """verl allowed vllm<=0.8.3 until 43782a24b (#1505): no doubt before; after, 1024 stays with a note on a
    device under 70 GiB (or an A100), naming the override."""
    after = verl_launch(KEYS, version="0.4.1", gpu=_gpu("L40S"))
    assert after.knobs["max_num_seqs"] == 1024
    assert any("assumes vLLM <= 0.8.3" in n and "VLLM_VERSION" in n for n in after.notes)
    before = verl_launch(KEYS, version="0.3.0.post1", gpu=_gpu("L40S"))
    assert before.knobs["max_num_seqs"] == 1024 and not any("assumes vLLM" in n for n in before.notes)
    h100 = verl_launch(KEYS, version="0.4.1", gpu=_gpu("H100-80G"))
    assert not any("assumes vLLM" in n for n in h100.notes)


def test_cli_passes_the_gpu_of_gpus(tmp_path) -> None:  # noqa: ANN001 - pytest's tmp_path
    script = tmp_path / "run.sh"
    words = " ".join(f"{k}={v}" for k, v in KEYS.items())
    script.write_text(f"python3 -m verl.trainer.main_ppo {words}\n")
    launch = read_verl(script.read_text(), ["VLLM_VERSION=0.8.5", "VERL_VERSION=0.4.1"], gpu=_gpu("L40S"))
    assert launch.knobs["max_num_seqs"] == 256
    args = ["--from-verl", str(script), "--gpus", "L40S", "--model", "qwen2.5-0.5b", "--json"]
    args += ["--override", "VLLM_VERSION=0.8.5", "--override", "VERL_VERSION=0.4.1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 3), result.output
    assert json.loads(result.stdout)["knobs"]["max_num_seqs"] == 256
