"""Our GRPO engine beside TRL's GRPOTrainer on one GPU: same model shape, settings and prompts, one table.

    python benchmarks/engine_gpu.py --shape 0.5b                  # ours and TRL, each in a process of its own
    python benchmarks/engine_gpu.py --shape 3b --json out.json
    python benchmarks/engine_gpu.py --shape 0.5b --decode-bench   # the hf rollout alone: eager, static, cuda_graph

Both sides: random weights of the real shape (Qwen2.5-0.5B or -3B from grpo_pilot/profiles/configs, no hub),
the character tokenizer, prompts of exactly prompt_len − 2 tokens (a random model never emits EOS, so every
completion runs to --max-new), prompts_per_step × n completions per step, temperature 1, top-p 1, no KL
(TRL beta 0), one optimizer step per step in micro-batches of --micro-batch sequences (TRL:
per_device_train_batch_size = micro, gradient_accumulation_steps = rows / micro, so it generates the step's
rows at once), fp32 master weights with bf16 compute (TRL bf16=True), AdamW lr 1e-6, gradient checkpointing
for 3B (both). Generation: ours the hf backend's decode loop (--decode, default auto = CUDA graphs), TRL
`model.generate`; no vLLM on either side.

Measured per system over the steps after --warmup (medians): step time, trained tokens/s (prompt + completion),
rollout time and generated tokens/s beside the HBM roofline of the same decode (bf16 weights + every row's
K/V read once per token: gpu_common.rollout_roofline_s, the GPU's catalog bandwidth), update time and MFU
(useful FLOPs 3 × forward per trained token, the planner's formula, over the catalog bf16 peak), peak
allocated and reserved bytes, and the device footprint (max of cudaMemGetInfo used, polled every 20 ms).
TRL's rollout is its `_generate` (tokenising, `generate`, decoding), its update the rest of the step.
Ours also runs one step under `torch.cuda.set_sync_debug_mode("warn")` and reports where the host waited.

--decode-bench times `HFRollout.generate` alone for each decode mode (greedy, 64 rows) and checks that
static and cuda_graph give the same tokens (the same bf16 arithmetic, replayed) and how far eager (fp32
weights under autocast) agrees with them.

Without CUDA: prints the no-GPU line and exits 0; with --json it writes {"status": "no_gpu"}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", message="TRL currently supports vLLM")

from gpu_common import (  # noqa: E402
    NO_GPU,
    DevicePoller,
    cuda_available,
    local_gpu,
    rollout_roofline_s,
    update_flops,
    write_json,
    write_prompts,
)

SHAPES = {"0.5b": ("qwen2.5-0.5b", False), "3b": ("qwen2.5-3b", True)}  # alias, gradient checkpointing
GIB = 1 << 30


def model_of(a: argparse.Namespace) -> tuple[str, bool]:
    """(model source, gradient checkpointing) of the run: --shape's, or --model's (tests) without checkpointing."""
    return (a.model, False) if a.model else SHAPES[a.shape]


def _sync(a: argparse.Namespace) -> None:
    if a.device == "cuda":
        import torch

        torch.cuda.synchronize()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--systems", default="ours,trl", help="comma-separated: ours, trl")
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--n", type=int, default=4, help="completions per prompt")
    p.add_argument("--prompt-len", type=int, default=64, help="prompts hold prompt_len - 2 tokens")
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=16, help="sequences per update micro-batch (both sides)")
    p.add_argument("--steps", type=int, default=2, help="measured steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--decode", default="auto", help="ours: hf_decode (auto | eager | static | cuda_graph)")
    p.add_argument("--decode-bench", action="store_true", help="time the hf rollout's decode modes alone")
    p.add_argument("--timeout-s", type=float, default=900.0, help="per system process")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--worker", choices=("ours", "trl", "decode"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-json", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)  # cpu: smoke tests
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)  # another model source than --shape's (tests)
    a = p.parse_args(argv)
    rows = a.prompts_per_step * a.n
    if a.prompt_len < 3 or a.max_new < 1 or a.steps < 1 or a.warmup < 0 or rows % a.micro_batch:
        p.error(f"need prompt_len >= 3, max_new >= 1, steps >= 1 and micro_batch dividing {rows} rows")
    return a


# -- the workers (each in its own process) ------------------------------------------------------------


def _plan(a: argparse.Namespace, gpu: Any) -> Any:
    """Our plan: the shape on 1 GPU of this kind, hf rollout, one mini-batch, no KL, the same micro-batches."""
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner import PlanInputs, evaluate, model_ref
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.profiles.catalog import resolve_model

    alias, ckpt = model_of(a)
    workload = Workload(
        prompts_per_step=a.prompts_per_step,
        mini_batch_prompts=a.prompts_per_step,
        n=a.n,
        prompt_len_tokens=a.prompt_len,
        response_len_tokens=a.max_new,
        use_kl_loss=False,
    )
    knobs = Knobs(rollout_backend="hf", rollout_tp=1, micro_batch_size_per_gpu=a.micro_batch,
                  gradient_checkpointing=ckpt, fused_logprob=False)  # fmt: skip
    cluster = parse_cluster("1xcpu" if a.device == "cpu" else f"1x{gpu.name if gpu is not None else 'H100-80G'}")
    return evaluate(PlanInputs(model=model_ref(resolve_model(alias)), cluster=cluster, workload=workload), knobs)


def _peaks(phases: dict[str, Any]) -> dict[str, int]:
    def top(key: str) -> int:
        return max((getattr(s, key) or 0) for s in phases.values())

    return {"allocated": top("peak_bytes"), "reserved": top("reserved_peak_bytes"), "device": top("device_peak_bytes")}


def _sync_warnings(run_step: Any) -> dict[str, Any]:
    """One step under torch.cuda.set_sync_debug_mode("warn"): where the host waited for the device."""
    import torch

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    return {"total": sum(sites.values()), "by_site": dict(sites.most_common(20))}


def run_ours(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from grpo_pilot.engine.assemble import build_engine
    from grpo_pilot.engine.loop import grpo_step
    from grpo_pilot.engine.run_config import RunConfig

    rows = a.prompts_per_step * a.n
    steps: list[dict[str, Any]] = []
    peaks: list[dict[str, int]] = []
    with tempfile.TemporaryDirectory(prefix="grpo-gpu-") as tmp:
        prompts = write_prompts(Path(tmp) / "prompts.jsonl", count=a.prompts_per_step * (a.warmup + a.steps + 2),
                                length=a.prompt_len - 2)  # fmt: skip
        cfg = RunConfig(dataset=str(prompts), reward="char_fraction:char=a", steps=a.warmup + a.steps + 1, lr=1e-6,
                        output_dir=str(Path(tmp) / "run"), device=a.device, max_new_tokens=a.max_new, seed=0,
                        checkpoint=False, hf_decode=a.decode)  # fmt: skip
        t0 = time.perf_counter()
        eng = build_engine(_plan(a, local_gpu() if a.device == "cuda" else None), cfg)
        build_s = time.perf_counter() - t0
        try:
            with DevicePoller(enabled=a.device == "cuda") as poller:
                for step in range(1, a.warmup + a.steps + 1):
                    if step == a.warmup + 1:
                        poller.reset_peaks()
                    r = grpo_step(eng, step)
                    if step > a.warmup:
                        steps.append({
                            "step_s": r.wall_s, "rollout_s": r.phases["rollout"].wall_s,
                            "update_s": r.phases["update"].wall_s, "trained_tokens": r.trained_tokens,
                            "generated_tokens": (r.record["response_len_mean"] or 0.0) * rows,
                        })  # fmt: skip
                        peaks.append(_peaks(r.phases))
            last = a.warmup + a.steps + 1
            syncs = _sync_warnings(lambda: grpo_step(eng, last)) if a.device == "cuda" else None
        finally:
            eng.group.close()
    return {
        "system": "ours",
        "decode": a.decode,
        "build_s": build_s,
        "steps": steps,
        "peak_allocated_bytes": max(p["allocated"] for p in peaks),
        "peak_reserved_bytes": max(p["reserved"] for p in peaks),
        "phase_device_peak_bytes": max(p["device"] for p in peaks),
        "poller": poller.result(),
        "sync_debug_step": syncs,
        "torch": torch.__version__,
    }


def run_trl(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from grpo_pilot.engine.model_factory import _config_dict, build_char_tokenizer

    alias, ckpt = model_of(a)
    rows = a.prompts_per_step * a.n
    cuda = a.device == "cuda"
    clock: dict[str, list[float]] = {"step": [], "generate": []}
    pending: list[float] = []

    class StepClock(TrainerCallback):
        t0 = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            _sync(a)
            if state.global_step == a.warmup and cuda:  # the first measured step: peaks from here
                torch.cuda.reset_peak_memory_stats()
                poller.reset_peaks()
            pending.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            _sync(a)
            clock["step"].append(time.perf_counter() - self.t0)
            clock["generate"].append(sum(pending))

    cfg_dict, _ = _config_dict(alias)
    cfg_dict = {k: v for k, v in cfg_dict.items() if k not in ("architectures", "torch_dtype")}
    config = AutoConfig.for_model(cfg_dict.pop("model_type"), **cfg_dict)
    torch.manual_seed(0)
    with torch.device(a.device):  # initialised where it trains (a 3B model's init on the host takes long)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with tempfile.TemporaryDirectory(prefix="grpo-gpu-trl-") as tmp:
        prompts = write_prompts(Path(tmp) / "prompts.jsonl", count=a.prompts_per_step * (a.warmup + a.steps + 2),
                                length=a.prompt_len - 2)  # fmt: skip
        texts = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
        trainer = GRPOTrainer(model=model, reward_funcs=_a_fraction, args=_trl_config(a, Path(tmp) / "out", ckpt),
                              train_dataset=Dataset.from_dict({"prompt": texts}),
                              processing_class=build_char_tokenizer(), callbacks=[StepClock()])  # fmt: skip
        trainer.remove_callback(PrinterCallback)
        generate = trainer._generate

        def timed_generate(*args_: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            out = generate(*args_, **kwargs)
            _sync(a)
            pending.append(time.perf_counter() - t)
            return out

        trainer._generate = timed_generate
        with DevicePoller(enabled=cuda) as poller:
            trainer.train()
    seen = [int(h["num_tokens"]) for h in trainer.state.log_history if "num_tokens" in h]
    per_step = [b - c for c, b in zip([0] + seen[:-1], seen)]
    lengths = [h.get("completions/mean_length") for h in trainer.state.log_history if "num_tokens" in h]
    steps = []
    for i in range(a.warmup, min(len(clock["step"]), len(per_step))):
        mean_len = lengths[i] if i < len(lengths) and lengths[i] is not None else a.max_new
        steps.append({"step_s": clock["step"][i], "rollout_s": clock["generate"][i],
                      "update_s": clock["step"][i] - clock["generate"][i], "trained_tokens": per_step[i],
                      "generated_tokens": mean_len * rows})  # fmt: skip
    import trl

    return {
        "system": "trl",
        "trl": trl.__version__,
        "steps": steps,
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None,
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()) if cuda else None,
        "poller": poller.result(),
        "torch": torch.__version__,
    }


def _trl_config(a: argparse.Namespace, out: Path, ckpt: bool) -> Any:
    """TRL's settings for the same step as ours (module docstring)."""
    from trl import GRPOConfig

    cuda = a.device == "cuda"
    return GRPOConfig(
        output_dir=str(out), bf16=cuda, use_cpu=not cuda, use_vllm=False, report_to=[], save_strategy="no",
        logging_steps=1, max_steps=a.warmup + a.steps, learning_rate=1e-6, beta=0.0, num_generations=a.n,
        per_device_train_batch_size=a.micro_batch,
        gradient_accumulation_steps=a.prompts_per_step * a.n // a.micro_batch,
        max_completion_length=a.max_new, temperature=1.0, top_p=1.0, seed=0, dataloader_num_workers=0,
        disable_tqdm=True, gradient_checkpointing=ckpt,
    )  # fmt: skip


