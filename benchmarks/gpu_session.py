"""The one GPU session: every GPU measurement this repo wants from a lent machine, within a time budget, as JSON.

    python benchmarks/gpu_session.py --out DIR [--budget-s 450]      on the GPU machine (gpu_session.sh runs it)
    python benchmarks/gpu_session.py --make-plans benchmarks/gpu_plans   here, on the CPU: the plans it runs
    python benchmarks/gpu_session.py --list                          the tasks, in order, with their caps

Tasks, in order (each in a fresh process, each capped; a task that does not fit in what is left of the budget is
recorded as skipped, so the most wanted numbers come first; `--list` prints them):
  1. run-qwen2.5-1.5b-kl-2minibatch-as-run   the H200's 1.5B run as measured (its knobs, default allocator, one
                    release after the rollout) with the allocator's history recorded and summarised (AS_RUN)
  2-3. run-qwen2.5-1.5b-ckpt, run-qwen3-0.6b-2minibatch   new shapes (gradient checkpointing; two mini-batches)
  4. trace-actor-1.5b   allocator_trace_gpu.py: that case's actor steps on real tensors, the real allocation
                    sequence replayed by verify/allocator_sim.py (real reserve vs the simulator's)
  5. decode-0.5b    engine_gpu.py --decode-bench --shape 0.5b: the hf rollout's eager / static / cuda_graph loops
  6. engine-0.5b    engine_gpu.py --shape 0.5b: ours beside TRL's GRPOTrainer
  7-9. run-*        grpo-run re-measurements of the H200 file's 0.5B, 1.5B (two mini-batches) and 3B plan commands
                    in the method of /work/shared/measurements/h200-2026-11-26.json (its `about`): random weights,
                    character tokenizer, prompts of exactly prompt_len − 2 tokens, char_fraction reward, 3 steps,
                    --no-checkpoint, a poller of cudaMemGetInfo every 20 ms in the engine's own process
  10. engine-3b     engine_gpu.py --shape 3b
  11. decode-3b     engine_gpu.py --decode-bench --shape 3b (128 new tokens)
  12. run-qwen2.5-3b-kl-offload   the H200 file's offload case (parameters and optimizer states on the host),
                    after everything else: it runs only with budget to spare (--budget-s, or --only)

Plans: benchmarks/gpu_plans/<GPU>/<case>.json, made here with --make-plans from the cases' plan commands for
1xH100-80G and 1xH200 (no search time on the machine); on another GPU kind, or when this checkout cannot load a
committed plan, the session runs the case's grpo-plan there with --gpus local (optuna comes with gpu_wheels.sh).
Everything lands in DIR/session.json (rewritten after every task, so a cut session still returns what it measured)
and DIR/session.log. Without CUDA it writes {"status": "no_gpu"} and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_common import NO_GPU, DevicePoller, cuda_available, local_gpu, write_json, write_prompts  # noqa: E402

PLANS = HERE / "gpu_plans"
PLAN_GPUS = ("H100-80G", "H200")
RUN_STEPS = 3


def run_args(device: str = "cuda") -> list[str]:
    """grpo-run's flags beside the plan, the dataset and --out (the H200 file's method)."""
    return ["--reward", "char_fraction:char=a", "--steps", str(RUN_STEPS), "--device", device, "--no-checkpoint", "-q",
            "--force"]  # fmt: skip


@dataclass(frozen=True)
class RunCase:
    """One grpo-run re-measurement: a name and its grpo-plan arguments (without --gpus / --out)."""

    name: str
    plan_args: tuple[str, ...]
    new: bool = False  # not in the H200 file
    run_sets: tuple[str, ...] = ()  # grpo-run --set KEY=VALUE beside run_args()


def _plan_args(model: str, prompts: int, mini: int, n: int, prompt: int, response: int, kl: bool, *pins: str):
    args = ["--model", model, "--prompts-per-step", str(prompts), "--mini-batch", str(mini), "--n", str(n),
            "--prompt-len", str(prompt), "--response-len", str(response), "--kl" if kl else "--no-kl",
            "--pin", "rollout_backend=hf"]  # fmt: skip
    for pin in pins:
        args += ["--pin", pin]
    return tuple(args)


# The 1.5B run exactly as the H200 measured it (its knobs, PyTorch's default allocator, the cache emptied after
# the rollout only, eager decode) with the allocator's history recorded: the measured reserve is 5.3 GiB above
# what the allocator's rules give for the engine's recorded allocations (docs/validation.md, "Device
# footprint"); the history's segments at the peak say which requests made them.
AS_RUN = RunCase(
    "qwen2.5-1.5b-kl-2minibatch-as-run",
    _plan_args("qwen2.5-1.5b", 16, 8, 4, 128, 256, True, "micro_batch_size_per_gpu=4", "max_token_len_per_gpu=6144",
               "log_prob_max_token_len_per_gpu=1536", "allocator=default", "release_cache=after_rollout",
               "hf_decode=eager"),
    run_sets=("memory_history=true",),
)  # fmt: skip
RUN_CASES = (
    RunCase("qwen2.5-0.5b", _plan_args("qwen2.5-0.5b", 16, 16, 4, 64, 256, False)),
    RunCase("qwen2.5-1.5b-kl-2minibatch", _plan_args("qwen2.5-1.5b", 16, 8, 4, 128, 256, True)),
    RunCase("qwen2.5-3b-kl", _plan_args("qwen2.5-3b", 8, 8, 8, 256, 768, True)),
    RunCase(
        "qwen2.5-1.5b-ckpt",
        _plan_args("qwen2.5-1.5b", 16, 16, 4, 128, 256, False, "gradient_checkpointing=true"),
        new=True,
    ),  # fmt: skip
    RunCase("qwen3-0.6b-2minibatch", _plan_args("qwen3-0.6b", 16, 8, 4, 64, 256, False), new=True),
    # last, and only with budget to spare: the offload case (83 s for its first step on the H200)
    RunCase(
        "qwen2.5-3b-kl-offload",
        _plan_args("qwen2.5-3b", 8, 8, 8, 256, 768, True, "param_offload=true", "optimizer_offload=true"),
    ),  # fmt: skip
)


@dataclass(frozen=True)
class Task:
    name: str
    cap_s: float  # the most this task may take (its process is killed past it)
    argv: tuple[str, ...]  # engine_gpu.py arguments, or ("run", case name)


MEASUREMENTS = "tests/planner/gpu_measurements/h200-2026-11-26.json"
NEW_SHAPES = tuple(c for c in RUN_CASES if c.new)  # issue 13: a shape with checkpointing, one with two mini-batches
TASKS = (
    Task(f"run-{AS_RUN.name}", 240, ("run", AS_RUN.name)),
    *(Task(f"run-{c.name}", 150, ("run", c.name)) for c in NEW_SHAPES),
    # the actor's steps of the 1.5B case on real tensors, their allocation sequence replayed by the simulator
    Task("trace-actor-1.5b", 180, ("script", "allocator_trace_gpu.py", MEASUREMENTS)),
    Task("decode-0.5b", 120, ("--shape", "0.5b", "--decode-bench")),
    Task("engine-0.5b", 200, ("--shape", "0.5b")),
    *(Task(f"run-{c.name}", 240 if "3b" in c.name else 150, ("run", c.name)) for c in RUN_CASES[:-1] if not c.new),
    Task("engine-3b", 300, ("--shape", "3b")),
    Task("decode-3b", 150, ("--shape", "3b", "--decode-bench", "--max-new", "128")),
    Task(f"run-{RUN_CASES[-1].name}", 300, ("run", RUN_CASES[-1].name)),
)
MIN_TASK_S = 45  # a task with less than this left of the budget is skipped, not started


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="where session.json and session.log go ($OUT)")
    p.add_argument("--budget-s", type=float, default=450.0, help="wall-time budget of all tasks together")
    p.add_argument("--only", default=None, help="comma-separated task names (default: all, in order)")
    p.add_argument("--list", action="store_true", help="print the tasks and exit")
    p.add_argument("--make-plans", type=Path, default=None, help="write the run cases' plans here (CPU is fine)")
    p.add_argument("--child-run", default=None, help=argparse.SUPPRESS)  # a case name: run it in this process
    p.add_argument("--child-plan", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-json", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    known = {t.name for t in TASKS}
    if a.only:
        unknown = set(a.only.split(",")) - known
        if unknown:
            p.error(f"unknown task(s) {sorted(unknown)}; known: {', '.join(t.name for t in TASKS)}")
    if not (a.list or a.make_plans or a.child_run) and a.out is None:
        p.error("--out DIR is required (the GPU session writes session.json there)")
    if a.budget_s <= 0:
        p.error("--budget-s must be positive")
    return a


def case_named(name: str) -> RunCase:
    return next(c for c in (AS_RUN, *RUN_CASES) if c.name == name)


def plan_command(case: RunCase, gpus: str, out: Path) -> list[str]:
    return ["grpo-plan", *case.plan_args, "--gpus", gpus, "--out", str(out)]


def _cli(entry: str, argv: list[str], *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`grpo-plan` / `grpo-run` (`entry` = plan_entry / run_entry) of this checkout, in a subprocess."""
    code = f"import sys; from grpo_pilot.cli import {entry}; sys.argv = ['{entry}'] + sys.argv[1:]; {entry}()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(HERE.parent), os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout_s,
                          env=env)  # fmt: skip


