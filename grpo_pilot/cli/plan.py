"""`grpo-plan`: does a GRPO run fit, with which knobs, and how fast will a step be?

Flow: the flags (`plan_flags.PlanArgs`) and their rules (`plan_flags.RULES`) → resolve model, cluster and
workload (lengths from flags, a lengths file or a dataset) → search (or evaluate the fully pinned knobs, or a
verl / TRL launch as given) → print rich tables (plan_render.py), or only the plan JSON with --json, or only
the verl command / TRL config with --emit (the tables then go to stderr) → write plan.json atomically (--out).
Does not fit → exit 3 with the binding constraint and suggestions on stderr (--json still prints the evaluated
plan); bad input → exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from grpo_pilot.cli.options import check_rules, command, console
from grpo_pilot.cli.plan_flags import RULES, PlanArgs
from grpo_pilot.cli.plan_inputs import launch_cluster, length_fields, make_workload, read_text
from grpo_pilot.cli.plan_render import list_models, render
from grpo_pilot.errors import ConditionalFitError, InfeasibleError, InputError
from grpo_pilot.hardware.cluster import Cluster, parse_cluster, parse_size_bytes
from grpo_pilot.hardware.gpus import GPUSpec, lookup_gpu
from grpo_pilot.planner.adapters import adapters_modelled, flag_adapter
from grpo_pilot.planner.config import KNOB_KEYS, Knobs, Workload
from grpo_pilot.planner.plan import CONDITIONAL_VERDICTS, Plan, check_plan_out, save_plan
from grpo_pilot.planner.trl_dtype import checkpoint_model_dtype
from grpo_pilot.profiles.catalog import resolve_model
from grpo_pilot.profiles.gguf import is_gguf_ref
from grpo_pilot.units import GiB

_NONE_WORDS = {"none", "null", ""}

app = typer.Typer(
    add_completion=False, help="Plan a GRPO run: per-GPU memory by phase, step time, and the knobs that fit."
)


def parse_pins(texts: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings → validated knob values; a bad key or value is a usage error (exit 2)."""
    keys = ", ".join(KNOB_KEYS)
    pins: dict[str, Any] = {}
    given: dict[str, str] = {}
    for text in texts:
        key, sep, raw = text.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in KNOB_KEYS:
            raise InputError(f"--pin '{text}' is not KEY=VALUE with a known knob key.", f"Knob keys: {keys}.")
        if key in given:
            same = "repeats" if given[key].strip() == raw.strip() else "contradicts"
            raise InputError(
                f"--pin {key} is given twice ('{key}={given[key]}' and '{text}'): the second {same} the first.",
                f"Pin {key} once.",
            )
        given[key] = raw
        value: Any = None if raw.strip().lower() in _NONE_WORDS else raw.strip()
        try:
            pins[key] = getattr(Knobs(**{key: value}), key)
        except ValidationError as exc:
            raise InputError(f"--pin {key}={raw}: {exc.errors()[0]['msg']}.", f"Knob keys: {keys}.") from None
    try:
        Knobs(**pins)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise InputError(
            f"The pinned knobs contradict each other: {msg}.", "Drop or change one of the --pin flags."
        ) from None
    return pins


def check_pins(inputs: Any, pins: dict[str, Any]) -> None:
    """A pin that breaks a divisibility or size rule on this model and cluster is bad input (exit 2)."""
    from grpo_pilot.planner.pins import pin_conflicts

    broken = pin_conflicts(inputs, pins)
    if broken:
        shown = " ".join(f"--pin {k}={v}" for k, v in pins.items())
        raise InputError(
            f"The pins ({shown}) cannot work on {inputs.cluster.label()} with this model: rule "
            f"{broken[0].rule}: {broken[0].message}",
            "Change or drop that --pin (without it the search can satisfy the rule).",
        )