def _a_fraction(completions: list[Any], **_: Any) -> list[float]:
    """TRL reward function: the fraction of 'a' characters (our `char_fraction:char=a`)."""
    return [c.count("a") / max(1, len(c)) for c in completions]


def run_decode_bench(a: argparse.Namespace) -> dict[str, Any]:
    """`HFRollout.generate` alone per decode mode: ms per decode step, peak memory, token agreement."""
    import torch

    from grpo_pilot.engine.model_factory import build_model, build_tokenizer
    from grpo_pilot.engine.rollout import SamplingConfig
    from grpo_pilot.engine.rollout.hf import HFRollout

    alias, _ = model_of(a)
    tok = build_tokenizer(alias)
    device = torch.device(a.device)
    model = build_model(alias, seed=0).to(device).eval()
    prompts = [tok.encode(f"{i:02d}" + "ab" * a.prompt_len)[: a.prompt_len - 2] for i in range(a.prompts_per_step)]
    prompts = [p for p in prompts for _ in range(a.n)]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=a.max_new)
    out: dict[str, Any] = {"rows": len(prompts), "new_tokens": a.max_new, "modes": {}}
    tokens: dict[str, list[tuple[int, ...]]] = {}
    for mode in ("eager", "static", "cuda_graph"):
        backend = HFRollout(model, tok, max_model_len=a.prompt_len + a.max_new, max_num_seqs=len(prompts),
                            decode=mode)  # fmt: skip
        backend.wake()
        backend.generate(prompts, sampling.model_copy(update={"max_new_tokens": 8}))  # warm-up
        _sync(a)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        gens = backend.generate(prompts, sampling)
        _sync(a)
        wall = time.perf_counter() - t
        backend.sleep()
        tokens[mode] = [g.token_ids for g in gens]
        peak = int(torch.cuda.max_memory_allocated()) if device.type == "cuda" else None
        out["modes"][mode] = {"wall_s": wall, "ms_per_step": 1000 * wall / a.max_new, "peak_allocated_bytes": peak,
                              "weight_copy_bytes": backend.weight_copy_bytes(device),
                              **backend.decode_stats}  # fmt: skip

    def agree(x: list[tuple[int, ...]], y: list[tuple[int, ...]]) -> float:
        same = sum(next((i for i, (s, t) in enumerate(zip(r, q)) if s != t), min(len(r), len(q))) for r, q in zip(x, y))
        return same / max(1, sum(len(r) for r in x))

    out["static_equals_cuda_graph"] = tokens["static"] == tokens["cuda_graph"]
    out["eager_prefix_agreement"] = agree(tokens["eager"], tokens["cuda_graph"])
    return out