def committed_plan(case: RunCase, gpu_name: str | None) -> Path | None:
    """benchmarks/gpu_plans/<GPU>/<case>.json when it exists and this checkout's planner loads it, else None."""
    from grpo_pilot.errors import GrpoPilotError
    from grpo_pilot.planner.plan import load_plan

    path = PLANS / str(gpu_name) / f"{case.name}.json"
    if not path.exists():
        return None
    try:
        load_plan(path)
    except GrpoPilotError:
        return None
    return path


def make_plans(root: Path) -> int:
    """Each run case's plan for each GPU of PLAN_GPUS (grpo-plan's own search), at root/<GPU>/<case>.json."""
    failed = 0
    for gpu in PLAN_GPUS:
        for case in (AS_RUN, *RUN_CASES):
            out = root / gpu / f"{case.name}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            proc = _cli("plan_entry", plan_command(case, f"1x{gpu}", out)[1:], timeout_s=600)
            ok = out.exists()
            failed += not ok
            print(f"{gpu:9s} {case.name:28s} {'written' if ok else 'FAILED'} (exit {proc.returncode})")
            if not ok:
                print((proc.stderr or proc.stdout).strip()[-600:])
    return 1 if failed else 0


# -- one grpo-run case, inside the process that polls the device ---------------------------------------


