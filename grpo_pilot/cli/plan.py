"""`grpo-plan`: does a GRPO run fit, with which knobs, and how fast will a step be?

Flow: parse flags → resolve model, cluster and workload (lengths from flags, a lengths file or a
dataset) → search (or evaluate the fully pinned knobs, or a verl / TRL launch as given) → print rich
tables (cli_plan_render.py) or only the plan JSON with --json → write plan.json atomically (--out) →
optionally print the verl command or TRL config (--emit). Does not fit → exit 3 with the binding
constraint and suggestions on stderr (--json still prints the evaluated plan); bad input → exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console

from grpo_pilot.cli.errors import handle_errors
from grpo_pilot.cli.plan_inputs import launch_cluster, length_fields, make_workload, read_text
from grpo_pilot.cli.plan_render import list_models, render
from grpo_pilot.errors import ConditionalFitError, InfeasibleError, InputError
from grpo_pilot.hardware.cluster import Cluster, parse_cluster, parse_size_bytes
from grpo_pilot.planner.adapters import adapters_modelled, flag_adapter
from grpo_pilot.planner.config import KNOB_KEYS, Knobs, Workload
from grpo_pilot.planner.plan import Plan, check_plan_out, save_plan
from grpo_pilot.planner.search import DEFAULT_TRIALS
from grpo_pilot.profiles.catalog import resolve_model
from grpo_pilot.profiles.gguf import is_gguf_ref
from grpo_pilot.units import GiB

TARGETS = ("grpo-pilot", "verl", "trl")
EMITS = ("verl", "trl")
ALGORITHMS = ("grpo", "ppo")
_NONE_WORDS = {"none", "null", ""}
# workload flags a launch file sets itself
_LAUNCH_SETS = ("--prompts-per-step", "--mini-batch", "--n", "--kl/--no-kl", "--prompt-len", "--response-len")

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


def _cluster(gpus: str, host_bytes: int | None) -> Cluster:
    if gpus.strip().lower() == "local":
        from grpo_pilot.hardware.detect import local_cluster  # imports torch, only on this path

        return local_cluster(host_bytes)
    return parse_cluster(gpus, host_bytes)


def _inputs(model: str, cluster: Cluster, workload: Workload, target: str, headroom_gib: float | None):
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


def _calibrate(inputs: Any, path: str | None, off: bool) -> tuple[Any, str | None]:
    """The calibration that applies (--calibration FILE, else the default file unless --no-calibration)."""
    if path and off:
        raise InputError("--calibration and --no-calibration contradict each other.", "Use one of them.")
    from grpo_pilot.planner.calibration import choose_calibration
    from grpo_pilot.tuner.versions import software_versions

    return choose_calibration(inputs, path, use_default=not off, versions=software_versions())


def _evaluate_launch(inputs: Any, knobs: Knobs, trials: int, seed: int) -> tuple[Plan, list[str]]:
    """A launch evaluated exactly as given; when it does not fit, the suggestions and what a search of the
    same job on the same cluster would change (as verl overrides for a verl target)."""
    from grpo_pilot.planner.evaluate import assess
    from grpo_pilot.planner.make_plan import to_plan
    from grpo_pilot.planner.export import verl_overrides
    from grpo_pilot.planner.make_plan import make_plan
    from grpo_pilot.planner.suggest import suggest
    from grpo_pilot.planner.support import require_supported

    require_supported(inputs.target, inputs.workload, knobs, model_is_moe=inputs.model.spec.is_moe)
    a = assess(inputs, knobs)
    if a.fits:
        return to_plan(inputs, a), []
    plan = to_plan(inputs, a, suggestions=suggest(inputs, a, {}))
    searched = make_plan(inputs, pins={}, trials=trials, seed=seed)
    if not searched.fits:
        return plan, []
    before, after = dict(verl_overrides(plan)), dict(verl_overrides(searched))
    changes = [f"{k}: {before.get(k)} → {v}" for k, v in after.items() if before.get(k) != v and k.startswith("actor")]
    lines = [f"a searched configuration fits (predicted {searched.predicted_step_s:.0f} s/step); change:"] + changes
    return plan, lines


def _infeasible(plan: Plan, *, written: bool) -> InfeasibleError:
    """The error a plan that does not fit ends `grpo-plan` with: exit 4 when it fits conditionally (tight, or
    below a mean response length the launch does not state), else exit 3."""
    what = "The pinned configuration" if plan.provenance.search_trials == 0 else "The best configuration found"
    verdict = plan.verdict
    hint = " ".join(f"Suggestion: {s}" for s in plan.suggestions) + (" No plan file was written." if written else "")
    if verdict is not None and verdict.kind in ("tight", "fits_below_mean_response"):
        return ConditionalFitError(
            f"{what} for {plan.model.resolved} on {plan.cluster.label()} {verdict.message}.", hint.strip(), plan=plan
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
    from_verl: str | None,
    from_trl: str | None,
    overrides: list[str],
    model: str | None,
    gpus: str | None,
    host_bytes: int | None,
    lengths: dict[str, Any],
    *,
    script_args: str | None = None,
) -> tuple[str, Cluster, Workload, Knobs, list[str], str, dict[str, Any]]:
    """(model, cluster, workload, knobs, notes, target, HF config overrides) of a verl script or a TRL config."""
    hf_overrides: dict[str, Any] = {}
    if from_verl:
        from grpo_pilot.planner.from_verl import read_verl
        from grpo_pilot.planner.shell_words import split_words

        args = split_words(script_args) if script_args else []
        text = read_text(from_verl, "verl launch script")
        launch = read_verl(text, overrides, script_args=args, model_fallback=model)
        cluster = launch_cluster(gpus, launch.num_nodes, launch.gpus_per_node, host_bytes)
        workload_fields, knobs, notes, target = dict(launch.workload), launch.knobs, list(launch.notes), "verl"
        launch_model, hf_overrides = launch.model, dict(launch.hf_overrides)
        if not launch.remove_padding:
            lengths = {k: v for k, v in lengths.items() if k in ("prompt_len_tokens", "response_len_tokens")}
    else:
        from grpo_pilot.planner.from_trl import read_trl

        if not gpus:
            raise InputError("--from-trl needs --gpus (a TRL config does not name the GPUs).", "e.g. --gpus 8xH100.")
        cluster = _cluster(gpus, host_bytes)
        trl = read_trl(read_text(str(from_trl), "TRL config"), cluster.world_size, overrides, cluster.num_nodes)
        workload_fields, knobs, notes, target = dict(trl.workload), trl.knobs, list(trl.notes), "trl"
        launch_model = trl.model
    # the launch's maxima win over the flag defaults; means, spreads and sources come from the flags
    for key, value in lengths.items():
        if key not in ("prompt_len_tokens", "response_len_tokens"):
            workload_fields[key] = value
    workload = make_workload(**workload_fields)
    try:
        knob_values = Knobs(**{**Knobs().model_dump(), **knobs})
    except ValidationError as exc:
        raise InputError(f"The launch's settings are not a valid plan: {exc.errors()[0]['msg']}.", "") from None
    chosen = model or launch_model
    try:
        resolve_model(chosen)
    except InputError:
        raise InputError(
            f"The launch trains '{launch_model}', which is neither a bundled model nor a local config.",
            "Pass --model with a bundled alias of the same architecture or a path to its config.json.",
        ) from None
    return chosen, cluster, workload, knob_values, notes, target, hf_overrides


def _flag_adapter(rank: int | None, alpha: float | None, targets: str, base: str | None, *, launch: bool) -> Any:
    """Workload.adapter from --lora-rank / --lora-alpha / --lora-targets / --quantize-base (None without them)."""
    given = rank is not None or alpha is not None or targets != "all-linear" or base is not None
    if not given:
        return None
    if launch:
        raise InputError("--lora-* and --quantize-base conflict with a launch file.", "Set adapters in the launch.")
    if rank is None:
        raise InputError("--lora-alpha, --lora-targets and --quantize-base need --lora-rank.", "Add --lora-rank R.")
    return flag_adapter(rank, alpha=alpha, targets=targets, base_bits=base)


def _with_hf_overrides(inputs: Any, hf_overrides: dict[str, Any]) -> tuple[Any, list[str]]:
    """The plan inputs with the launch's `override_config` applied to the model spec (profiles/config_overrides)."""
    if not hf_overrides:
        return inputs, []
    from grpo_pilot.profiles.config_overrides import apply_config_overrides

    spec, notes = apply_config_overrides(inputs.model.spec, hf_overrides)
    return inputs.model_copy(update={"model": inputs.model.model_copy(update={"spec": spec})}), notes