def check_executor_pins(target: str, pins: dict[str, Any]) -> None:
    """A pin the target executor has no setting for (`ExecutorTraits.missing_knobs`) cannot be exported or run
    as planned: refused (exit 2) unless it pins the default the executor behaves as. The launch families' knobs
    are `planner.support`'s to refuse, with the executor that runs them."""
    from grpo_pilot.planner.traits import FAMILY_KNOBS, TRAITS

    defaults = Knobs()
    moved = [
        k
        for k, v in pins.items()
        if k not in FAMILY_KNOBS and not TRAITS[target].has_knob(k) and v != getattr(defaults, k)
    ]
    if moved:
        shown = " ".join(f"--pin {k}={pins[k]}" for k in moved)
        raise InputError(
            f"{shown}: target {target} has no setting for {', '.join(moved)} (it runs as "
            f"{', '.join(f'{k}={getattr(defaults, k)}' for k in moved)}), so the plan would not be what it runs.",
            "Drop that --pin, or plan for another --target.",
        )


def _cluster(gpus: str, host_bytes: int | None) -> Cluster:
    if gpus.strip().lower() == "local":
        from grpo_pilot.hardware.detect import local_cluster  # imports torch, only on this path

        return local_cluster(host_bytes)
    return parse_cluster(gpus, host_bytes)


def _inputs(model: str, cluster: Cluster, workload: Workload, target: str, *, headroom_gib: float | None):
    from grpo_pilot.planner.evaluate import PlanInputs, model_ref

    resolved = resolve_model(model)
    if resolved.hub_id is None and Path(resolved.resolved).exists() and not is_gguf_ref(model):
        from grpo_pilot.profiles.buildable import check_buildable
        from grpo_pilot.profiles.spec import load_hf_config

        check_buildable(*load_hf_config(resolved.resolved))  # transformers' own validation, where installed
    headroom = None if headroom_gib is None else int(headroom_gib * GiB)
    return PlanInputs(
        model=model_ref(resolved), cluster=cluster, workload=workload, target=target, headroom_bytes=headroom
    )  # type: ignore[arg-type]


def _calibrate(inputs: Any, args: PlanArgs) -> tuple[Any, str | None]:
    """The calibration that applies (--calibration FILE, else the default file unless --no-calibration)."""
    from grpo_pilot.planner.calibration import choose_calibration
    from grpo_pilot.tuner.versions import software_versions

    return choose_calibration(
        inputs, args.calibration, use_default=not args.no_calibration, versions=software_versions()
    )


def _evaluate_launch(inputs: Any, knobs: Knobs, trials: int, seed: int) -> tuple[Plan, list[str]]:
    """A launch evaluated exactly as given; when it does not fit, the suggestions and what a search of the
    same job on the same cluster would change: the knobs the search never moves (the launcher, the load dtype,
    the verl era's behaviour, the engine caps) stay the launch's; the changes are given as the target's keys
    (verl overrides, TRL GRPOConfig settings)."""
    from grpo_pilot.planner.evaluate import assess
    from grpo_pilot.planner.export import trl_settings, verl_overrides
    from grpo_pilot.planner.knob_space import searched_fields
    from grpo_pilot.planner.make_plan import make_plan, to_plan
    from grpo_pilot.planner.search import build_space
    from grpo_pilot.planner.suggest import suggest
    from grpo_pilot.planner.support import require_supported

    require_supported(inputs.target, inputs.workload, knobs, model_is_moe=inputs.model.spec.is_moe)
    a = assess(inputs, knobs)
    if a.fits:
        return to_plan(inputs, a), []
    searched = searched_fields(build_space(inputs, {}).choices)
    kept = {k: v for k, v in knobs.model_dump().items() if k not in searched}
    plan = to_plan(inputs, a, suggestions=suggest(inputs, a, {}, kept=kept))
    searched = make_plan(inputs, pins=kept, trials=trials, seed=seed)
    if not searched.fits:
        return plan, []
    if inputs.target == "trl":
        before, after = trl_settings(plan)[0], trl_settings(searched)[0]
        changes = [f"{k}: {before.get(k)} → {v}" for k, v in after.items() if before.get(k) != v]
    else:
        before, after = dict(verl_overrides(plan)), dict(verl_overrides(searched))
        changes = [
            f"{k}: {before.get(k)} → {v}" for k, v in after.items() if before.get(k) != v and k.startswith("actor")
        ]
    lines = [f"a searched configuration fits (predicted {searched.predicted_step_s:.0f} s/step); change:"] + changes
    return plan, lines