# -- the parent: processes, table, JSON ---------------------------------------------------------------


def summarise(result: dict[str, Any], a: argparse.Namespace, gpu: Any) -> dict[str, Any]:
    """Medians of the measured steps and the derived figures (module docstring)."""
    from grpo_pilot.profiles.catalog import resolve_model

    steps = result.get("steps") or []
    if not steps:
        return {"system": result.get("system"), "error": result.get("error", "no measured step")}
    spec = resolve_model(model_of(a)[0]).spec
    med = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
    rows = a.prompts_per_step * a.n
    prompt_tokens = a.prompt_len - 2
    row: dict[str, Any] = {
        "system": result["system"],
        "step_s": med["step_s"],
        "steps_per_s": 1.0 / med["step_s"],
        "tokens_per_s": statistics.median(s["trained_tokens"] / s["step_s"] for s in steps),
        "rollout_s": med["rollout_s"],
        "rollout_tokens_per_s": med["generated_tokens"] / med["rollout_s"] if med["rollout_s"] else None,
        "update_s": med["update_s"],
        "peak_allocated_bytes": result.get("peak_allocated_bytes"),
        "peak_reserved_bytes": result.get("peak_reserved_bytes"),
        "device_peak_bytes": (result.get("poller") or {}).get("device_used_peak_bytes"),
    }
    if gpu is not None:
        roof = rollout_roofline_s(spec, rows=rows, prompt_tokens=prompt_tokens, new_tokens=a.max_new,
                                  hbm_bytes_per_s=gpu.hbm_bytes_per_s)  # fmt: skip
        flops = update_flops(spec, trained_tokens=med["trained_tokens"], seq_tokens=prompt_tokens + a.max_new)
        row.update(
            roofline_rollout_tokens_per_s=rows * a.max_new / roof,
            rollout_roofline_frac=roof / med["rollout_s"] if med["rollout_s"] else None,
            update_mfu=flops / (med["update_s"] * gpu.bf16_flops) if med["update_s"] > 0 else None,
        )
    return row