def run_case_here(case: RunCase, plan: Path, json_out: Path, *, device: str = "cuda") -> dict[str, Any]:
    """grpo-run `plan` in this process with a cudaMemGetInfo poller beside it; the H200 file's fields (`device`
    "cpu": a smoke run without the poller)."""
    from grpo_pilot.cli import run_entry

    raw = json.loads(plan.read_text())
    w = raw["workload"]
    with tempfile.TemporaryDirectory(prefix="grpo-gpu-run-") as tmp:
        dataset = write_prompts(Path(tmp) / "prompts.jsonl", count=w["prompts_per_step"] * (RUN_STEPS + 1),
                                length=w["prompt_len_tokens"] - 2)  # fmt: skip
        out = Path(tmp) / "run"
        flags = run_args(device) + [arg for kv in case.run_sets for arg in ("--set", kv)]
        argv = [str(plan), "--dataset", str(dataset), *flags, "--out", str(out)]
        result: dict[str, Any] = {"name": case.name, "new_case": case.new, "plan_command": " ".join(case.plan_args),
                                  "run_command": "grpo-run plan.json --dataset prompts.jsonl " + " ".join(flags),
                                  "knobs": raw["knobs"], "plan_fits": raw.get("fits")}  # fmt: skip
        sys.argv = ["grpo-run", *argv]
        code: Any = 0
        with DevicePoller(enabled=device == "cuda") as poller:
            try:
                run_entry()
            except SystemExit as exc:
                code = exc.code
        result.update(poller.result(), exit_code=code, completed=(out / "profile.json").exists())
        result.update(_read_run(out))
        result.update(_history(out))
    result["predicted"] = {k: raw.get(k) for k in ("peak_gpu_bytes", "predicted_step_s", "phase_times_s")}
    result["predicted"]["phase_total_bytes"] = {k: v["total_bytes"] for k, v in raw["phases"].items()}
    write_json(json_out, result)
    return result