def _infeasible(plan: Plan, *, written: bool) -> InfeasibleError:
    """The error a plan that does not fit ends `grpo-plan` with: exit 4 when it fits conditionally (tight, or
    below a mean response length the launch does not state), else exit 3."""
    what = "The pinned configuration" if plan.provenance.search_trials == 0 else "The best configuration found"
    verdict = plan.verdict
    hint = " ".join(f"Suggestion: {s}" for s in plan.suggestions) + (" No plan file was written." if written else "")
    if verdict is not None and verdict.kind in CONDITIONAL_VERDICTS:
        return ConditionalFitError(
            f"{what} for {plan.model.resolved} on {plan.cluster.label()} "
            f"{'is ' if verdict.kind == 'tight' else ''}{verdict.message}.",
            hint.strip(),
            plan=plan,
        )
    what = "The pinned configuration does not fit" if plan.provenance.search_trials == 0 else "Nothing fits"
    short = f" ({verdict.message})" if verdict is not None and verdict.message != "does not fit" else ""
    return InfeasibleError(
        f"{what} for {plan.model.resolved} on {plan.cluster.label()}{short}. Binding constraint "
        f"{plan.binding_constraint}: " + (plan.violations[0] if plan.violations else "see the table."),
        hint,
        plan=plan,
    )


def _launch(
    args: PlanArgs, host_bytes: int | None, lengths: dict[str, Any]
) -> tuple[str, Cluster, Workload, Knobs, list[str], str, dict[str, Any]]:
    """(model, cluster, workload, knobs, notes, target, HF config overrides) of a verl script or a TRL config."""
    hf_overrides: dict[str, Any] = {}
    dtype_auto = False
    if args.from_verl:
        from grpo_pilot.planner.from_verl import read_verl
        from grpo_pilot.planner.shell_words import split_words

        script_args = split_words(args.script_args) if args.script_args else []
        text = read_text(args.from_verl, "verl launch script")
        gpu = _named_gpu(args.gpus, host_bytes)
        launch = read_verl(text, args.override, script_args=script_args, model_fallback=args.model, gpu=gpu)
        cluster = launch_cluster(args.gpus, launch.num_nodes, launch.gpus_per_node, host_bytes)
        workload_fields, knobs, notes, target = dict(launch.workload), launch.knobs, list(launch.notes), "verl"
        launch_model, hf_overrides = launch.model, dict(launch.hf_overrides)
        if not launch.remove_padding:
            lengths = {k: v for k, v in lengths.items() if k in ("prompt_len_tokens", "response_len_tokens")}
    else:
        from grpo_pilot.planner.from_trl import read_trl

        assert args.gpus  # RULES
        cluster = _cluster(args.gpus, host_bytes)
        text = read_text(str(args.from_trl), "TRL config")
        trl = read_trl(text, cluster.world_size, args.override, cluster.num_nodes)
        workload_fields, knobs, notes, target = dict(trl.workload), dict(trl.knobs), list(trl.notes), "trl"
        launch_model, dtype_auto = trl.model, "model_dtype" not in knobs
    # the launch's maxima win over the flag defaults; means, spreads and sources come from the flags
    for key, value in lengths.items():
        if key not in ("prompt_len_tokens", "response_len_tokens"):
            workload_fields[key] = value
    workload = make_workload(**workload_fields)
    chosen = args.model or launch_model
    try:
        resolved = resolve_model(chosen)
    except InputError:
        raise InputError(
            f"The launch trains '{launch_model}', which is neither a bundled model nor a local config.",
            "Pass --model with a bundled alias of the same architecture or a path to its config.json.",
        ) from None
    if target == "trl" and dtype_auto:  # `dtype: auto` loads the checkpoint's dtype (planner/trl_dtype.py)
        knobs["model_dtype"] = checkpoint_model_dtype(
            resolved.checkpoint_dtype, state_sharding=knobs["state_sharding"], notes=notes
        )
    try:
        knob_values = Knobs(**{**Knobs().model_dump(), **knobs})
    except ValidationError as exc:
        raise InputError(f"The launch's settings are not a valid plan: {exc.errors()[0]['msg']}.", "") from None
    return chosen, cluster, workload, knob_values, notes, target, hf_overrides