def format_table(rows: list[dict[str, Any]]) -> str:
    ref = next((r for r in rows if r.get("system") == "trl" and "steps_per_s" in r), None)
    head = (f"{'system':7s} {'step s':>7s} {'steps/s':>7s} {'tok/s':>7s} {'rollout s':>9s} {'gen tok/s':>9s} "
            f"{'roofline':>9s} {'of roof':>7s} {'update s':>8s} {'MFU':>6s} {'alloc GiB':>9s} {'resv GiB':>8s} "
            f"{'dev GiB':>7s} {'vs TRL':>7s}")  # fmt: skip
    lines = [head]

    def g(value: Any, fmt: str) -> str:
        width = int(fmt.split(".")[0])
        return format(value, fmt) if isinstance(value, (int, float)) else "—".rjust(width)

    for r in rows:
        if "error" in r:
            lines.append(f"{r['system']!s:7s} failed: {r['error']}")
            continue
        vs = r["steps_per_s"] / ref["steps_per_s"] if ref else None
        lines.append(
            f"{r['system']:7s} {r['step_s']:7.2f} {r['steps_per_s']:7.3f} {r['tokens_per_s']:7.0f} "
            f"{r['rollout_s']:9.2f} {g(r['rollout_tokens_per_s'], '9.0f')} "
            f"{g(r.get('roofline_rollout_tokens_per_s'), '9.0f')} {g(r.get('rollout_roofline_frac'), '7.1%')} "
            f"{r['update_s']:8.2f} {g(r.get('update_mfu'), '6.1%')} "
            f"{g((r['peak_allocated_bytes'] or 0) / GIB, '9.2f')} "
            f"{g((r['peak_reserved_bytes'] or 0) / GIB, '8.2f')} {g((r['device_peak_bytes'] or 0) / GIB, '7.2f')} "
            f"{g(vs, '6.2f')}x"
        )
    return "\n".join(lines)


