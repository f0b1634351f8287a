"""`grpo-plan --verify`: trace the plan's update and log-prob phases and print them beside the estimate.

The trace (grpo_pilot/verify) needs the `engine` extra (torch, transformers); `require_engine()` says so
before any work is done. The report is printed as rich tables (`render_verify`) or added to the plan JSON
under "verify" (`plan_json_with_verify`); plan.json files written with --out never carry it.
"""

from __future__ import annotations

import json
from importlib.util import find_spec
from typing import Any

from rich.console import Console
from rich.table import Table

from grpo_pilot.errors import InputError
from grpo_pilot.units import GiB, MiB

ENGINE_MODULES = ("torch", "transformers")


def require_engine() -> None:
    """InputError (exit 2) when the engine extra is not installed."""
    missing = [name for name in ENGINE_MODULES if find_spec(name) is None]
    if missing:
        raise InputError(
            f"--verify traces the plan with the engine's own code, which needs {' and '.join(missing)} "
            "(not installed).",
            "Install torch first (pip install torch==2.13.0: the CPU wheel is enough), then the engine extra "
            "(pip install -c constraints.txt 'grpo-pilot[engine]'), or plan without --verify.",
        )


def verify(plan: Any, stderr: Console | None = None) -> Any:
    """Trace `plan` (a spinner on stderr while it runs); returns a `verify.compare.VerifyReport`."""
    require_engine()
    from grpo_pilot.verify.compare import verify_plan

    console = stderr or Console(stderr=True)
    with console.status(f"Tracing {plan.model.resolved} on fake tensors (update and log-prob passes)..."):
        return verify_plan(plan)


def plan_json_with_verify(plan_json: str, report: Any) -> str:
    """The plan's JSON with the report under "verify"."""
    data = json.loads(plan_json)
    data["verify"] = report.to_json_dict()
    return json.dumps(data, indent=2) + "\n"


def _error_text(error: float | None) -> str:
    if error is None:
        return "[red]analytic only[/red]"
    colour = "green" if -0.02 <= error <= 0.05 else ("red" if error < -0.02 else "yellow")
    return f"[{colour}]{error:+.1%}[/{colour}]"


def _phase_table(check: Any, title: str) -> Table:
    a, t = check.analytic.total_bytes, check.traced.total_bytes
    unit, size = ("GiB", GiB) if max(a, t) >= GiB else ("MiB", MiB)
    table = Table(title=title, title_justify="left")
    for name in ("item", f"analytic {unit}", f"traced {unit}", f"analytic − traced {unit}", "rel. error"):
        table.add_column(name, justify="left" if name == "item" else "right")
    for row, traced in check.traced.items.items():
        analytic = check.analytic.items[row]
        if traced == 0 and analytic == 0:
            continue
        error = check.relative_error[row]
        table.add_row(
            row,
            f"{analytic / size:.3f}",
            f"{traced / size:.3f}",
            f"{(analytic - traced) / size:+.3f}",
            _error_text(error),
        )
    table.add_row(
        "[bold]total (tensors)[/bold]",
        f"[bold]{a / size:.3f}[/bold]",
        f"[bold]{t / size:.3f}[/bold]",
        f"{(a - t) / size:+.3f}",
        _error_text(check.relative_error["total"]),
    )
    return table


def render_verify(report: Any, console: Console) -> None:
    """Traced vs analytic tables of the update and log-prob phases, with what the trace covered."""
    tr = report.trace
    kernel = "fused (chunked) log-probs" if tr.fused_logprob else "plain logits"
    ckpt = "on" if tr.gradient_checkpointing else "off"
    ranks = (
        f"rank 0 of {report.world_size} FSDP2 ranks"
        if report.world_size > 1
        else "one unsharded rank (fp32 weights in place under bf16 autocast)"
        if tr.numerics == "cuda"
        else "one unsharded rank"
    )
    shared = f", {tr.shared_forwards} shared-prompt forward(s)" if tr.shared_forwards else ""
    console.print(
        f"\n[bold]Traced vs analytic[/bold] — {report.model_name} on {report.cluster_label}: {ranks}, "
        f"the engine's own actor on fake tensors in {tr.trace_s:.1f} s{shared}; "
        f"{tr.update_seqs} sequences of {tr.prompt_len_tokens}+{tr.response_len_tokens} tokens in "
        f"{tr.update_micro_batches} update micro-batch(es), checkpointing {ckpt}, {kernel}."
    )
    console.print(
        "Analytic = the planner's estimate with every sequence at its maximum length (the trace's case); "
        "rel. error = (analytic − traced) / traced, > 0 over-estimates."
    )
    console.print(_phase_table(report.update, "update phase (peak of forward/backward and optimizer step)"))
    if report.log_prob is not None:
        which = "reference" if tr.log_prob is tr.ref_log_prob else "old-policy"
        title = f"log_prob phase (the {which} pass, {tr.log_prob_seqs} sequences in one micro-batch)"
        console.print(_phase_table(report.log_prob, title))
    skipped = sum(report.update.not_traced.values())
    console.print(
        f"Not traced (analytic only, update phase): {skipped / GiB:.2f} GiB of CUDA context, cuBLAS, NCCL, "
        "fragmentation and vLLM leftovers."
    )
    for note in report.notes:
        console.print(f"Note: {note}")
