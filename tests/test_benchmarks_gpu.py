"""The GPU benchmark scripts on a machine without a GPU: argument checks, the no-GPU exit, the figures they derive,
the JSON they write, and the committed plans of the GPU session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import engine_gpu  # noqa: E402
import gpu_common  # noqa: E402
import gpu_session  # noqa: E402

from grpo_pilot.hardware.gpus import lookup_gpu  # noqa: E402
from grpo_pilot.profiles.catalog import resolve_model  # noqa: E402


def test_engine_gpu_without_a_gpu_says_so_and_exits_0(tmp_path, capsys):
    assert engine_gpu.main(["--shape", "3b", "--json", str(tmp_path / "r.json")]) == 0
    assert "no GPU" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "no_gpu"


def test_engine_gpu_refuses_micro_batches_that_do_not_divide_the_rows():
    with pytest.raises(SystemExit) as exc:
        engine_gpu.parse_args(["--micro-batch", "24"])  # 16 x 4 = 64 rows
    assert exc.value.code == 2
    assert engine_gpu.parse_args(["--micro-batch", "32"]).micro_batch == 32


def test_the_rollout_roofline_is_weights_plus_kv_over_bandwidth():
    spec = resolve_model("qwen2.5-0.5b").spec
    h200 = lookup_gpu("H200")
    # one decode step of 64 rows at 62 prompt + t tokens: the bf16 weights (2 bytes x ~494M) and each row's
    # K/V (24 layers x 2 KV heads x 64 dims x K,V x 2 bytes = 12 KiB per token)
    assert gpu_common.decode_step_bytes(spec, rows=1, context_tokens=1) - 2 * spec.num_params == 24 * 2 * 64 * 2 * 2
    per_step = gpu_common.rollout_roofline_s(
        spec, rows=64, prompt_tokens=62, new_tokens=256, hbm_bytes_per_s=h200.hbm_bytes_per_s
    )
    assert per_step / 256 == pytest.approx((2 * spec.num_params + 64 * (62 + 127.5) * 12288) / h200.hbm_bytes_per_s)
    assert 0.2e-3 < per_step / 256 < 0.26e-3  # the "0.23 ms" per token step
    # update FLOPs: 3 x the planner's forward FLOPs per token
    from grpo_pilot.planner.roofline import forward_flops_per_token

    flops = gpu_common.update_flops(spec, trained_tokens=1000, seq_tokens=318)
    assert flops == pytest.approx(3000 * forward_flops_per_token(spec, 318))


def _fake_result(system: str, step_s: float, rollout_s: float) -> dict:
    steps = [{"step_s": step_s, "rollout_s": rollout_s, "update_s": step_s - rollout_s, "trained_tokens": 20352,
              "generated_tokens": 64 * 256}] * 2  # fmt: skip
    return {"system": system, "steps": steps, "peak_allocated_bytes": 10 << 30, "peak_reserved_bytes": 12 << 30,
            "poller": {"device_used_peak_bytes": 13 << 30}}  # fmt: skip


def test_summary_rows_and_table():
    a = engine_gpu.parse_args(["--shape", "0.5b"])
    gpu = lookup_gpu("H100-80G")
    ours = engine_gpu.summarise(_fake_result("ours", 2.0, 1.5), a, gpu)
    trl = engine_gpu.summarise(_fake_result("trl", 5.0, 4.0), a, gpu)
    assert ours["steps_per_s"] == 0.5 and ours["tokens_per_s"] == pytest.approx(20352 / 2.0)
    assert ours["rollout_tokens_per_s"] == pytest.approx(64 * 256 / 1.5)
    spec = resolve_model("qwen2.5-0.5b").spec
    roof = gpu_common.rollout_roofline_s(
        spec, rows=64, prompt_tokens=62, new_tokens=256, hbm_bytes_per_s=gpu.hbm_bytes_per_s
    )
    assert ours["rollout_roofline_frac"] == pytest.approx(roof / 1.5)
    assert ours["update_mfu"] == pytest.approx(
        gpu_common.update_flops(spec, trained_tokens=20352, seq_tokens=318) / (0.5 * gpu.bf16_flops)
    )
    table = engine_gpu.format_table([ours, trl, {"system": "trl2", "error": "exit 1: ImportError"}])
    lines = table.splitlines()
    assert lines[1].split()[0] == "ours" and lines[1].rstrip().endswith("2.50x")  # 0.5 vs 0.2 steps/s
    assert "13.00" in lines[1] and "failed: exit 1" in lines[3]
    assert engine_gpu.summarise({"system": "ours", "steps": []}, a, gpu)["error"] == "no measured step"


def test_write_json_replaces_atomically(tmp_path):
    path = gpu_common.write_json(tmp_path / "sub" / "x.json", {"a": 1, "p": Path("/x")})
    gpu_common.write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2} and [p.name for p in path.parent.iterdir()] == ["x.json"]


def test_prompts_have_exactly_the_asked_number_of_tokens(tmp_path):
    from grpo_pilot.engine.model_factory import build_tokenizer

    path = gpu_common.write_prompts(tmp_path / "p.jsonl", count=5, length=62)
    tok = build_tokenizer("qwen2.5-0.5b")
    texts = [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
    assert len(texts) == 5 and len(set(texts)) == 5
    assert {len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts} == {62}


def test_gpu_session_arguments_list_and_no_gpu_exit(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_session.parse_args([])  # --out is needed for a session
    with pytest.raises(SystemExit):
        gpu_session.parse_args(["--out", str(tmp_path), "--only", "engine-7b"])
    assert gpu_session.main(["--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed[0] == "run-qwen2.5-1.5b-kl-2minibatch-as-run"
    assert "run-qwen2.5-3b-kl" in listed and "run-qwen2.5-3b-kl-offload" in listed
    assert gpu_session.main(["--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "session.json").read_text())["status"] == "no_gpu"


def test_the_as_run_case_pins_what_the_h200_run_had(tmp_path):
    """The 1.5B run as measured: its knobs, the allocator settings of the runs, the history recorded."""
    measured = json.loads((ROOT / "tests/planner/gpu_measurements/h200-2026-11-26.json").read_text())["cases"]
    knobs = next(c["knobs"] for c in measured if c["name"] == "qwen2.5-1.5b-kl-2minibatch")
    for gpu in gpu_session.PLAN_GPUS:
        plan = json.loads((gpu_session.PLANS / gpu / f"{gpu_session.AS_RUN.name}.json").read_text())
        for key in ("micro_batch_size_per_gpu", "max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
            assert plan["knobs"][key] == knobs[key], (gpu, key)
        assert (plan["knobs"]["allocator"], plan["knobs"]["release_cache"]) == ("default", "after_rollout")
    assert gpu_session.AS_RUN.run_sets == ("memory_history=true",)
    assert gpu_session._history(tmp_path) == {}  # no snapshot written: nothing to summarise


@pytest.mark.parametrize("gpu", gpu_session.PLAN_GPUS)
def test_the_committed_plans_are_the_cases_plan_commands(gpu):
    h200 = (
        json.loads(Path("/work/shared/measurements/h200-2026-11-26.json").read_text())["cases"]
        if Path("/work/shared/measurements/h200-2026-11-26.json").exists()
        else []
    )
    for case in gpu_session.RUN_CASES:
        plan = json.loads((gpu_session.PLANS / gpu / f"{case.name}.json").read_text())
        args = dict(zip(case.plan_args[::2], case.plan_args[1::2]))
        w = plan["workload"]
        assert plan["fits"] and plan["knobs"]["rollout_backend"] == "hf"
        assert (w["prompts_per_step"], w["n"], w["prompt_len_tokens"], w["response_len_tokens"]) == tuple(
            int(args[k]) for k in ("--prompts-per-step", "--n", "--prompt-len", "--response-len")
        )
        assert w["use_kl_loss"] == ("--kl" in case.plan_args)
        same = [c for c in h200 if c["name"] == case.name]
        if gpu == "H200" and same:  # the H200 file's plans: the same knobs from the same command
            assert {k: plan["knobs"][k] for k in same[0]["knobs"]} == same[0]["knobs"]


def test_a_run_directory_reads_into_the_session_fields(tmp_path):
    out = tmp_path / "run"
    entry = "from grpo_pilot.cli import run_entry; run_entry()"
    cmd = [sys.executable, "-c", entry, str(ROOT / "examples/tiny/plan.json"), "--config",
           str(ROOT / "examples/tiny/run.toml"), "--steps", "2", "--out", str(out), "--no-checkpoint", "-q",
           "--set", "cpu_memory=rss", "--set", "max_new_tokens=4"]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    got = gpu_session._read_run(out)
    assert len(got["step_s"]) == 2 and set(got["phases"]) >= {"rollout", "update"}
    assert got["phases"]["update"]["measured_wall_s"] > 0 and got["allocator"]["applies"].startswith("no-op on cpu")
    assert got["rollout_weight_copy_bytes"] == 0 and "failure" not in got


TINY = str(ROOT / "examples" / "tiny")


@pytest.mark.slow
def test_engine_gpu_both_workers_and_the_decode_bench_run_end_to_end_on_the_cpu(tmp_path):
    # the GPU benchmark's own code paths (processes, our engine, TRL's trainer, the table, the JSON) on the tiny
    # example model and the CPU: what a GPU session runs, minus the CUDA calls
    small = ["--device", "cpu", "--model", TINY, "--prompts-per-step", "2", "--n", "4", "--prompt-len", "12",
             "--max-new", "6", "--micro-batch", "8", "--steps", "1", "--warmup", "1"]  # fmt: skip
    assert engine_gpu.main([*small, "--json", str(tmp_path / "e.json")]) == 0
    report = json.loads((tmp_path / "e.json").read_text())
    rows = {r["system"]: r for r in report["rows"]}
    assert set(rows) == {"ours", "trl"} and all("error" not in r for r in rows.values()), report["rows"]
    assert rows["ours"]["step_s"] > 0 and rows["trl"]["rollout_s"] > 0
    assert rows["ours"]["rollout_tokens_per_s"] == pytest.approx(8 * 6 / rows["ours"]["rollout_s"])
    assert engine_gpu.main([*small, "--decode-bench", "--json", str(tmp_path / "d.json")]) == 0
    bench = json.loads((tmp_path / "d.json").read_text())["result"]
    assert set(bench["modes"]) == {"eager", "static", "cuda_graph"} and bench["static_equals_cuda_graph"]
    assert bench["eager_prefix_agreement"] == 1.0  # fp32 on the CPU: every loop gives the same tokens


def test_a_session_case_runs_in_process_and_records_the_h200_fields(tmp_path):
    case = gpu_session.RunCase("tiny", ("--model", TINY))
    got = gpu_session.run_case_here(case, ROOT / "examples/tiny/plan.json", tmp_path / "case.json", device="cpu")
    assert got["completed"] and got["exit_code"] == 0 and len(got["step_s"]) == gpu_session.RUN_STEPS
    assert "--no-checkpoint" in got["run_command"] and got["predicted"]["peak_gpu_bytes"] > 0
    assert json.loads((tmp_path / "case.json").read_text())["phases"]["update"]["measured_wall_s"] > 0


def test_the_session_skips_what_the_budget_cannot_hold_and_saves_after_each_task(tmp_path, monkeypatch):
    session = gpu_session.Session(tmp_path, budget_s=60.0)
    monkeypatch.setattr(gpu_session.Session, "_run_engine", lambda self, task, timeout: {"status": "ok", "t": timeout})
    tasks = {t.name: t for t in gpu_session.TASKS}
    session.run(tasks["decode-0.5b"], "H100-80G")
    assert session.report["tasks"]["decode-0.5b"]["status"] == "ok"
    assert session.report["tasks"]["decode-0.5b"]["t"] <= 60.0  # capped by what was left
    saved = json.loads((tmp_path / "session.json").read_text())
    assert saved["tasks"]["decode-0.5b"]["status"] == "ok"
    session.t0 -= 30.0  # 30 s used: less than MIN_TASK_S left
    session.run(tasks["engine-0.5b"], "H100-80G")
    assert session.report["tasks"]["engine-0.5b"]["status"] == "skipped"


def test_a_script_task_returns_the_json_files_it_wrote(tmp_path, monkeypatch):
    """The session's script tasks (allocator_trace_gpu.py): without a GPU the script says so, exits 0 and writes
    nothing; the task reads as failed with that tail rather than breaking the session."""
    session = gpu_session.Session(tmp_path, budget_s=300.0)
    task = {t.name: t for t in gpu_session.TASKS}["trace-actor-1.5b"]
    session.run(task, "H100-80G")
    got = session.report["tasks"]["trace-actor-1.5b"]
    assert got["exit_code"] == 0 and got["files"] == {} and got["status"] == "failed"
