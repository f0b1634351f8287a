"""`grpo-plan`: does a GRPO run fit, with which knobs, and how fast will a step be?

Flow: parse flags → resolve model and cluster → search (or evaluate the fully pinned knobs) →
print rich tables (or only the plan JSON with --json) → write plan.json atomically (--out) →
optionally print the verl command or TRL config (--emit). Does not fit → exit 3 with the binding
constraint and suggestions on stderr (--json still prints the evaluated plan); bad input → exit 2.
GiB appear only in what this module prints; everything it receives is in bytes.
"""

from __future__ import annotations

from typing import Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from grpo_pilot.cli import handle_errors
from grpo_pilot.errors import InfeasibleError, InputError
from grpo_pilot.hardware.cluster import parse_cluster, parse_size_bytes
from grpo_pilot.hardware.gpus import GiB
from grpo_pilot.planner.config import KNOB_KEYS, PHASES, Knobs, Workload
from grpo_pilot.planner.plan import Plan, save_plan
from grpo_pilot.planner.search import DEFAULT_TRIALS
from grpo_pilot.profiles.catalog import SHORT_ALIASES, all_aliases, resolve_model

TARGETS = ("grpo-pilot", "verl", "trl")
EMITS = ("verl", "trl")
_NONE_WORDS = {"none", "null", ""}

app = typer.Typer(
    add_completion=False, help="Plan a GRPO run: per-GPU memory by phase, step time, and the knobs that fit."
)