def _history(out: Path) -> dict[str, Any]:
    """The allocator history's summary (engine/memory_history.py) when the run recorded one."""
    import pickle

    from grpo_pilot.engine.memory_history import SNAPSHOT_FILE, summarize

    path = out / "workers" / "worker-0" / SNAPSHOT_FILE
    if not path.exists():
        return {}
    with open(path, "rb") as handle:
        snapshot = pickle.load(handle)  # noqa: S301 - the file this run just wrote
    return {"memory_history": summarize(snapshot), "memory_snapshot_bytes": path.stat().st_size}


def _read_run(out: Path) -> dict[str, Any]:
    """profile.json's per-phase measurements and allocator record, metrics.jsonl's step and phase times."""
    found: dict[str, Any] = {}
    if (out / "profile.json").exists():
        profile = json.loads((out / "profile.json").read_text())
        keys = ("measured_wall_s", "measured_peak_bytes", "measured_reserved_peak_bytes", "measured_device_peak_bytes",
                "predicted_total_bytes", "device_rel_error", "memory_rel_error", "time_rel_error")  # fmt: skip
        found["phases"] = {name: {k: row.get(k) for k in keys} for name, row in profile["phases"].items()}
        found.update({k: profile.get(k) for k in ("allocator", "rollout_weight_copy_bytes", "notes", "device")})
    if (out / "metrics.jsonl").exists():
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        found["step_s"] = [r["step_s"] for r in records]
        found["phase_s"] = [r["phase_s"] for r in records]
        found["phase_device_peak_bytes"] = [r.get("phase_device_peak_bytes") for r in records]
    if (out / "failure.json").exists():
        found["failure"] = json.loads((out / "failure.json").read_text())
    return found


# -- the session ----------------------------------------------------------------------------------------