@app.command()
@handle_errors
def main(
    model: Optional[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="Bundled alias (qwen-32b, llama-8b, ...), hub id of a bundled model, or a path to an HF config.json "
        "/ model dir.",
    ),
    gpus: Optional[str] = typer.Option(
        None,
        "--gpus",
        "-g",
        help="Cluster: 8xA100-80G, 8xH100, 2x8xH100-80G, 16xH20, 1xcpu, or 'local'. With --from-verl the GPU name "
        "alone (H800): the script gives the counts.",
    ),
    host_ram: Optional[str] = typer.Option(None, "--host-ram", help="Host RAM per node, e.g. 1TiB, 512GiB (1 TiB)."),
    target: Optional[str] = typer.Option(
        None,
        "--target",
        help="Executor the estimate models: grpo-pilot, verl or trl (default: the --emit framework or the launch "
        "file's, else grpo-pilot).",
    ),
    prompts_per_step: Optional[int] = typer.Option(
        None, "--prompts-per-step", min=1, help="Prompts per step (verl data.train_batch_size; 1024)."
    ),
    mini_batch: Optional[int] = typer.Option(
        None, "--mini-batch", min=1, help="Prompts per PPO mini-batch, one optimizer step each (256)."
    ),
    n: Optional[int] = typer.Option(None, "--n", min=1, help="Responses per prompt (group size; 5)."),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", min=1, help="Longest prompt, tokens (512)."),
    response_len: Optional[int] = typer.Option(None, "--response-len", min=1, help="Longest response, tokens (1024)."),
    prompt_len_mean: Optional[float] = typer.Option(
        None, "--prompt-len-mean", min=1, help="Mean prompt length, tokens (default: the maximum)."
    ),
    response_len_mean: Optional[float] = typer.Option(
        None, "--response-len-mean", min=1, help="Mean response length, tokens (default: the maximum)."
    ),
    prompt_len_std: Optional[float] = typer.Option(
        None, "--prompt-len-std", min=0, help="Standard deviation of prompt lengths (default: bounded from mean/max)."
    ),
    response_len_std: Optional[float] = typer.Option(
        None, "--response-len-std", min=0, help="Standard deviation of response lengths (default: bounded)."
    ),
    lengths: Optional[str] = typer.Option(
        None, "--lengths", help="JSONL of {prompt_tokens, response_tokens} per sample (grpo-run's lengths.jsonl)."
    ),
    lengths_from: Optional[str] = typer.Option(
        None, "--lengths-from", help="A JSONL dataset whose prompts are measured (needs --tokenizer and the engine)."
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help="Tokenizer / model directory for --lengths-from."
    ),
    headroom_gib: Optional[float] = typer.Option(
        None, "--headroom-gib", min=0, help="GiB kept free on every GPU (default 5% of the device)."
    ),
    kl: Optional[bool] = typer.Option(None, "--kl/--no-kl", help="KL loss against a frozen reference model (on)."),
    algorithm: Optional[str] = typer.Option(
        None,
        "--algorithm",
        help="grpo (default: group-relative advantages, no critic) or ppo (GAE with a critic: verl "
        "adv_estimator=gae; planned for --target verl, the executor that runs it).",
    ),
    compare: Optional[str] = typer.Option(
        None,
        "--compare",
        help="Also plan the other algorithm (grpo or ppo) for the same model, cluster and workload and print "
        "both side by side per phase (memory and time); the target defaults to verl, which runs both.",
    ),
    from_verl: Optional[str] = typer.Option(
        None, "--from-verl", help="Evaluate a verl launch script (or a file of Hydra overrides) exactly as given."
    ),
    from_trl: Optional[str] = typer.Option(
        None, "--from-trl", help="Evaluate a TRL GRPOConfig YAML (or an Axolotl GRPO config) exactly as given."
    ),
    override: list[str] = typer.Option(
        [],
        "--override",
        help="With --from-verl: a Hydra override applied after the script (key.path=value, ~key.path), an "
        "environment variable set before it (NAME=value, e.g. VLLM_USE_V1=0), or VERL_VERSION=<release or date> "
        "for the verl the launch runs on (its defaults and batch semantics). With --from-trl: a config key "
        "(key=value, e.g. num_processes=8). Repeatable.",
    ),
    script_args: Optional[str] = typer.Option(
        None,
        "--script-args",
        help="With --from-verl: the arguments the launch script is run with, as one string "
        "(e.g. '--model_name Qwen2.5-7B --max_response_length 8192'): its $1 $2 ... and its own argument loop.",
    ),
    trials: int = typer.Option(
        0, "--trials", min=0, help=f"Optuna sampler trials before the local refinement (0 = {DEFAULT_TRIALS})."
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
    calibration: Optional[str] = typer.Option(
        None,
        "--calibration",
        help="Calibration file (grpo-tune's calibration.json) whose measured constants the estimate uses. "
        "Default: $GRPO_PILOT_CALIBRATION_DIR/<GPU>.json (~/.cache/grpo-pilot/calibration) when present.",
    ),
    no_calibration: bool = typer.Option(
        False, "--no-calibration", help="Analytic constants only: ignore the default calibration file."
    ),
    plot: Optional[str] = typer.Option(
        None, "--plot", help="Write a PNG of memory per phase (stacked items) against usable memory (matplotlib)."
    ),
    list_models_flag: bool = typer.Option(False, "--list-models", help="List bundled models and exit."),
    lora_rank: Optional[int] = typer.Option(
        None, "--lora-rank", min=1, help="Train LoRA adapters of rank R on a frozen base (grpo-run: peft)."
    ),
    lora_alpha: Optional[float] = typer.Option(None, "--lora-alpha", min=0, help="LoRA alpha (peft default 8)."),
    lora_targets: str = typer.Option(
        "all-linear", "--lora-targets", help="Adapted modules: all-linear (every linear but the head) or q_proj,v_proj."
    ),
    quantize_base: Optional[str] = typer.Option(
        None, "--quantize-base", help="With --lora-rank: load the base 4bit (NF4, QLoRA) or 8bit (bitsandbytes, CUDA)."
    ),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Also trace the plan's update and log-prob phases through the engine's own actor on fake tensors "
        "(no GPU, seconds) and print traced vs analytic bytes per item (needs the engine extra).",
    ),
) -> None:
    console = Console(soft_wrap=False, width=None)
    if list_models_flag:
        list_models(console)
        return
    if target is not None and target not in TARGETS:
        raise InputError(f"Unknown --target '{target}'.", f"Choose one of: {', '.join(TARGETS)}.")
    if from_verl and from_trl:
        raise InputError("--from-verl and --from-trl both name the configuration.", "Use one of them.")
    launch = from_verl or from_trl
    if out:
        check_plan_out(out)  # before any work: a directory, a device or a foreign file is refused now
    if emit is not None and emit not in EMITS:
        raise InputError(f"Unknown --emit '{emit}'.", f"Choose one of: {', '.join(EMITS)}.")
    if emit and json_out:
        raise InputError(
            "--emit and --json both want stdout.", "Use --json --out plan.json, then run again with --emit."
        )
    if script_args is not None and not from_verl:
        raise InputError("--script-args applies to a --from-verl launch script.", "Add --from-verl SCRIPT.")
    if override and not (from_verl or from_trl):
        raise InputError("--override applies to a --from-verl or --from-trl file.", "Use --pin KEY=VALUE for knobs.")
    for flag, value in (("--algorithm", algorithm), ("--compare", compare)):
        if value is not None and value not in ALGORITHMS:
            raise InputError(f"Unknown {flag} '{value}'.", f"Choose one of: {', '.join(ALGORITHMS)}.")
    if compare is not None and (launch or json_out or compare == (algorithm or "grpo")):
        raise InputError(
            "--compare plans the other algorithm beside --algorithm from --model/--gpus; it prints tables only.",
            "Drop --from-verl/--from-trl and --json, and compare grpo with ppo.",
        )
    if verify:
        from grpo_pilot.cli.plan_verify import require_engine

        require_engine()
    length_values = length_fields(
        prompt_len=prompt_len,
        response_len=response_len,
        prompt_len_mean=prompt_len_mean,
        response_len_mean=response_len_mean,
        prompt_len_std=prompt_len_std,
        response_len_std=response_len_std,
        lengths=lengths,
        lengths_from=lengths_from,
        tokenizer=tokenizer,
    )
    host_bytes = parse_size_bytes(host_ram) if host_ram else None
    notes: list[str] = []
    adapter = _flag_adapter(lora_rank, lora_alpha, lora_targets, quantize_base, launch=bool(launch))
    if launch:
        values = (prompts_per_step, mini_batch, n, kl, prompt_len, response_len, algorithm)
        given = [flag for flag, value in zip(_LAUNCH_SETS + ("--algorithm",), values) if value is not None]
        if given:
            raise InputError(
                f"{', '.join(given)} conflict with the launch file, which sets them.",
                "Change the file, or pass --override; lengths' means and spreads may be given, and --pin sets "
                "what a launch file cannot say (e.g. vllm_engine, vllm_memory).",
            )
        model_name, cluster, workload, knobs, notes, launch_target, hf_overrides = _launch(
            from_verl, from_trl, override, model, gpus, host_bytes, length_values, script_args=script_args
        )
        if pin:  # on top of the launch: what its file cannot express (the vLLM version's behaviour, ...)
            knobs = Knobs(**{**knobs.model_dump(), **parse_pins(pin)})
        inputs = _inputs(model_name, cluster, workload, target or launch_target, headroom_gib)
        inputs, model_notes = _with_hf_overrides(inputs, hf_overrides)
        notes += model_notes
        inputs, note = _calibrate(inputs, calibration, no_calibration)
        notes += [note] if note else []
        plan, changes = _evaluate_launch(inputs, knobs, trials or DEFAULT_TRIALS, seed)
        notes += changes
        pins = {k: getattr(knobs, k) for k in KNOB_KEYS}
    else:
        if not model or not gpus:
            missing = " and ".join(f for f, v in (("--model", model), ("--gpus", gpus)) if not v)
            raise InputError(
                f"{missing} {'is' if ' and ' not in missing else 'are'} required.",
                "Example: grpo-plan --model qwen-32b --gpus 8xA100-80G (see --list-models, --help).",
            )
        # --emit verl plans for verl's memory behaviour; PPO and --compare for verl, the executor running both
        chosen_target = target or emit or ("verl" if (compare or algorithm == "ppo") else "grpo-pilot")
        pins = parse_pins(pin)
        workload = make_workload(
            prompts_per_step=prompts_per_step or 1024,
            mini_batch_prompts=mini_batch or 256,
            n=n or 5,
            use_kl_loss=True if kl is None else kl,
            adapter=adapter,
            algorithm=algorithm or "grpo",
            **length_values,
        )
        from grpo_pilot.planner.make_plan import make_plan

        inputs = _inputs(model, _cluster(gpus, host_bytes), workload, chosen_target, headroom_gib)
        inputs, note = _calibrate(inputs, calibration, no_calibration)
        notes += [note] if note else []
        plan = make_plan(inputs, pins=pins, trials=trials or DEFAULT_TRIALS, seed=seed)
        if not plan.fits:
            check_pins(inputs, pins)
        if adapter is not None and not adapters_modelled(plan):
            notes.append(
                f"adapters ({adapter.describe()}) are carried in plan.json for grpo-run, but this estimate is full "
                "fine-tuning's: grpo-plan does not model adapter memory or time yet"
            )
        if compare:
            other = inputs.model_copy(update={"workload": workload.model_copy(update={"algorithm": compare})})
            compared = make_plan(other, pins=pins, trials=trials or DEFAULT_TRIALS, seed=seed)
    report = None
    if verify:
        from grpo_pilot.cli.plan_verify import verify as verify_plan

        report = verify_plan(plan)
    if json_out:
        if report is None:
            typer.echo(plan.to_json(), nl=False)
        else:
            from grpo_pilot.cli.plan_verify import plan_json_with_verify

            typer.echo(plan_json_with_verify(plan.to_json(), report), nl=False)
    else:
        render(plan, console, pins, notes)
        if compare:
            from grpo_pilot.cli.plan_compare import render_compare

            render_compare(plan, compared, console)
        if report is not None:
            from grpo_pilot.cli.plan_verify import render_verify

            render_verify(report, console)
    if plot:
        from grpo_pilot.memory_plot import write_memory_plot

        written = write_memory_plot(plan, plot)
        if not json_out:
            console.print(f"memory plot written to {written}")
    if not plan.fits:
        raise _infeasible(plan, written=bool(out))
    if out:
        path = save_plan(plan, out)
        if not json_out:
            console.print(f"plan written to {path}")
    if emit:
        from grpo_pilot.planner.export import trl_config_text, verl_command

        typer.echo(verl_command(plan) if emit == "verl" else trl_config_text(plan), nl=False)
