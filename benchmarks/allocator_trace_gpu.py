"""The real allocation sequence of the engine's actor on a GPU, replayed by the allocator simulator.

    python benchmarks/allocator_trace_gpu.py tests/planner/gpu_measurements/h200-2026-11-26.json OUT_DIR \\
        [--case qwen2.5-1.5b-kl-2minibatch] [--steps 2] [--adamw foreach|fused]

Why: the 1.5B H200 run reserved 53.8 GiB where the simulator, over the allocations recorded on fake tensors
(benchmarks/allocator_replay.py, allocator_replay_34e4d2d.py), gives 48.5 GiB at the same allocated peak
(docs/validation.md "Device footprint"). On a CUDA device this runs the actor's steps of a measured case as
allocator_replay.py records them (the actor built as a training worker builds it; per step the cache emptied
where the measured runs emptied it, after the rollout, which is skipped; the old-policy and reference passes; one
update per mini-batch) on real tensors with random weights, under `torch.cuda.memory._record_memory_history`
(torch/cuda/memory.py; the trace's `alloc` / `free_completed` / `segment_free` entries). It writes
OUT_DIR/trace-<case>.json: the real peaks (`max_memory_allocated`, `max_memory_reserved`, per phase) beside the
simulator's replay of the real sequence (`events_from_trace`), and OUT_DIR/<case>.events.json.gz, the sequence in
the simulator's event format for comparison with the fake-tensor recording. Real reserve = the run's 53.8 GiB:
the actor's own CUDA sequence holds the mechanism; replay = real: the simulator is right and the fake
recording's sequence differs (compare the two event files); replay < real: a rule the simulator lacks.
`--adamw foreach` (default) is the 34e4d2d engine's optimizer kernel on CUDA, `fused` today's.

No GPU: says so and exits 0.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from allocator_replay import KL_COEF

from grpo_pilot.tuner.measured_runs import _flags, load_measurements, measured_inputs
from grpo_pilot.verify.allocator_sim import replay

GiB = 1 << 30
MAX_TRACE_ENTRIES = 4_000_000  # ~320k allocations and frees per two 1.5B steps, with room


def events_from_trace(trace: list[dict[str, Any]]) -> list[tuple]:
    """The simulator's events from a device trace of `torch.cuda.memory._snapshot()`: `alloc` -> ("a", id,
    size; the requested size where the trace has one), `free_completed` -> ("f", id), each run of
    `segment_free` (a cache release) -> ("e",); the rest (`free_requested`, `segment_alloc`, ...) follows from
    these. An address freed and handed out again gets a new id."""
    events: list[tuple] = []
    ids: dict[int, int] = {}
    fresh = itertools.count(1)
    releasing = False
    for entry in trace:
        action = entry["action"]
        if action == "alloc":
            ids[entry["addr"]] = next(fresh)
            events.append(("a", ids[entry["addr"]], int(entry.get("requested_size", entry["size"]))))
        elif action == "free_completed" and entry["addr"] in ids:
            events.append(("f", ids.pop(entry["addr"])))
        if action == "segment_free" and not releasing:
            events.append(("e",))
        releasing = action == "segment_free"
    return events


def _phase_peaks(torch: Any, peaks: dict[str, list[int]], phase: str) -> None:
    got = [int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())]
    old = peaks.get(phase, [0, 0])
    peaks[phase] = [max(old[0], got[0]), max(old[1], got[1])]
    torch.cuda.reset_peak_memory_stats()


def run_steps(case: dict[str, Any], *, steps: int, adamw: str) -> dict[str, Any]:
    """The actor's steps of `case` on the current CUDA device, traced (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_pilot.engine.actor import Actor, LossSettings
    from grpo_pilot.engine.settings import ActorSettings
    from grpo_pilot.profiles import resolve_model
    from grpo_pilot.verify.fake_trace import hf_config_from_spec
    from grpo_pilot.verify.traced import _samples

    inputs, knobs = measured_inputs(case)
    w, spec = inputs.workload, resolve_model(str(_flags(case["plan_command"])["model"])).spec
    settings = ActorSettings.from_knobs(knobs, with_ref=w.use_kl_loss)
    config = hf_config_from_spec(spec)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    count, size = w.prompts_per_step * w.n, w.mini_batch_prompts * w.n
    minis = [list(range(i, min(i + size, count))) for i in range(0, count, size)]
    loss = LossSettings(kl_coef=KL_COEF if w.use_kl_loss else 0.0)
    torch.cuda.memory._record_memory_history(
        enabled="all", context=None, stacks="python", max_entries=MAX_TRACE_ENTRIES
    )
    actor = Actor(model, device=torch.device("cuda", torch.cuda.current_device()), settings=settings, world_size=1)
    if adamw == "foreach":  # the 34e4d2d engine's kernel on CUDA (today's engine runs the fused one)
        actor.optimizer = torch.optim.AdamW(
            actor.trainable_parameters(),
            lr=settings.lr,
            betas=(settings.adam_beta1, settings.adam_beta2),
            weight_decay=settings.weight_decay,
            foreach=True,
        )
    peaks: dict[str, list[int]] = {}
    for step in range(steps):
        samples = _samples(count=count, prompt_len=w.prompt_len_tokens - 2, response_len=w.response_len_tokens,
                           vocab=spec.vocab_size, offset=step * count, group=w.n)  # fmt: skip
        torch.cuda.empty_cache()  # the measured runs' one release per step, after the (skipped) rollout
        _phase_peaks(torch, peaks, "before_log_prob")
        old = actor.log_probs(samples) if len(minis) * w.ppo_epochs > 1 else None
        ref = actor.log_probs(samples, ref=True) if w.use_kl_loss else None
        _phase_peaks(torch, peaks, "log_prob")
        advantages = torch.ones(count)
        for mb in minis:
            actor.update([samples[i] for i in mb], advantages[mb], loss,
                         old_logprobs=[old[i] for i in mb] if old is not None else None,
                         ref_logprobs=[ref[i] for i in mb] if ref is not None else None)  # fmt: skip
        del old, ref, advantages, samples
        _phase_peaks(torch, peaks, "update")
    trace = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    torch.cuda.memory._record_memory_history(enabled=None)
    return {"trace": trace, "peaks": peaks}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measurements")
    parser.add_argument("out_dir")
    parser.add_argument("--case", default="qwen2.5-1.5b-kl-2minibatch")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--adamw", choices=("foreach", "fused"), default="foreach")
    a = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no GPU: nothing traced")
        return 0
    case = next(c for c in load_measurements(a.measurements)["cases"] if c["name"] == a.case)
    got = run_steps(case, steps=a.steps, adamw=a.adamw)
    events = events_from_trace(got["trace"])
    r = replay(events)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / f"{a.case}.events.json.gz", "wt") as handle:
        json.dump(events, handle)
    result = {
        "case": a.case,
        "adamw": a.adamw,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "trace_entries": len(got["trace"]),
        "real_gib": {k: [round(v[0] / GiB, 4), round(v[1] / GiB, 3)] for k, v in got["peaks"].items()},
        "replay_of_real_gib": [round(r.peak_allocated_bytes / GiB, 4), round(r.peak_reserved_bytes / GiB, 3)],
        "measured_gib": {"update_allocated": round(case["phases"]["update"]["measured_peak_bytes"] / GiB, 4),
                         "reserved_peak": round(case["reserved_peak_bytes"] / GiB, 3)},
    }  # fmt: skip
    (out / f"trace-{a.case}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