class Session:
    """Runs the tasks within the budget and keeps session.json current (module docstring)."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.budget_s, self.t0 = out, budget_s, time.perf_counter()
        self.report: dict[str, Any] = {"status": "running", "budget_s": budget_s, "tasks": {}}
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / "session.log", "a", buffering=1)

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def save(self) -> None:
        self.report["elapsed_s"] = time.perf_counter() - self.t0
        write_json(self.out / "session.json", self.report)

    def note(self, text: str) -> None:
        line = f"[{time.perf_counter() - self.t0:6.1f} s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def run(self, task: Task, gpu_name: str | None) -> None:
        left = self.left_s()
        if left < MIN_TASK_S:
            self.report["tasks"][task.name] = {"status": "skipped", "reason": f"budget: {left:.0f} s left"}
            self.note(f"{task.name}: skipped ({left:.0f} s left)")
            return
        timeout = min(task.cap_s, left)
        self.note(f"{task.name}: start (cap {timeout:.0f} s)")
        t = time.perf_counter()
        try:
            kind = task.argv[0]
            runner = {"run": self._run_run, "script": self._run_script}.get(kind)
            result = runner(task, gpu_name, timeout) if runner else self._run_engine(task, timeout)
        except subprocess.TimeoutExpired:
            result = {"status": "timeout", "reason": f"killed after {timeout:.0f} s"}
        result["wall_s"] = time.perf_counter() - t
        self.report["tasks"][task.name] = result
        self.note(f"{task.name}: {result.get('status')} in {result['wall_s']:.0f} s")
        self.save()

    def _run_engine(self, task: Task, timeout: float) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="grpo-gpu-task-") as tmp:
            out = Path(tmp) / "result.json"
            cmd = [sys.executable, str(HERE / "engine_gpu.py"), *task.argv, "--json", str(out),
                   "--timeout-s", str(max(30.0, timeout - 10))]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            self.log.write(proc.stdout + proc.stderr)
            if not out.exists():
                return {"status": "failed", "exit_code": proc.returncode, "tail": (proc.stderr or "")[-1500:]}
            return {"status": "ok", "stdout": proc.stdout[-4000:], **json.loads(out.read_text())}

    def _run_script(self, task: Task, gpu_name: str | None, timeout: float) -> dict[str, Any]:
        """benchmarks/<script> ARGS OUT_DIR; every JSON file it writes there comes back in the result."""
        with tempfile.TemporaryDirectory(prefix="grpo-gpu-script-") as tmp:
            cmd = [sys.executable, str(HERE / task.argv[1]), *task.argv[2:], tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=HERE.parent)
            self.log.write(proc.stdout + proc.stderr)
            found = {p.name: json.loads(p.read_text()) for p in sorted(Path(tmp).glob("*.json"))}
            status = "ok" if proc.returncode == 0 and found else "failed"
            return {"status": status, "exit_code": proc.returncode, "files": found, "tail": proc.stderr[-1500:]}

    def _run_run(self, task: Task, gpu_name: str | None, timeout: float) -> dict[str, Any]:
        case = case_named(task.argv[1])
        with tempfile.TemporaryDirectory(prefix="grpo-gpu-case-") as tmp:
            plan = committed_plan(case, gpu_name)
            if plan is None:  # another GPU kind, or a plan this checkout cannot load: plan here (grpo-plan)
                plan = Path(tmp) / "plan.json"
                proc = _cli("plan_entry", plan_command(case, "local", plan)[1:], timeout_s=min(120, timeout))
                if not plan.exists():
                    return {"status": "failed", "reason": "grpo-plan --gpus local", "tail": proc.stderr[-1500:]}
            out = Path(tmp) / "case.json"
            cmd = [sys.executable, __file__, "--child-run", case.name, "--child-plan", str(plan), "--child-json",
                   str(out)]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            self.log.write(proc.stdout + proc.stderr)
            if not out.exists():
                return {"status": "failed", "exit_code": proc.returncode, "tail": (proc.stderr or "")[-1500:]}
            result = json.loads(out.read_text())
            result["plan_file"] = str(plan.relative_to(HERE.parent)) if plan.is_relative_to(HERE.parent) else "live"
            return {"status": "ok" if result.get("completed") else "failed", **result}


def environment() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    versions = {}
    for name in ("transformers", "trl", "pydantic"):
        try:
            versions[name] = __import__(name).__version__
        except Exception as exc:  # a missing package is a fact to record, not a reason to stop
            versions[name] = f"missing ({type(exc).__name__})"
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "device": props.name,
            "total_memory_bytes": props.total_memory, **versions}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.list:
        for t in TASKS:
            print(f"{t.name:32s} cap {t.cap_s:4.0f} s  {' '.join(t.argv)}")
        return 0
    if a.make_plans is not None:
        return make_plans(a.make_plans)
    if a.child_run is not None:
        run_case_here(case_named(a.child_run), a.child_plan, a.child_json)
        return 0
    if not cuda_available():
        print(f"gpu_session.py: {NO_GPU}")
        write_json(a.out / "session.json", {"status": "no_gpu", "message": NO_GPU})
        return 0
    gpu = local_gpu()
    session = Session(a.out, a.budget_s)
    session.report.update(environment=environment(), gpu=gpu.name if gpu else None)
    session.save()
    wanted = set(a.only.split(",")) if a.only else None
    for task in TASKS:
        if wanted is None or task.name in wanted:
            session.run(task, gpu.name if gpu else None)
    session.report["status"] = "done"
    session.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
