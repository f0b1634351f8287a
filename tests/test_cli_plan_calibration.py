"""`grpo-plan --calibration FILE` / the default calibration file, and `grpo-plan --plot memory.png`."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from typer.testing import CliRunner

from grpo_pilot.cli.plan import app
from grpo_pilot.errors import InputError
from grpo_pilot.memory_plot import memory_bars, write_memory_plot
from grpo_pilot.planner.calibration import CALIBRATION_DIR_ENV, Calibration, FitError, save_calibration
from grpo_pilot.planner.plan import load_plan
from grpo_pilot.planner.time_coefficients import DEFAULT_TIME_COEFFICIENTS
from grpo_pilot.tuner.versions import software_versions

TINY = ["--model", "examples/tiny", "--gpus", "1xcpu", "--prompts-per-step", "8", "--mini-batch", "8", "--n", "4"]
TINY += ["--prompt-len", "32", "--response-len", "16", "--no-kl", "--pin", "rollout_backend=hf", "--trials", "8"]


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def cpu_calibration(versions: dict | None = None, plan_gpu: str = "cpu") -> Calibration:
    coef = DEFAULT_TIME_COEFFICIENTS.model_copy(update={"train_dispatch_s_per_layer_pass": 0.003})
    return Calibration(
        name="box",
        device_kind="cpu",
        plan_gpu=plan_gpu,
        versions=software_versions() if versions is None else versions,
        time_coefficients=coef,
        num_trials=4,
        num_observations=8,
        fit_error=FitError(tokens_per_s_before=15, tokens_per_s_after=1.3, phase_time_before=8, phase_time_after=1.2),
        created_at="2026-11-24T06:00:00+00:00",
    )


def plan_json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_calibration_file_changes_the_prediction_and_is_recorded(tmp_path):
    path = save_calibration(cpu_calibration(), tmp_path / "cal.json")
    analytic = plan_json(run(*TINY, "--json"))
    cal = plan_json(run(*TINY, "--json", "--calibration", str(path)))
    assert analytic["provenance"]["calibration"] is None
    assert cal["provenance"]["calibration"] == "box" and cal["provenance"]["calibration_file"] == str(path)
    assert cal["provenance"]["calibration_versions"]["torch"] == software_versions()["torch"]
    # the fitted dispatch time (30x the analytic one) makes every update slower
    assert cal["phase_times_s"]["update"] > analytic["phase_times_s"]["update"]
    shown = run(*TINY, "--calibration", str(path))
    assert shown.exit_code == 0 and "note: calibration 'box' applied" in shown.stdout


def test_default_location_applies_or_is_skipped_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv(CALIBRATION_DIR_ENV, str(tmp_path))
    save_calibration(cpu_calibration(), tmp_path / "cpu.json")
    assert plan_json(run(*TINY, "--json"))["provenance"]["calibration_file"] == str(tmp_path / "cpu.json")
    assert plan_json(run(*TINY, "--json", "--no-calibration"))["provenance"]["calibration"] is None
    save_calibration(cpu_calibration({"torch": "0.0.1"}), tmp_path / "cpu.json")
    provenance = plan_json(run(*TINY, "--json"))["provenance"]
    assert provenance["calibration"] is None
    assert "not applied: it was measured with torch 0.0.1" in provenance["calibration_skipped"]


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "is not usable JSON: not valid JSON"),
        ('{"a": 1}', "not a grpo-pilot calibration file"),
        (None, "No calibration"),
    ],
)
def test_bad_calibration_file_is_exit_2(tmp_path, content, needle):
    path = tmp_path / "cal.json"
    if content is not None:
        path.write_text(content)
    result = run(*TINY, "--calibration", str(path))
    assert result.exit_code == 2 and needle in result.stderr and "Traceback" not in result.output


def test_calibration_for_other_hardware_is_exit_2(tmp_path):
    path = save_calibration(cpu_calibration(plan_gpu="H100-80G"), tmp_path / "cal.json")
    result = run(*TINY, "--calibration", str(path))
    assert result.exit_code == 2 and "does not apply to this plan: it was measured for H100-80G" in result.stderr
    both = run(*TINY, "--calibration", str(path), "--no-calibration")
    assert both.exit_code == 2 and "contradict" in both.stderr


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature and the chunk's CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    body = data[16 : 16 + length]
    assert struct.unpack(">I", data[16 + length : 20 + length])[0] == zlib.crc32(kind + body)
    assert data.endswith(b"IEND\xaeB`\x82")
    return struct.unpack(">II", body[:8])


def test_plot_is_a_png_of_the_plans_numbers(tmp_path):
    out = tmp_path / "plans" / "memory.png"
    result = run(
        "--model",
        "qwen2.5-7b",
        "--gpus",
        "8xH100-80G",
        "--trials",
        "20",
        "--plot",
        str(out),
        "-o",
        str(tmp_path / "plan.json"),
    )
    assert result.exit_code == 0, result.output
    width, height = png_size(out.read_bytes())
    assert width > 500 and height > 300 and out.stat().st_size > 10_000
    assert not list(out.parent.glob(".*.tmp"))
    plan = load_plan(tmp_path / "plan.json")
    bars = memory_bars(plan)
    assert bars.phases == ("rollout", "log_prob", "update", "weight_sync")
    for i, phase in enumerate(bars.phases):
        stacked = sum(bars.heights[item][i] for item in bars.items)
        assert stacked == plan.phases[phase].total_bytes == bars.totals[i]
        for item, value in plan.phases[phase].items.items():
            assert bars.heights.get(item, (0,) * 4)[i] == value
        assert bars.worst_case[i] == plan.worst_case_phases[phase]
    assert bars.usable_bytes == plan.usable_gpu_bytes and bars.worst_case_phase == plan.worst_case_phase
    assert bars.items[-1].startswith("overhead_") and not bars.items[0].startswith("overhead_")
    assert bars.peak_phase == max(plan.phases, key=lambda p: plan.phases[p].total_bytes)


def test_plot_without_matplotlib_is_an_input_error(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = run(*TINY, "--plot", str(tmp_path / "m.png"))
    assert result.exit_code == 2 and "--plot needs matplotlib" in result.stderr
    assert not (tmp_path / "m.png").exists()
    plan = load_plan("examples/tiny/plan.json")
    with pytest.raises(InputError) as info:
        write_memory_plot(plan, tmp_path / "n.png")
    assert "pip install 'grpo-pilot[plot]'" in info.value.hint


def test_grpo_run_rechecks_a_calibrated_plan_with_its_calibration(tmp_path):
    from grpo_pilot.planner.calibration import inputs_of_plan
    from grpo_pilot.planner.overheads import DEFAULT_OVERHEADS
    from grpo_pilot.planner.recheck import recheck

    # a fitted process RSS 4x the analytic one moves the tiny plan's peak far past the re-check's tolerance
    rss = DEFAULT_OVERHEADS.cpu_process_rss_bytes * 4
    heavy = cpu_calibration().model_copy(
        update={"overheads": DEFAULT_OVERHEADS.model_copy(update={"cpu_process_rss_bytes": rss})}
    )
    cal_path = save_calibration(heavy, tmp_path / "cal.json")
    out = tmp_path / "plan.json"
    result = run(*TINY, "--calibration", str(cal_path), "--out", str(out))
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    assert plan.provenance.calibration_file == str(cal_path)
    assert recheck(plan, inputs_of_plan(plan)).mismatch is None
    assert recheck(plan).mismatch is not None  # with the analytic constants the file would read as edited
    cal_path.unlink()  # the file is gone: the re-check falls back to the analytic constants
    assert inputs_of_plan(plan).calibration is None
