"""`grpo-plan`'s flags (`PlanArgs`: one field per flag) and the rules between them (`RULES`: one row per rule).

A new flag is a field of `PlanArgs`; a flag that conflicts with another or needs one is a row of `RULES`
(checked in order, before any work: the first broken rule is the error, exit 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from grpo_pilot.cli.options import Rule, choice, exclusive, flag, flag_name, given, requires
from grpo_pilot.planner.config import KNOB_KEYS
from grpo_pilot.planner.search import DEFAULT_TRIALS

TARGETS = ("grpo-pilot", "verl", "trl")
EMITS = ("verl", "trl")
ALGORITHMS = ("grpo", "ppo")
MAX_SEED = 2**32 - 1  # numpy's legacy seeding range (Optuna's samplers seed numpy's RandomState)


@dataclass(frozen=True)
class PlanArgs:
    """The flags of one `grpo-plan` command line."""

    model: Optional[str] = flag(
        None,
        "--model",
        "-m",
        help="Bundled alias (qwen-32b, llama-8b, ...), hub id of a bundled model, or a path to an HF config.json "
        "/ model dir.",
    )
    gpus: Optional[str] = flag(
        None,
        "--gpus",
        "-g",
        help="Cluster: 8xA100-80G, 8xH100, 2x8xH100-80G, 16xH20, 1xcpu, or 'local'. With --from-verl the GPU name "
        "alone (H800): the script gives the counts.",
    )
    host_ram: Optional[str] = flag(None, "--host-ram", help="Host RAM per node, e.g. 1TiB, 512GiB (1 TiB).")
    target: Optional[str] = flag(
        None,
        "--target",
        help="Executor the estimate models: grpo-pilot, verl or trl (default: the --emit framework or the launch "
        "file's, else grpo-pilot).",
    )
    prompts_per_step: Optional[int] = flag(
        None, "--prompts-per-step", min=1, help="Prompts per step (verl data.train_batch_size; 1024)."
    )
    mini_batch: Optional[int] = flag(
        None, "--mini-batch", min=1, help="Prompts per PPO mini-batch, one optimizer step each (256)."
    )
    n: Optional[int] = flag(None, "--n", min=1, help="Responses per prompt (group size; 5).")
    prompt_len: Optional[int] = flag(None, "--prompt-len", min=1, help="Longest prompt, tokens (512).")
    response_len: Optional[int] = flag(None, "--response-len", min=1, help="Longest response, tokens (1024).")
    prompt_len_mean: Optional[float] = flag(
        None, "--prompt-len-mean", min=1, help="Mean prompt length, tokens (default: the maximum)."
    )
    response_len_mean: Optional[float] = flag(
        None, "--response-len-mean", min=1, help="Mean response length, tokens (default: the maximum)."
    )
    prompt_len_std: Optional[float] = flag(
        None, "--prompt-len-std", min=0, help="Standard deviation of prompt lengths (default: bounded from mean/max)."
    )
    response_len_std: Optional[float] = flag(
        None, "--response-len-std", min=0, help="Standard deviation of response lengths (default: bounded)."
    )
    lengths: Optional[str] = flag(
        None, "--lengths", help="JSONL of {prompt_tokens, response_tokens} per sample (grpo-run's lengths.jsonl)."
    )
    lengths_from: Optional[str] = flag(
        None, "--lengths-from", help="A JSONL dataset whose prompts are measured (needs --tokenizer and the engine)."
    )
    tokenizer: Optional[str] = flag(None, "--tokenizer", help="Tokenizer / model directory for --lengths-from.")
    headroom_gib: Optional[float] = flag(
        None, "--headroom-gib", min=0, help="GiB kept free on every GPU (default 5% of the device)."
    )
    kl: Optional[bool] = flag(None, "--kl/--no-kl", help="KL loss against a frozen reference model (on).")
    algorithm: Optional[str] = flag(
        None,
        "--algorithm",
        help="grpo (default: group-relative advantages, no critic) or ppo (GAE with a critic: verl "
        "adv_estimator=gae; planned for --target verl, the executor that runs it).",
    )
    compare: Optional[str] = flag(
        None,
        "--compare",
        help="Also plan the other algorithm (grpo or ppo) for the same model, cluster and workload and print "
        "both side by side per phase (memory and time); the target defaults to verl, which runs both.",
    )
    from_verl: Optional[str] = flag(
        None, "--from-verl", help="Evaluate a verl launch script (or a file of Hydra overrides) exactly as given."
    )
    from_trl: Optional[str] = flag(
        None, "--from-trl", help="Evaluate a TRL GRPOConfig YAML (or an Axolotl GRPO config) exactly as given."
    )
    override: list[str] = flag(
        [],
        "--override",
        help="With --from-verl: a Hydra override applied after the script (key.path=value, ~key.path), an "
        "environment variable set before it (NAME=value, e.g. VLLM_USE_V1=0), or VERL_VERSION=<release or date> "
        "for the verl the launch runs on (its defaults and batch semantics). With --from-trl: a config key "
        "(key=value, e.g. num_processes=8). Repeatable.",
    )
    script_args: Optional[str] = flag(
        None,
        "--script-args",
        help="With --from-verl: the arguments the launch script is run with, as one string "
        "(e.g. '--model_name Qwen2.5-7B --max_response_length 8192'): its $1 $2 ... and its own argument loop.",
    )
    trials: int = flag(DEFAULT_TRIALS, "--trials", min=1, help="Optuna sampler trials before the local refinement.")
    seed: int = flag(0, "--seed", help=f"Sampler seed, 0 to {MAX_SEED} (same inputs + seed = same plan).")
    pin: list[str] = flag([], "--pin", help=f"Fix a knob, KEY=VALUE (repeatable). Keys: {', '.join(KNOB_KEYS)}.")
    json_out: bool = flag(False, "--json", help="Print only the plan JSON on stdout.")
    out: Optional[str] = flag(None, "--out", "-o", help="Write plan.json here (atomically; only when the plan fits).")
    emit: Optional[str] = flag(
        None,
        "--emit",
        help="Print only the run configuration for 'verl' (a shell script) or 'trl' (Python) on stdout; the "
        "plan's tables go to stderr.",
    )
    calibration: Optional[str] = flag(
        None,
        "--calibration",
        help="Calibration file (grpo-tune's calibration.json) whose measured constants the estimate uses. "
        "Default: $GRPO_PILOT_CALIBRATION_DIR/<GPU>.json (~/.cache/grpo-pilot/calibration) when present.",
    )
    no_calibration: bool = flag(
        False, "--no-calibration", help="Analytic constants only: ignore the default calibration file."
    )
    plot: Optional[str] = flag(
        None,
        "--plot",
        help="Write a PNG of memory per phase (stacked items) against usable memory (matplotlib); the name must end "
        "in .png.",
    )
    list_models: bool = flag(False, "--list-models", help="List bundled models and exit.")
    lora_rank: Optional[int] = flag(
        None, "--lora-rank", min=1, help="Train LoRA adapters of rank R on a frozen base (grpo-run: peft)."
    )
    lora_alpha: Optional[float] = flag(None, "--lora-alpha", min=0, help="LoRA alpha (peft default 8).")
    lora_targets: str = flag(
        "all-linear", "--lora-targets", help="Adapted modules: all-linear (every linear but the head) or q_proj,v_proj."
    )
    quantize_base: Optional[str] = flag(
        None, "--quantize-base", help="With --lora-rank: load the base 4bit (NF4, QLoRA) or 8bit (bitsandbytes, CUDA)."
    )
    verify: bool = flag(
        False,
        "--verify",
        help="Also trace the plan's update and log-prob phases through the engine's own actor on fake tensors "
        "(no GPU, seconds) and print traced vs analytic bytes per item (needs the engine extra).",
    )

    @property
    def launch(self) -> Optional[str]:
        """The launch file (a verl script or a TRL config), if one is evaluated."""
        return self.from_verl or self.from_trl

    @property
    def adapter_flags(self) -> bool:
        """Whether any of --lora-rank / --lora-alpha / --lora-targets / --quantize-base was given."""
        return any(given(v) for v in (self.lora_rank, self.lora_alpha, self.quantize_base)) or (
            self.lora_targets != "all-linear"
        )


# workload flags a launch file sets itself
LAUNCH_SETS = ("prompts_per_step", "mini_batch", "n", "kl", "prompt_len", "response_len", "algorithm")


def _launch_conflicts(a: PlanArgs) -> list[str]:
    return [flag_name(PlanArgs, f) for f in LAUNCH_SETS if getattr(a, f) is not None] if a.launch else []


def _missing_model_or_gpus(a: PlanArgs) -> str:
    missing = [flag_name(PlanArgs, f) for f in ("model", "gpus") if not getattr(a, f)]
    return f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required."


RULES: tuple[Rule, ...] = (
    choice(PlanArgs, "target", TARGETS),
    exclusive(PlanArgs, "from_verl", "from_trl", why="both name the configuration"),
    choice(PlanArgs, "emit", EMITS),
    exclusive(
        PlanArgs,
        "emit",
        "json_out",
        why="both want stdout",
        hint="Use --json --out plan.json, then run again with --emit.",
    ),
    requires(
        PlanArgs,
        "script_args",
        ["from_verl"],
        why="applies to a --from-verl launch script",
        hint="Add --from-verl SCRIPT.",
    ),
    requires(
        PlanArgs,
        "override",
        ["from_verl", "from_trl"],
        why="applies to a --from-verl or --from-trl file",
        hint="Use --pin KEY=VALUE for knobs.",
    ),
    choice(PlanArgs, "algorithm", ALGORITHMS),
    choice(PlanArgs, "compare", ALGORITHMS),
    Rule(
        lambda a: a.compare is not None and (bool(a.launch) or a.json_out or a.compare == (a.algorithm or "grpo")),
        lambda a: "--compare plans the other algorithm beside --algorithm from --model/--gpus; it prints tables only.",
        "Drop --from-verl/--from-trl and --json, and compare grpo with ppo.",
    ),
    exclusive(PlanArgs, "calibration", "no_calibration", why="contradict each other"),
    exclusive(PlanArgs, "lengths", "lengths_from", why="both set the lengths"),
    Rule(
        lambda a: given(a.lengths_from) and not a.tokenizer,
        lambda a: "--lengths-from needs --tokenizer DIR to count tokens.",
        "Add --tokenizer path/to/model.",
    ),
    Rule(
        lambda a: not 0 <= a.seed <= MAX_SEED,
        lambda a: f"--seed {a.seed} is outside 0 to {MAX_SEED} (the samplers' seed range).",
        "Give a seed in that range.",
    ),
    Rule(
        lambda a: a.headroom_gib is not None and not math.isfinite(a.headroom_gib),
        lambda a: f"--headroom-gib {a.headroom_gib} is not a finite number of GiB.",
        "Give the GiB to keep free on every GPU, e.g. --headroom-gib 4.",
    ),
    Rule(
        lambda a: given(a.plot) and not a.plot.lower().endswith(".png"),
        lambda a: f"--plot '{a.plot}' does not end in .png; the memory plot is a PNG image.",
        "Name the file *.png.",
    ),
    Rule(
        lambda a: bool(_launch_conflicts(a)),
        lambda a: f"{', '.join(_launch_conflicts(a))} conflict with the launch file, which sets them.",
        "Change the file, or pass --override; lengths' means and spreads may be given, and --pin sets what a launch "
        "file cannot say (e.g. vllm_engine, vllm_memory).",
    ),
    requires(
        PlanArgs,
        "from_trl",
        ["gpus"],
        why="needs --gpus (a TRL config does not name the GPUs)",
        hint="e.g. --gpus 8xH100.",
    ),
    Rule(
        lambda a: bool(a.launch) and a.adapter_flags,
        lambda a: "--lora-* and --quantize-base conflict with a launch file.",
        "Set adapters in the launch.",
    ),
    Rule(
        lambda a: a.adapter_flags and a.lora_rank is None,
        lambda a: "--lora-alpha, --lora-targets and --quantize-base need --lora-rank.",
        "Add --lora-rank R.",
    ),
    Rule(
        lambda a: not a.launch and not (a.model and a.gpus),
        _missing_model_or_gpus,
        "Example: grpo-plan --model qwen-32b --gpus 8xA100-80G (see --list-models, --help).",
    ),
)
