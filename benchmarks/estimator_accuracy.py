"""Estimator accuracy: the analytic memory model vs the traced method (the engine's own actor on fake
tensors), per item and overall, for the update and log-prob phases of full-size catalog models.

    .venv/bin/python benchmarks/estimator_accuracy.py            # 7 cases, 0.5B-32B (~4 min on a quiet 2-core box)
    .venv/bin/python benchmarks/estimator_accuracy.py --quick    # 3 cases, 0.5B and 7B (~1.5 min)
    .venv/bin/python benchmarks/estimator_accuracy.py --all      # 9 cases: adds Llama-3.1-8B and Qwen2.5-14B
    .venv/bin/python benchmarks/estimator_accuracy.py --items    # also every case's per-item table

Each case is what `grpo-plan --verify` runs for a plan with these knobs (verify/compare.py): rank 0 of
the trainer GPUs (FSDP2 shard degree D), CUDA numerics (bf16 compute, fp32 master / grads / Adam,
foreach AdamW), full-length sequences; the analytic side is `estimate_memory(...)` for the same worst
case (every sequence at its maximum), target grpo-pilot. Items the trace cannot see (CUDA context,
cuBLAS, NCCL, fragmentation, vLLM leftovers) are left out on both sides.

Target (issue 9): the update phase's tensor bytes within 5 %, never under by more than 2 %.
"""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.table import Table

from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.profiles.catalog import resolve_model
from grpo_pilot.units import GiB

MAX_OVER, MAX_UNDER = 0.05, -0.02
# (model, cluster, prompt tokens, response tokens, micro-batch sequences or None, token budget or None,
#  gradient checkpointing, fused log-probs)
Case = tuple[str, str, int, int, "int | None", "int | None", bool, bool]
QUICK: list[Case] = [
    ("qwen2.5-0.5b", "8xH100", 1024, 3072, 4, None, True, False),  # 16k tokens per micro-batch
    ("qwen2.5-7b", "8xH100", 1024, 3072, 4, None, True, False),  # 16k, checkpointing
    ("qwen2.5-7b", "8xH100", 512, 1024, 4, None, False, True),  # grpo-plan's 7B plan: 6k, no ckpt, fused
]
DEFAULT: list[Case] = QUICK + [
    ("qwen2.5-1.5b", "8xH100", 512, 1536, 4, None, False, False),  # 8k, no checkpointing, plain logits
    ("qwen2.5-3b", "4xH100", 1024, 2048, None, 12288, True, True),  # dynamic batching, 12k budget
    ("qwen3-8b", "8xH100", 1024, 3072, 4, None, True, True),  # qk-norm family, 16k
    ("qwen2.5-32b", "2x8xH100", 1024, 3072, 1, None, True, False),  # 4k on 16 ranks
]
ALL: list[Case] = DEFAULT + [
    ("llama-3.1-8b", "8xH100", 512, 1536, 2, None, False, False),  # 4k, 128k vocabulary
    ("qwen2.5-14b", "8xH100", 1024, 3072, 2, None, True, True),  # 8k
]


def run_case(case: Case):
    from grpo_pilot.verify.compare import compare_with_analytic

    model, cluster, prompt, response, micro, budget, ckpt, fused = case
    workload = Workload(
        prompts_per_step=256, mini_batch_prompts=64, n=8, prompt_len_tokens=prompt, response_len_tokens=response
    )
    knobs = Knobs(
        micro_batch_size_per_gpu=micro or 4,
        max_token_len_per_gpu=budget,
        log_prob_max_token_len_per_gpu=2 * (prompt + response),
        gradient_checkpointing=ckpt,
        fused_logprob=fused,
        ref_param_offload=False,
    )
    return compare_with_analytic(resolve_model(model).spec, parse_cluster(cluster), workload, knobs)


def _err(value: float | None) -> str:
    if value is None:
        return "traced 0"
    colour = "green" if MAX_UNDER <= value <= MAX_OVER else "red"
    return f"[{colour}]{value:+.1%}[/{colour}]"


def _items_table(report) -> Table:
    table = Table(title=f"{report.model_name}: update items", title_justify="left")
    for name in ("item", "analytic GiB", "traced GiB", "rel. error"):
        table.add_column(name, justify="left" if name == "item" else "right")
    check = report.update
    for row, traced in check.traced.items.items():
        analytic = check.analytic.items[row]
        if traced or analytic:
            table.add_row(row, f"{analytic / GiB:.3f}", f"{traced / GiB:.3f}", _err(check.relative_error[row]))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 cases (0.5B and 7B) instead of 7")
    parser.add_argument("--all", action="store_true", help="9 cases: adds Llama-3.1-8B and Qwen2.5-14B")
    parser.add_argument("--items", action="store_true", help="print every case's per-item update table")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    console = Console(width=170)
    cases = QUICK if args.quick else (ALL if args.all else DEFAULT)
    started = time.perf_counter()
    summary = Table(title="analytic vs traced, tensors on rank 0 (rel. error = analytic / traced − 1)")
    for name in (
        "model",
        "D",
        "tokens/mb",
        "ckpt",
        "log-probs",
        "update an. GiB",
        "traced GiB",
        "error",
        "act+logits err",
        "log_prob an. GiB",
        "traced GiB",
        "error",
        "trace s",
    ):
        summary.add_column(name, justify="left" if name in ("model", "log-probs") else "right")
    misses = []
    with console.status("tracing...") as status:
        for i, case in enumerate(cases, 1):
            status.update(f"tracing {case[0]} ({i}/{len(cases)})")
            rep = run_case(case)
            up, lp = rep.update, rep.log_prob
            acts = up.relative_error["activations, logits, temporaries"]
            summary.add_row(
                rep.model_name,
                str(rep.world_size),
                f"{rep.trace.update_tokens_per_micro_batch:,}",
                "on" if case[6] else "off",
                "fused" if case[7] else "plain",
                f"{up.analytic.total_bytes / GiB:.2f}",
                f"{up.traced.total_bytes / GiB:.2f}",
                _err(up.total_error),
                _err(acts),
                f"{lp.analytic.total_bytes / GiB:.2f}" if lp else "-",
                f"{lp.traced.total_bytes / GiB:.2f}" if lp else "-",
                _err(lp.total_error) if lp else "-",
                f"{rep.trace.trace_s:.0f}",
            )
            if not MAX_UNDER <= up.total_error <= MAX_OVER:
                misses.append(f"{rep.model_name} ({case[1]}, ckpt {case[6]}, fused {case[7]}): {up.total_error:+.1%}")
            if args.items:
                console.print(_items_table(rep))
            sys.stdout.flush()
    console.print(summary)
    console.print(f"wall time {time.perf_counter() - started:.0f} s")
    target = f"update within {MAX_OVER:.0%} over and {-MAX_UNDER:.0%} under"
    if misses:
        console.print(f"FAIL ({target}): " + "; ".join(misses))
        return 1
    console.print(f"PASS ({target}) on all {len(cases)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