def _spawn(worker: str, a: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Run one worker in a fresh process (clean CUDA context and peaks); its JSON, or the error."""
    with tempfile.TemporaryDirectory(prefix="grpo-gpu-w-") as tmp:
        out = Path(tmp) / "worker.json"
        cmd = [sys.executable, __file__, *argv, "--worker", worker, "--worker-json", str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s)
        except subprocess.TimeoutExpired:
            return {"system": worker, "error": f"timed out after {a.timeout_s:g} s"}
        if proc.returncode != 0 or not out.exists():
            tail = " ".join((proc.stderr or proc.stdout or "").strip().splitlines()[-6:])[-900:]
            return {"system": worker, "error": f"exit {proc.returncode}: {tail}"}
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    if a.device == "cuda" and not cuda_available():
        print(f"engine_gpu.py: {NO_GPU}")
        if a.json is not None:
            write_json(a.json, {"status": "no_gpu", "message": NO_GPU})
        return 0
    if a.worker is not None:
        run = {"ours": run_ours, "trl": run_trl, "decode": run_decode_bench}[a.worker]
        write_json(a.worker_json, run(a))
        return 0
    gpu = local_gpu() if a.device == "cuda" else None
    started = time.perf_counter()
    if a.decode_bench:
        result = _spawn("decode", a, argv)
        print(json.dumps(result, indent=1))
        report: dict[str, Any] = {"status": "ok", "kind": "decode_bench", "shape": a.shape, "result": result}
    else:
        raw = [_spawn(system, a, argv) for system in a.systems.split(",")]
        rows = [summarise(r, a, gpu) if "error" not in r else r for r in raw]
        print(
            f"{model_of(a)[0]}, {a.prompts_per_step} prompts x n={a.n}, prompt {a.prompt_len - 2} + "
            f"{a.max_new} new tokens, micro-batch {a.micro_batch}, on {gpu.name if gpu else 'an unknown GPU'}"
        )
        print(format_table(rows))
        report = {"status": "ok", "kind": "engine_gpu", "shape": a.shape, "args": vars(a), "rows": rows, "raw": raw}
    report.update(gpu=gpu.name if gpu else None, wall_s=time.perf_counter() - started)
    if a.json is not None:
        write_json(a.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