def _named_gpu(gpus: str | None, host_bytes: int | None) -> GPUSpec | None:
    """The GPU `--gpus` names (a name or a full layout), None without one or for a bad one (`launch_cluster`
    refuses it with the launch's counts)."""
    if not gpus:
        return None
    gpu = lookup_gpu(gpus)
    if gpu is not None:
        return gpu
    try:
        return parse_cluster(gpus, host_bytes).gpu
    except InputError:
        return None


def _flag_adapter(args: PlanArgs) -> Any:
    """Workload.adapter from --lora-rank / --lora-alpha / --lora-targets / --quantize-base (None without them;
    which of them may be given with what is `plan_flags.RULES`')."""
    if args.lora_rank is None:
        return None
    return flag_adapter(args.lora_rank, alpha=args.lora_alpha, targets=args.lora_targets, base_bits=args.quantize_base)


def _with_hf_overrides(inputs: Any, hf_overrides: dict[str, Any]) -> tuple[Any, list[str]]:
    """The plan inputs with the launch's `override_config` applied to the model spec (profiles/config_overrides)."""
    if not hf_overrides:
        return inputs, []
    from grpo_pilot.profiles.config_overrides import apply_config_overrides

    spec, notes = apply_config_overrides(inputs.model.spec, hf_overrides)
    return inputs.model_copy(update={"model": inputs.model.model_copy(update={"spec": spec})}), notes


@dataclass(frozen=True)
class Planned:
    """What the flow hands to the output stage: the plan, the knobs the user fixed, and notes for the table."""

    plan: Plan
    pins: dict[str, Any]
    notes: list[str]
    compared: Plan | None = None  # --compare: the other algorithm's plan


def _plan_launch(args: PlanArgs, lengths: dict[str, Any], host_bytes: int | None) -> Planned:
    """A verl / TRL launch evaluated as given (`--pin` on top sets what its file cannot say)."""
    model, cluster, workload, knobs, notes, launch_target, hf_overrides = _launch(args, host_bytes, lengths)
    if args.pin:
        knobs = Knobs(**{**knobs.model_dump(), **parse_pins(args.pin)})
    inputs = _inputs(model, cluster, workload, args.target or launch_target, headroom_gib=args.headroom_gib)
    inputs, model_notes = _with_hf_overrides(inputs, hf_overrides)
    inputs, note = _calibrate(inputs, args)
    plan, changes = _evaluate_launch(inputs, knobs, args.trials, args.seed)
    notes += model_notes + ([note] if note else []) + changes
    return Planned(plan, {k: getattr(knobs, k) for k in KNOB_KEYS}, notes)