def parse_pins(texts: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings → validated knob values; a bad key or value is a usage error (exit 2)."""
    keys = ", ".join(KNOB_KEYS)
    pins: dict[str, Any] = {}
    for text in texts:
        key, sep, raw = text.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in KNOB_KEYS:
            raise InputError(f"--pin '{text}' is not KEY=VALUE with a known knob key.", f"Knob keys: {keys}.")
        value: Any = None if raw.strip().lower() in _NONE_WORDS else raw.strip()
        try:
            pins[key] = getattr(Knobs(**{key: value}), key)
        except ValidationError as exc:
            raise InputError(f"--pin {key}={raw}: {exc.errors()[0]['msg']}.", f"Knob keys: {keys}.") from None
    try:
        Knobs(**pins)
    except ValidationError as exc:
        raise InputError(f"The pinned knobs do not combine: {exc.errors()[0]['msg']}.", f"Knob keys: {keys}.") from None
    return pins


def _workload(**fields: Any) -> Workload:
    try:
        return Workload(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "workload"
        raise InputError(
            f"Bad workload ({where}): {first['msg']}.",
            "Check --prompts-per-step, --mini-batch, --n, --prompt-len, --response-len.",
        ) from None


def _gib(n: int | float) -> str:
    return f"{n / GiB:.2f}"


def _mem_unit(largest_bytes: int) -> tuple[str, int]:
    """GiB for real models; MiB when every number of a table is below 1 GiB (tiny CPU models)."""
    return ("GiB", GiB) if largest_bytes >= GiB else ("MiB", 1 << 20)


def _in(n: int | float, unit: tuple[str, int]) -> str:
    return f"{n / unit[1]:,.2f}"


def _count(n: int) -> str:
    """Parameter count with a readable suffix (32.76B, 494.03M, 138.18K)."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def _secs(s: float) -> str:
    """Seconds with enough digits to be read at any scale."""
    return f"{s:,.0f}" if s >= 100 else f"{s:.2f}" if s >= 1 else f"{s:.4f}"


def list_models(console: Console) -> None:
    table = Table(title="bundled models (grpo-plan --model NAME, or a path to an HF config.json)")
    for col in ("name", "resolves to", "hub id", "params"):
        table.add_column(col)
    for name in all_aliases():
        r = resolve_model(name)
        table.add_row(name, r.resolved if name in SHORT_ALIASES else "", r.hub_id or "", _count(r.spec.num_params))
    console.print(table)


def render(plan: Plan, console: Console, pins: dict[str, Any]) -> None:
    """The human view: header, knobs, memory by phase and item, host RAM, step time."""
    m, c = plan.model, plan.cluster
    alias = f"'{m.requested}' resolved to {m.resolved}" + (f" ({m.hub_id})" if m.hub_id else "")
    console.print(
        f"[bold]{alias}[/bold], {_count(m.spec.num_params)} params · {c.label()} "
        f"({c.world_size} × {c.gpu.name}, {_gib(c.gpu.memory_bytes)} GiB each, {_gib(plan.usable_gpu_bytes)} GiB usable) · "
        f"target {plan.target}"
    )
    w = plan.workload
    console.print(
        f"workload: {w.prompts_per_step} prompts/step × n={w.n}, mini-batch {w.mini_batch_prompts}, "
        f"prompt {w.prompt_len_tokens} + response {w.response_len_tokens} tokens, KL loss {'on' if w.use_kl_loss else 'off'}"
    )
    p = plan.provenance
    how = (
        f"search: {p.search_trials} Optuna trials ({p.feasible_trials} feasible) + {p.refine_evaluations} refinement evaluations, seed {p.search_seed}"
        if p.search_trials
        else "every searched knob pinned: evaluated as given"
    )
    verdict = "[green]FITS[/green]" if plan.fits else "[red]DOES NOT FIT[/red]"
    console.print(
        f"{verdict} · peak {_gib(plan.peak_gpu_bytes)} of {_gib(plan.usable_gpu_bytes)} GiB usable · "
        f"binding: {plan.binding_constraint or '—'} · {how}"
    )

    defaults = Knobs()
    knobs = Table(title="knobs")
    for col in ("knob", "value", "verl default", "source"):
        knobs.add_column(col)
    for key in KNOB_KEYS:
        value, default = getattr(plan.knobs, key), getattr(defaults, key)
        source = "pinned" if key in pins else ("" if value == default else "searched")
        knobs.add_row(key, str(value), str(default), source)
    console.print(knobs)

    unit = _mem_unit(max(plan.phases[ph].total_bytes for ph in PHASES))
    mem = Table(
        title=f"{'CPU' if c.gpu.is_cpu else 'GPU'} memory per phase ({unit[0]}, one {'process' if c.gpu.is_cpu else 'GPU'})"
    )
    mem.add_column("item")
    for phase in PHASES:
        mem.add_column(phase, justify="right")
    names: list[str] = []
    for phase in PHASES:
        names += [n for n in plan.phases[phase].items if n not in names]
    for name in sorted(names, key=lambda n: (n.startswith("overhead_"), names.index(n))):
        cells = [plan.phases[ph].items.get(name) for ph in PHASES]
        if any(cells):
            mem.add_row(name, *[_in(v, unit) if v else "" for v in cells])
    mem.add_section()
    mem.add_row("[bold]total[/bold]", *[f"[bold]{_in(plan.phases[ph].total_bytes, unit)}[/bold]" for ph in PHASES])
    mem.add_row("usable", *[_in(plan.usable_gpu_bytes, unit)] * len(PHASES))
    mem.add_row("share of usable", *[f"{plan.phases[ph].total_bytes / plan.usable_gpu_bytes:.0%}" for ph in PHASES])
    console.print(mem)

    host_unit = _mem_unit(plan.host.total_bytes)
    host = Table(title=f"host RAM per node ({host_unit[0]}, of {_gib(plan.host_ram_bytes_per_node)} GiB)")
    host.add_column("item")
    host.add_column(host_unit[0], justify="right")
    for name, value in plan.host.items.items():
        if value:
            host.add_row(name, _in(value, host_unit))
    host.add_section()
    host.add_row("[bold]total[/bold]", f"[bold]{_in(plan.host.total_bytes, host_unit)}[/bold]")
    console.print(host)

    time = Table(title="step time (roofline)")
    time.add_column("phase")
    time.add_column("seconds", justify="right")
    time.add_column("share", justify="right")
    for phase in PHASES:
        s = plan.phase_times_s[phase]
        time.add_row(phase, _secs(s), f"{s / plan.predicted_step_s:.0%}" if plan.predicted_step_s else "")
    time.add_section()
    time.add_row("[bold]step[/bold]", f"[bold]{_secs(plan.predicted_step_s)}[/bold]", "")
    console.print(time)
    console.print(
        f"throughput {plan.tokens_per_s:,.0f} tokens/s (cluster) · MFU {plan.mfu:.1%} · "
        f"KV cache {plan.kv_cache_tokens_per_gpu:,} tokens/GPU · {plan.max_concurrent_seqs} concurrent sequences per replica"
    )
    for v in plan.violations:
        console.print(f"[red]violation:[/red] {v}")
    for s in plan.suggestions:
        console.print(f"[yellow]suggestion:[/yellow] {s}")


def _plan(
    model: str,
    gpus: str,
    host_ram: Optional[str],
    target: str,
    workload: Workload,
    pins: dict[str, Any],
    trials: int,
    seed: int,
) -> Plan:
    """Resolve inputs, search, and return the plan (suggestions attached when it does not fit)."""
    from grpo_pilot.planner.evaluate import PlanInputs, model_ref
    from grpo_pilot.planner.make_plan import make_plan

    resolved = resolve_model(model)
    host_bytes = parse_size_bytes(host_ram) if host_ram else None
    if gpus.strip().lower() == "local":
        from grpo_pilot.hardware.detect import local_cluster  # imports torch, only on this path

        cluster = local_cluster(host_bytes)
    else:
        cluster = parse_cluster(gpus, host_bytes)
    inputs = PlanInputs(model=model_ref(resolved), cluster=cluster, workload=workload, target=target)  # type: ignore[arg-type]
    return make_plan(inputs, pins=pins, trials=trials, seed=seed)


@app.command()
@handle_errors
def main(
    model: Optional[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="Bundled alias (qwen-32b, llama-8b, ...), hub id of a bundled model, or a path to an HF config.json / model dir.",
    ),
    gpus: Optional[str] = typer.Option(
        None,
        "--gpus",
        "-g",
        help="Cluster: 8xA100-80G, 8xH100, 2x8xH100-80G, 16xH20, 1xcpu, or 'local' (detect this node's GPUs).",
    ),
    host_ram: Optional[str] = typer.Option(
        None, "--host-ram", help="Host RAM per node, e.g. 1TiB, 512GiB (default 1 TiB)."
    ),
    target: Optional[str] = typer.Option(
        None,
        "--target",
        help="Executor the estimate models: grpo-pilot, verl or trl (default: the --emit framework, else grpo-pilot).",
    ),
    prompts_per_step: int = typer.Option(
        1024, "--prompts-per-step", min=1, help="Prompts per step (verl data.train_batch_size)."
    ),
    mini_batch: int = typer.Option(
        256, "--mini-batch", min=1, help="Prompts per PPO mini-batch (one optimizer step each)."
    ),
    n: int = typer.Option(5, "--n", min=1, help="Responses per prompt (group size)."),
    prompt_len: int = typer.Option(512, "--prompt-len", min=1, help="Longest prompt, tokens."),
    response_len: int = typer.Option(1024, "--response-len", min=1, help="Longest response, tokens."),
    kl: bool = typer.Option(True, "--kl/--no-kl", help="KL loss against a frozen reference model."),
    trials: int = typer.Option(
        0,
        "--trials",
        min=0,
        help=f"Optuna sampler trials before the local refinement (0 = the default, {DEFAULT_TRIALS}).",
    ),
    seed: int = typer.Option(0, "--seed", help="Sampler seed (same inputs + seed = same plan)."),
    pin: list[str] = typer.Option(
        [], "--pin", help=f"Fix a knob, KEY=VALUE (repeatable). Keys: {', '.join(KNOB_KEYS)}."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print only the plan JSON on stdout."),
    out: Optional[str] = typer.Option(
        None, "--out", "-o", help="Write plan.json here (atomically; only when the plan fits)."
    ),
    emit: Optional[str] = typer.Option(None, "--emit", help="Also print the run configuration for 'verl' or 'trl'."),
    list_models_flag: bool = typer.Option(False, "--list-models", help="List bundled models and exit."),
) -> None:
    console = Console(soft_wrap=False, width=None)
    if list_models_flag:
        list_models(console)
        return
    if not model or not gpus:
        missing = " and ".join(f for f, v in (("--model", model), ("--gpus", gpus)) if not v)
        raise InputError(
            f"{missing} {'is' if ' and ' not in missing else 'are'} required.",
            "Example: grpo-plan --model qwen-32b --gpus 8xA100-80G (see --list-models, --help).",
        )
    if emit is not None and emit not in EMITS:
        raise InputError(f"Unknown --emit '{emit}'.", f"Choose one of: {', '.join(EMITS)}.")
    target = target or emit or "grpo-pilot"  # --emit verl plans for verl's memory behaviour unless told otherwise
    if target not in TARGETS:
        raise InputError(f"Unknown --target '{target}'.", f"Choose one of: {', '.join(TARGETS)}.")
    if emit and json_out:
        raise InputError(
            "--emit and --json both want stdout.", "Use --json --out plan.json, then run again with --emit."
        )
    pins = parse_pins(pin)
    workload = _workload(
        prompts_per_step=prompts_per_step,
        mini_batch_prompts=mini_batch,
        n=n,
        prompt_len_tokens=prompt_len,
        response_len_tokens=response_len,
        use_kl_loss=kl,
    )
    plan = _plan(model, gpus, host_ram, target, workload, pins, trials or DEFAULT_TRIALS, seed)
    if json_out:
        typer.echo(plan.to_json(), nl=False)
    else:
        render(plan, console, pins)
    if not plan.fits:
        what = "The pinned configuration does not fit" if plan.provenance.search_trials == 0 else "Nothing fits"
        raise InfeasibleError(
            f"{what} for {plan.model.resolved} on {plan.cluster.label()}. Binding constraint {plan.binding_constraint}: "
            + (plan.violations[0] if plan.violations else "see the table."),
            " ".join(f"Suggestion: {s}" for s in plan.suggestions) + (" No plan file was written." if out else ""),
            plan=plan,
        )
    if out:
        path = save_plan(plan, out)
        if not json_out:
            console.print(f"plan written to {path}")
    if emit:
        from grpo_pilot.planner.export import trl_config_text, verl_command

        typer.echo(verl_command(plan) if emit == "verl" else trl_config_text(plan), nl=False)
