"""Traced (fake-tensor FSDP2) vs analytic update-phase memory for full-size models, one command.

    .venv/bin/python benchmarks/traced_vs_analytic.py            # 5 shapes, a few minutes on 2 CPU cores
    .venv/bin/python benchmarks/traced_vs_analytic.py --quick    # Qwen2.5-0.5B only

Each case traces rank 0 of an 8-GPU FSDP2 run (bf16 compute, fp32 master/grads/Adam, foreach AdamW,
two micro-batches per optimizer step) with the micro-batch our engine builds for the plan (rows of full
sequences, no mask, logits at the response positions, the entropy metric), and prints, per memory row, the analytic
bytes (`estimate_memory(...).phases["update"]`, target grpo-pilot) beside the traced bytes at the traced
peak. Items the trace cannot see (reference shard, vLLM leftovers, CUDA context / NCCL / fragmentation
overheads) are listed separately.
"""

from __future__ import annotations

import argparse
import sys
import time

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.verify.compare import TracedComparison, compare_with_analytic
from grpo_pilot.profiles.catalog import resolve_model

GiB = 1 << 30

# (model, cluster, micro-batch sequences, prompt tokens, response tokens, gradient checkpointing, token budget)
CASES: list[tuple[str, str, int, int, int, bool, int | None]] = [
    ("qwen2.5-0.5b", "8xH100", 4, 256, 768, True, None),  # 4096 tokens per micro-batch
    ("qwen2.5-1.5b", "8xH100", 4, 512, 1536, True, None),  # 8192
    ("qwen2.5-1.5b", "8xH100", 4, 512, 1536, False, None),  # 8192, no checkpointing
    ("qwen2.5-7b", "8xH100", 4, 1024, 3072, True, None),  # 16384
    ("qwen2.5-7b", "8xH100", 4, 1024, 3072, True, 12288),  # dynamic batching, 12288-token budget
]


def run_case(
    model: str, cluster_text: str, micro: int, prompt: int, response: int, ckpt: bool, budget: int | None
) -> TracedComparison:
    spec = resolve_model(model).spec
    workload = Workload(
        prompts_per_step=256, mini_batch_prompts=64, n=8, prompt_len_tokens=prompt, response_len_tokens=response
    )
    knobs = Knobs(micro_batch_size_per_gpu=micro, gradient_checkpointing=ckpt, max_token_len_per_gpu=budget)
    return compare_with_analytic(spec, parse_cluster(cluster_text), workload, knobs)


def print_case(c: TracedComparison, ckpt: bool, budget: int | None) -> None:
    shape = f"{c.traced.micro_batch_seqs}x{c.traced.seq_len_tokens} " + (
        "packed in one row" if c.traced.packed else "rows"
    )
    batching = f"dynamic {budget}: {shape}" if budget else shape
    print(
        f"\n{c.model_name} on {c.cluster_label}  micro-batch {batching} ({c.tokens_per_micro_batch} tokens)  "
        f"checkpointing {'on' if ckpt else 'off'}  traced in {c.traced.trace_s:.1f} s  (peak at {c.traced.peak_at})"
    )
    print(f"  {'row':34s} {'analytic GiB':>13s} {'traced GiB':>11s} {'diff GiB':>9s}")
    for r in c.rows:
        diff = (r.analytic_bytes - r.traced_bytes) / GiB
        print(f"  {r.row:34s} {r.analytic_bytes / GiB:13.3f} {r.traced_bytes / GiB:11.3f} {diff:9.3f}")
    print(
        f"  {'total (tensors)':34s} {c.analytic_traceable_bytes / GiB:13.3f} {c.traced_peak_bytes / GiB:11.3f} "
        f"{(c.analytic_traceable_bytes - c.traced_peak_bytes) / GiB:9.3f}   "
        f"analytic/traced − 1 = {c.relative_error:+.1%}"
    )
    print(
        f"  {'not traced (analytic only)':34s} {sum(c.not_traced.values()) / GiB:13.3f}   "
        + ", ".join(f"{k} {v / GiB:.2f}" for k, v in c.not_traced.items() if v)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the Qwen2.5-0.5B case")
    args = parser.parse_args(argv)
    cases = CASES[:1] if args.quick else CASES
    started = time.perf_counter()
    summary = []
    for model, cluster, micro, prompt, response, ckpt, budget in cases:
        comp = run_case(model, cluster, micro, prompt, response, ckpt, budget)
        print_case(comp, ckpt, budget)
        summary.append((comp, ckpt))
        sys.stdout.flush()
    print(
        f"\n{'model':16s} {'tokens':>7s} {'ckpt':>5s} {'analytic GiB':>13s} {'traced GiB':>11s} "
        f"{'rel. error':>10s} {'trace s':>8s}"
    )
    for comp, ckpt in summary:
        print(
            f"{comp.model_name:16s} {comp.tokens_per_micro_batch:7d} {'on' if ckpt else 'off':>5s} "
            f"{comp.analytic_traceable_bytes / GiB:13.2f} "
            f"{comp.traced_peak_bytes / GiB:11.2f} {comp.relative_error:+10.1%} {comp.traced.trace_s:8.1f}"
        )
    print(f"total wall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