def _plan_search(args: PlanArgs, lengths: dict[str, Any], host_bytes: int | None) -> Planned:
    """The knobs searched (or evaluated, when all are pinned) for the flags' model, cluster and workload."""
    from grpo_pilot.planner.make_plan import make_plan

    assert args.model and args.gpus  # RULES
    pins = parse_pins(args.pin)
    workload = make_workload(
        prompts_per_step=args.prompts_per_step or 1024,
        mini_batch_prompts=args.mini_batch or 256,
        n=args.n or 5,
        use_kl_loss=True if args.kl is None else args.kl,
        adapter=_flag_adapter(args),
        algorithm=args.algorithm or "grpo",
        **lengths,
    )
    # --emit verl plans for verl's memory behaviour; PPO and --compare for verl, the executor running both
    target = args.target or args.emit or ("verl" if (args.compare or args.algorithm == "ppo") else "grpo-pilot")
    check_executor_pins(target, pins)
    inputs = _inputs(args.model, _cluster(args.gpus, host_bytes), workload, target, headroom_gib=args.headroom_gib)
    inputs, note = _calibrate(inputs, args)
    plan = make_plan(inputs, pins=pins, trials=args.trials, seed=args.seed)
    if not plan.fits:
        check_pins(inputs, pins)
    notes = [note] if note else []
    if workload.adapter is not None and not adapters_modelled(plan):
        notes.append(
            f"adapters ({workload.adapter.describe()}) are carried in plan.json for grpo-run, but this estimate is "
            "full fine-tuning's: grpo-plan does not model adapter memory or time yet"
        )
    compared = None
    if args.compare:
        other = inputs.model_copy(update={"workload": workload.model_copy(update={"algorithm": args.compare})})
        compared = make_plan(other, pins=pins, trials=args.trials, seed=args.seed)
    return Planned(plan, pins, notes, compared)


def _length_values(args: PlanArgs) -> dict[str, Any]:
    return length_fields(
        prompt_len=args.prompt_len,
        response_len=args.response_len,
        prompt_len_mean=args.prompt_len_mean,
        response_len_mean=args.response_len_mean,
        prompt_len_std=args.prompt_len_std,
        response_len_std=args.response_len_std,
        lengths=args.lengths,
        lengths_from=args.lengths_from,
        tokenizer=args.tokenizer,
    )


def _show(args: PlanArgs, planned: Planned) -> None:
    """stdout: the plan JSON (--json), the export (--emit) or the tables; then the plot, the plan file, the verdict.
    With --emit everything but the export goes to stderr, so `grpo-plan ... --emit verl > launch.sh` is a script."""
    plan = planned.plan
    report = None
    if args.verify:
        from grpo_pilot.cli.plan_verify import verify as verify_plan

        report = verify_plan(plan)
    human = console(stderr=bool(args.emit))
    if args.json_out:
        _print_json(plan, report)
    else:
        render(plan, human, planned.pins, planned.notes)
        if planned.compared is not None:
            from grpo_pilot.cli.plan_compare import render_compare

            render_compare(plan, planned.compared, human)
        if report is not None:
            from grpo_pilot.cli.plan_verify import render_verify

            render_verify(report, human)
    if args.plot:
        from grpo_pilot.memory_plot import write_memory_plot

        written = write_memory_plot(plan, args.plot)
        if not args.json_out:
            human.print(f"memory plot written to {written}")
    if not plan.fits:
        raise _infeasible(plan, written=bool(args.out))
    if args.out:
        path = save_plan(plan, args.out)
        if not args.json_out:
            human.print(f"plan written to {path}")
    if args.emit:
        from grpo_pilot.planner.export import trl_config_text, verl_command

        typer.echo(verl_command(plan) if args.emit == "verl" else trl_config_text(plan), nl=False)


def _print_json(plan: Plan, report: Any) -> None:
    if report is None:
        typer.echo(plan.to_json(), nl=False)
        return
    from grpo_pilot.cli.plan_verify import plan_json_with_verify

    typer.echo(plan_json_with_verify(plan.to_json(), report), nl=False)


@command(app, PlanArgs)
def main(args: PlanArgs) -> None:
    """Plan a GRPO run: per-GPU memory by phase, step time, and the knobs that fit."""
    if args.list_models:
        list_models(console())
        return
    check_rules(args, RULES)
    if args.out:
        check_plan_out(args.out)  # before any work: a directory, a device or a foreign file is refused now
    if args.verify:
        from grpo_pilot.cli.plan_verify import require_engine

        require_engine()
    lengths = _length_values(args)
    host_bytes = parse_size_bytes(args.host_ram, flag="--host-ram") if args.host_ram else None
    planned = _plan_launch(args, lengths, host_bytes) if args.launch else _plan_search(args, lengths, host_bytes)
    _show(args, planned)
