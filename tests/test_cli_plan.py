"""`grpo-plan` end to end: the JSON contract, the tables, every bad input, exports, exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer import main as typer_main
from typer.testing import CliRunner

from grpo_pilot.cli.plan import app, parse_pins
from grpo_pilot.errors import InputError
from grpo_pilot.planner.config import KNOB_KEYS
from grpo_pilot.planner.plan import load_plan
from grpo_pilot.planner.rules import PLAN_PHASES as PHASES

runner = CliRunner()
FAST = ["--trials", "20"]
CONTRACT = ("schema_version", "fits", "knobs", "peak_gpu_bytes", "usable_gpu_bytes", "predicted_step_s", "phases")
# every searched knob pinned (qwen2.5-7b on 8xH100 fits with these)
ALL_PINS = [
    "rollout_tp=2",
    "gpu_memory_utilization=0.6",
    "micro_batch_size_per_gpu=4",
    "log_prob_max_token_len_per_gpu=6144",
    "param_offload=false",
    "optimizer_offload=false",
    "ref_param_offload=true",
    "gradient_checkpointing=true",
    "fused_logprob=false",
    "enforce_eager=false",
    "ulysses_sp=1",
]


def run(*args: str):
    return runner.invoke(app, list(args))


def pins(values: list[str]) -> list[str]:
    return [x for v in values for x in ("--pin", v)]


def test_json_contract() -> None:
    r = run("--model", "qwen-7b", "--gpus", "8xH100", "--json", *FAST)
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)  # only the plan JSON on stdout
    for key in CONTRACT:
        assert key in plan
    assert plan["fits"] is True and plan["schema_version"] == 1
    assert set(plan["phases"]) == set(PHASES)
    for phase in plan["phases"].values():
        assert set(phase) == {"total_bytes", "items"}
        assert sum(phase["items"].values()) == phase["total_bytes"]
    assert plan["peak_gpu_bytes"] == max(p["total_bytes"] for p in plan["phases"].values()) <= plan["usable_gpu_bytes"]
    assert set(plan["knobs"]) == set(KNOB_KEYS)
    assert plan["model"]["resolved"] == "qwen2.5-7b" and plan["provenance"]["search_trials"] >= 20


def test_table_output_names_the_resolved_model_and_every_section() -> None:
    r = run("--model", "qwen-32b", "--gpus", "8xA100-80G", *FAST)
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "'qwen-32b' resolved to qwen3-32b (Qwen/Qwen3-32B)" in out
    for title in ("knobs", "GPU memory per phase", "host RAM per node", "step time", "tokens/s", "MFU"):
        assert title in out
    assert "usable" in out and "FITS" in out


def test_out_writes_a_loadable_plan(tmp_path: Path) -> None:
    target = tmp_path / "plans" / "plan.json"
    r = run(
        "--model",
        "qwen-7b",
        "--gpus",
        "8xH100",
        "--out",
        str(target),
        "--no-kl",
        "--n",
        "8",
        "--prompts-per-step",
        "512",
        *FAST,
    )
    assert r.exit_code == 0, r.stderr
    plan = load_plan(target)
    assert (
        plan.fits and not plan.workload.use_kl_loss and plan.workload.n == 8 and plan.workload.prompts_per_step == 512
    )
    assert [p.name for p in target.parent.iterdir()] == ["plan.json"]  # no temp file left behind


def test_every_searched_knob_pinned_evaluates_exactly_that() -> None:
    r = run("--model", "qwen-7b", "--gpus", "8xH100", "--json", *pins(ALL_PINS))
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["provenance"]["search_trials"] == 0
    assert plan["knobs"]["rollout_tp"] == 2 and plan["knobs"]["gpu_memory_utilization"] == 0.6
    assert plan["knobs"]["micro_batch_size_per_gpu"] == 4 and plan["knobs"]["max_token_len_per_gpu"] is None
    assert plan["knobs"]["ref_param_offload"] is True and plan["knobs"]["log_prob_max_token_len_per_gpu"] == 6144


def test_unknown_model_lists_closest_aliases() -> None:
    r = run("--model", "qwen-33b", "--gpus", "8xA100-80G")
    assert r.exit_code == 2
    assert "Unknown model 'qwen-33b'" in r.stderr and "qwen-32b" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_malformed_gpus_lists_accepted_forms() -> None:
    for bad in ("8A100", "8xZ100", "0xH100", "12xH100"):
        r = run("--model", "qwen-7b", "--gpus", bad)
        assert r.exit_code == 2, bad
        assert "Accepted forms" in r.stderr or "explicitly" in r.stderr
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "pin,expected",
    [
        ("foo=1", "not KEY=VALUE with a known knob key"),
        ("rollout_tp", "not KEY=VALUE"),
        ("rollout_tp=abc", "--pin rollout_tp=abc"),
        ("gpu_memory_utilization=1.5", "--pin gpu_memory_utilization=1.5"),
        ("placement=sideways", "--pin placement=sideways"),
    ],
)
def test_bad_pins_are_usage_errors_listing_keys(pin: str, expected: str) -> None:
    r = run("--model", "qwen-7b", "--gpus", "8xH100", "--pin", pin)
    assert r.exit_code == 2
    assert expected in r.stderr and "Knob keys: rollout_tp" in r.stderr


def test_parse_pins_coerces_types() -> None:
    got = parse_pins(
        [
            "param_offload=yes",
            "max_token_len_per_gpu=none",
            "gpu_memory_utilization=0.7",
            "placement=split",
            "ulysses-sp=2",
        ]
    )
    assert got == {
        "param_offload": True,
        "max_token_len_per_gpu": None,
        "gpu_memory_utilization": 0.7,
        "placement": "split",
        "ulysses_sp": 2,
    }
    with pytest.raises(InputError):
        parse_pins(["rollout_tp=0"])


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--gpus", "8xH100"], "--model is required"),
        (["--model", "qwen-7b"], "--gpus is required"),
        (["--model", "qwen-7b", "--gpus", "8xH100", "--target", "deepspeed"], "Unknown --target"),
        (["--model", "qwen-7b", "--gpus", "8xH100", "--emit", "axolotl"], "Unknown --emit"),
        (["--model", "qwen-7b", "--gpus", "8xH100", "--emit", "verl", "--json"], "--emit and --json"),
        (["--model", "qwen-7b", "--gpus", "8xH100", "--mini-batch", "2048"], "exceeds prompts_per_step"),
        (["--model", "qwen-7b", "--gpus", "8xH100", "--host-ram", "lots"], "Cannot read the size"),
    ],
)
def test_usage_errors_exit_2(args: list[str], expected: str) -> None:
    r = run(*args)
    assert r.exit_code == 2
    assert expected in r.stderr
    assert "Traceback" not in r.stderr


V = ["--from-verl", "tests/planner/real_runs/verl_examples/run_qwen2-7b.sh", "--gpus", "H100"]
RULE_CASES = [
    (["--model", "qwen-7b", "--gpus", "8xH100", "--target", "deepspeed"], "Unknown --target 'deepspeed'"),
    ([*V, "--from-trl", "x.yaml"], "--from-verl and --from-trl both name the configuration"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--emit", "axolotl"], "Unknown --emit 'axolotl'"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--emit", "verl", "--json"], "--emit and --json both want stdout"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--script-args", "-x"], "--script-args applies to a --from-verl"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--override", "a=1"], "--override applies to a --from-verl or"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--calibration", "c.json", "--no-calibration"], "contradict"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--lengths", "a", "--lengths-from", "b"], "both set the lengths"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--lengths-from", "b"], "--lengths-from needs --tokenizer"),
    (["--from-trl", "x.yaml"], "--from-trl needs --gpus"),
    ([*V, "--n", "4", "--kl"], "--n, --kl/--no-kl conflict with the launch file"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--algorithm", "dpo"], "Unknown --algorithm 'dpo'"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--compare", "a2c"], "Unknown --compare 'a2c'"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--compare", "grpo"], "--compare plans the other algorithm"),
    ([*V, "--lora-rank", "8"], "--lora-* and --quantize-base conflict with a launch file"),
    (["--model", "qwen-7b", "--gpus", "8xH100", "--lora-alpha", "16"], "need --lora-rank"),
    (["--model", "qwen-7b"], "--gpus is required"),
    ([], "--model and --gpus are required"),
]


@pytest.mark.parametrize("args,expected", RULE_CASES, ids=[c[1][:30] for c in RULE_CASES])
def test_each_flag_rule_is_one_paragraph(args: list[str], expected: str) -> None:
    """Every row of plan_flags.RULES refuses its case before any work, naming the flags."""
    from grpo_pilot.cli.plan_flags import RULES

    # the last two cases are one rule; --seed, --headroom-gib and --plot: tests/hostile/test_inputs_hostile.py
    assert len(RULES) == len(RULE_CASES) - 1 + 3
    r = run(*args)
    assert r.exit_code == 2 and r.stderr.startswith("error: ") and expected in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == ""


def test_typer_level_usage_errors_exit_2() -> None:
    assert run("--model", "qwen-7b", "--gpus", "8xH100", "--n", "0").exit_code == 2
    assert run("--model", "qwen-7b", "--gpus", "8xH100", "--bogus").exit_code == 2


def test_long_prompts_without_lengths_exit_4_with_a_boundary_on_both_means(tmp_path: Path) -> None:
    """No mean response fits with 8192-token prompts at their maximum (verl packs and scores every position of 32
    sequences); shorter prompts do: a conditional fit (exit 4) naming both means, planner/verdict.py."""
    out = tmp_path / "plan.json"
    pinned = [p for p in ALL_PINS if not p.startswith(("rollout_tp", "micro_batch"))] + [
        "rollout_tp=1",
        "micro_batch_size_per_gpu=32",
        "max_token_len_per_gpu=none",
        "log_prob_micro_batch_size_per_gpu=32",
    ]
    args = ["--model", "qwen2.5-0.5b", "--gpus", "1xH100", "--target", "verl", "--prompt-len", "8192",
            "--response-len", "2048", "--prompts-per-step", "64", "--n", "8", "--mini-batch", "64",
            "--headroom-gib", "0", *pins(pinned)]  # fmt: skip
    r = run(*args, "--json")
    assert r.exit_code == 4, r.stderr
    verdict = json.loads(r.stdout)["verdict"]
    assert verdict["kind"] == "fits_below_mean_lengths"
    prompt, response = verdict["boundary_mean_prompt_tokens"], verdict["boundary_mean_response_tokens"]
    assert 0 < prompt < 8192 and 0 < response < 2048
    assert f"at a mean prompt of up to {prompt} and a mean response of up to {response} tokens" in r.stderr
    table = run(*args, "--out", str(out))
    assert table.exit_code == 4 and "FITS ONLY WITH SHORT PROMPTS" in table.stdout and not out.exists()


def test_nothing_fits_exits_3_with_binding_and_suggestions(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = run("--model", "llama-70b", "--gpus", "1xA100-80G", "--out", str(out), *FAST)
    assert r.exit_code == 3
    assert "Nothing fits for llama-3.1-70b on 1xA100-80G" in r.stderr and "Binding constraint" in r.stderr
    assert "Suggestion: fewest A100-80G GPUs that fit: 16" in r.stderr
    assert "No plan file was written" in r.stderr and not out.exists()
    assert "DOES NOT FIT" in r.stdout


def test_pinned_config_that_does_not_fit_still_prints_json() -> None:
    r = run(
        "--model",
        "qwen-32b",
        "--gpus",
        "8xA100-80G",
        "--json",
        *pins([p.replace("ref_param_offload=true", "ref_param_offload=false") for p in ALL_PINS]),
    )
    assert r.exit_code == 3
    plan = json.loads(r.stdout)
    assert plan["fits"] is False and plan["violations"] and plan["suggestions"]
    assert plan["provenance"]["search_trials"] == 0
    assert "The pinned configuration does not fit" in r.stderr and "turning on param_offload" in r.stderr


def test_emit_verl_and_trl() -> None:
    verl = run("--model", "qwen-7b", "--gpus", "8xH100", "--emit", "verl", *FAST)
    assert verl.exit_code == 0
    assert "python3 -m verl.trainer.main_ppo \\" in verl.stdout and "actor_rollout_ref.rollout.n=5" in verl.stdout
    assert "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B" in verl.stdout
    # verl (#121 on) offloads the FSDP reference whatever ref.fsdp_config.param_offload: said, not claimed
    assert "# note: actor_rollout_ref.ref.fsdp_config.param_offload is written for completeness" in verl.stdout
    trl = run("--model", "qwen-7b", "--gpus", "8xH100", "--emit", "trl", *FAST)
    assert trl.exit_code == 0 and "GRPOConfig(" in trl.stdout and "num_generations=5," in trl.stdout
    # the export alone on stdout; the tables (which say the target) on stderr
    assert verl.stdout.startswith("# verl GRPO for") and trl.stdout.startswith("# TRL GRPOConfig for")
    assert "GPU memory per phase" not in verl.stdout + trl.stdout
    # --emit picks the executor the estimate models unless --target says otherwise
    assert "target verl" in verl.stderr and "target trl" in trl.stderr
    ours = run("--model", "qwen-7b", "--gpus", "8xH100", "--emit", "verl", "--target", "grpo-pilot", *FAST)
    assert ours.exit_code == 0 and "target grpo-pilot" in ours.stderr


def _plan_entry(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """grpo-plan as a process with stdout to a pipe, the way `grpo-plan ... > launch.sh` runs."""
    cmd = [sys.executable, "-c", "from grpo_pilot.cli import plan_entry; plan_entry()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd, env={**os.environ})


def test_emit_verl_on_stdout_is_a_shell_script(tmp_path: Path) -> None:
    done = _plan_entry("--model", "qwen-7b", "--gpus", "8xH100", "--emit", "verl", "--out", str(tmp_path / "p.json"))
    assert done.returncode == 0, done.stderr
    assert "FITS" in done.stderr and "plan written to" in done.stderr
    script = tmp_path / "launch.sh"
    script.write_text(done.stdout)
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    # bash reads it as one command with the plan's overrides
    words = subprocess.run(
        ["bash", "-c", f"python3() {{ printf '%s\\n' \"$@\"; }}; source {script}"], capture_output=True, text=True
    )
    assert words.returncode == 0 and "actor_rollout_ref.rollout.n=5" in words.stdout.splitlines()


def test_emit_trl_on_stdout_constructs_the_grpo_config(tmp_path: Path) -> None:
    """The printed Python builds the installed GRPOConfig: verbatim for a CPU plan; a GPU plan with bf16 swapped for
    use_cpu (bf16 validates only on a GPU), its FSDP checkpointing beside gradient_checkpointing=False."""
    trl = pytest.importorskip("trl")
    tiny = _plan_entry(
        *"--model examples/tiny --gpus 1xcpu --prompts-per-step 8 --mini-batch 8 --n 4 --prompt-len 32".split(),
        *"--response-len 16 --no-kl --pin rollout_backend=hf --emit trl".split(),
    )
    assert tiny.returncode == 0, tiny.stderr
    scope: dict = {}
    exec(compile(tiny.stdout, "<trl>", "exec"), scope)  # noqa: S102 - our own export
    assert isinstance(scope["config"], trl.GRPOConfig) and scope["config"].num_generations == 4
    gpu = _plan_entry("--model", "qwen-7b", "--gpus", "8xH100", "--emit", "trl", "--pin", "gradient_checkpointing=true")
    assert gpu.returncode == 0, gpu.stderr
    line = next(x for x in gpu.stdout.splitlines() if "gradient_checkpointing=" in x)
    assert line.startswith("    gradient_checkpointing=False,  # ") and "activation_checkpointing" in line
    scope = {}
    text = gpu.stdout.replace("bf16=True,", "bf16=False, use_cpu=True,").replace("grpo-output", str(tmp_path))
    exec(compile(text, "<trl>", "exec"), scope)  # noqa: S102
    config = scope["config"]
    assert config.fsdp_plugin_args["activation_checkpointing"] is True and config.gradient_checkpointing is False


def test_a_pin_the_target_has_no_setting_for_is_refused() -> None:
    r = run("--model", "qwen-7b", "--gpus", "8xH100", "--emit", "trl", "--pin", "ref_param_offload=true", *FAST)
    assert r.exit_code == 2 and "target trl has no setting for ref_param_offload" in r.stderr
    # the default the executor runs as may be pinned
    r = run("--model", "qwen-7b", "--gpus", "8xH100", "--emit", "trl", "--pin", "ref_param_offload=false", *FAST)
    assert r.exit_code == 0, r.stderr


def test_list_models() -> None:
    r = run("--list-models")
    assert r.exit_code == 0
    assert "qwen-32b" in r.stdout and "qwen3-32b" in r.stdout and "llama-3.1-70b" in r.stdout


def test_list_models_piped_is_never_cut() -> None:
    """Off a terminal every bundled name and hub id is printed whole (rich would cut them at 80 columns)."""
    from grpo_pilot.profiles.catalog import all_aliases

    r = run("--list-models")
    assert "…" not in r.stdout
    for name in all_aliases():
        assert name in r.stdout.split(), name
    assert "smollm2-135m-gguf" in r.stdout


def test_help_piped_shows_every_flag_whole_and_honest_defaults() -> None:
    from grpo_pilot.cli.plan_flags import PlanArgs
    from grpo_pilot.cli.run import app as run_app
    from grpo_pilot.cli.tune import app as tune_app
    from grpo_pilot.planner.search import DEFAULT_TRIALS

    for command in (app, run_app, tune_app):
        r = runner.invoke(command, ["--help"])
        assert r.exit_code == 0 and "…" not in r.stdout
        params = typer_main.get_command(command).params
        for decl in (d for p in params for d in p.opts + p.secondary_opts if d.startswith("--")):
            assert decl in r.stdout, decl
    help_text = runner.invoke(app, ["--help"]).stdout
    trials = help_text[help_text.index("--trials") :].split("--seed")[0]
    assert f"[default: {DEFAULT_TRIALS}]" in trials and "default: 0" not in trials
    assert PlanArgs().trials == DEFAULT_TRIALS


def test_installed_entry_point_runs_as_a_process() -> None:
    exe = Path(sys.executable).with_name("grpo-plan")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from grpo_pilot.cli import plan_entry; plan_entry()"]
    proc = subprocess.run(
        cmd + ["--model", "qwen-32b", "--gpus", "8xA100-80G", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fits"] is True
    bad = subprocess.run(cmd + ["--model", "nope", "--gpus", "8xA100-80G"], capture_output=True, text=True, timeout=120)
    assert (
        bad.returncode == 2 and bad.stderr.startswith("error: Unknown model 'nope'") and "Traceback" not in bad.stderr
    )


def test_from_verl_takes_pins_for_what_a_script_cannot_say(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 trainer.n_gpus_per_node=8\n"
    )
    base = run("--from-verl", str(script), "--gpus", "H100", "--json")
    pinned = run("--from-verl", str(script), "--gpus", "H100", "--json", "--pin", "vllm_memory=device")
    assert base.exit_code == 0 and pinned.exit_code == 0, pinned.output
    a, b = json.loads(base.stdout), json.loads(pinned.stdout)
    assert a["knobs"]["vllm_memory"] == "instance" and b["knobs"]["vllm_memory"] == "device"
    assert b["kv_cache_tokens_per_gpu"] < a["kv_cache_tokens_per_gpu"]
    assert run("--from-verl", str(script), "--gpus", "H100", "--n", "4").exit_code == 2  # the script sets n


def test_a_launch_that_does_not_fit_is_searched_with_its_launcher_kept_and_told_in_its_own_keys(tmp_path: Path) -> None:
    """--from-trl on a DDP launch whose micro-batch is too large: the search that follows keeps what no search
    moves (DDP, the load dtype) and reports its changes as GRPOConfig settings, not verl overrides."""
    config = tmp_path / "grpo.yaml"
    config.write_text(
        "model_name_or_path: Qwen/Qwen2.5-1.5B\nper_device_train_batch_size: 64\ngradient_accumulation_steps: 1\n"
        "num_generations: 8\nmax_prompt_length: 1024\nmax_completion_length: 4096\nuse_vllm: true\n"
        "vllm_mode: colocate\ngradient_checkpointing: false\nbf16: true\ndtype: bfloat16\n"
    )
    result = runner.invoke(app, ["--from-trl", str(config), "--gpus", "1xH100"])
    assert result.exit_code in (3, 4), result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    start = next(i for i, line in enumerate(notes) if line.startswith("note: a searched configuration fits"))
    changes = notes[start + 1 :]
    assert any(line.startswith("note: per_device_train_batch_size: 64 → ") for line in changes), changes
    assert not any("actor_rollout_ref" in line or "fsdp_config" in line for line in changes), changes
