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
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from grpo_pilot.engine.data.callables import DEFAULT_USER_CODE_TIMEOUT_S
from grpo_pilot.errors import InputError
from grpo_pilot.inputs import JsonProblem, decode_text, parse_json, read_input_bytes
from grpo_pilot.models import Frozen

# Upper bounds on settings that would otherwise pass as positive numbers and then wreck the run or the
# process: AdamW learning rates are ~1e-7..1e-3 (verl 1e-6; the tiny CPU example 2e-3), so above 1 every
# step diverges; torch.set_num_threads(100000) makes OpenMP spawn 100k threads and crash (issue 10).
MAX_LR = 1.0
MAX_THREADS = 1024

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
    steps: int = Field(default=100, ge=1, description="GRPO steps (rollout batches) to run.")
    lr: float = Field(default=1e-6, gt=0.0, le=MAX_LR, description="AdamW learning rate (verl actor.optim.lr 1e-6).")
    weight_decay: float = Field(default=0.01, ge=0.0, description="AdamW weight decay (verl 0.01).")
    adam_beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(default=0.999, ge=0.0, lt=1.0)
    max_grad_norm: float = Field(default=1.0, gt=0.0, description="Global grad-norm clip (verl actor.grad_clip 1.0).")
    mini_batch_prompts: int | None = Field(
        default=None, ge=1, description="Prompts per optimizer step; None = plan workload."
    )
    ppo_epochs: int | None = Field(
        default=None, ge=1, description="Passes over each rollout batch; None = plan workload."
    )

    # sampling
    rollout_backend: Literal["hf", "vllm"] | None = Field(
        default=None, description="Rollout engine; None = the plan's knob."
    )
    temperature: float = Field(
        default=1.0, gt=0.0, description="Sampling temperature; log-probs divide logits by it too."
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="Sample from the k most likely tokens (before top_p); 0 = off.")
    max_new_tokens: int | None = Field(default=None, ge=1, description="Response cap; None = plan response_len_tokens.")
    stop: tuple[str, ...] = Field(default=(), description="Stop strings (EOS always stops).")
    hf_decode: Literal["auto", "eager", "static", "cuda_graph"] = Field(
        default="auto",
        description="hf rollout decode loop: eager (per-token host checks, finished rows compacted), static "
        "(preallocated cache, fixed shapes, bf16 weight copy on CUDA, no per-token host sync), cuda_graph (static, "
        "each step replayed as a CUDA graph; CUDA only); auto = cuda_graph on CUDA, eager on CPU.",
    )

    # loss (GRPO family; grpo.md)
    adv_scale: Literal["group", "batch", "none"] = Field(
        default="group", description="Advantage std normalisation: group (GRPO), batch, none (Dr. GRPO)."
    )
    adv_eps: float = Field(default=1e-6, gt=0.0, description="Advantage eps (verl 1e-6, TRL 1e-4).")
    loss_agg_mode: LossAggMode = Field(default="token-mean", description="verl loss_agg_mode.")
    loss_scale_len: int | None = Field(
        default=None, ge=1, description="Constant length for seq-mean-token-sum-norm; None = max_new_tokens."
    )
    clip_low: float = Field(default=0.2, ge=0.0, description="PPO clip epsilon low (verl clip_ratio_low).")
    clip_high: float = Field(default=0.2, ge=0.0, description="PPO clip epsilon high (DAPO clip-higher uses 0.28).")
    clip_c: float | None = Field(
        default=3.0, gt=1.0, description="Dual-clip constant (verl clip_ratio_c 3.0); None disables."
    )
    ratio_level: Literal["token", "sequence"] = Field(default="token", description="'sequence' = GSPO sequence ratio.")
    kl_coef: float | None = Field(
        default=None, ge=0.0, description="KL loss coefficient; None = 0.001 when the plan has use_kl_loss, else 0."
    )
    kl_type: Literal["k1", "k2", "k3", "low_var_kl"] = Field(
        default="k3", description="KL estimator (k3 = verl low_var_kl)."
    )
    entropy_coeff: float | None = Field(
        default=None, ge=0.0, description="Entropy bonus; None = plan workload.entropy_coeff."
    )

    # DAPO (arXiv 2503.14476)
    dynamic_sampling: bool = Field(
        default=False, description="Drop groups whose rewards are all equal and refill with new prompts."
    )
    max_refill_rounds: int = Field(
        default=3, ge=0, description="Extra rollout rounds allowed per step to refill dropped groups."
    )
    overlong_buffer_tokens: int = Field(
        default=0, ge=0, description="DAPO soft overlong penalty cache length L_cache (0 = off)."
    )
    overlong_penalty_factor: float = Field(default=1.0, ge=0.0, description="Weight of the soft overlong penalty.")
    mask_truncated: bool = Field(default=False, description="DAPO overlong filtering: truncated responses get no loss.")

    # run management
    output_dir: str = Field(default="runs/grpo", description="Metrics, profile.json and checkpoints go here.")
    seed: int = Field(default=0, ge=0, description="Seeds model init, data order and sampling.")
    checkpoint: bool = Field(
        default=True,
        description="Write checkpoints (false: never, not even at the last step; such a run cannot be resumed).",
    )
    checkpoint_every: int = Field(default=50, ge=0, description="Checkpoint every N steps (0 = only at the end).")
    keep_checkpoints: int = Field(default=2, ge=1, description="Newest checkpoints kept on disk.")
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
    allocator: Literal["expandable", "default"] = Field(
        default="expandable",
        description="CUDA caching allocator: expandable (expandable_segments:True) or default (the environment's "
        "PYTORCH_CUDA_ALLOC_CONF as it is); no-op on CPU. engine/device_memory.py.",
    )
    release_cache: Literal["verl", "after_rollout", "never"] = Field(
        default="verl",
        description="Where torch.cuda.empty_cache() runs: verl (before and after the weight sync, after the rollout), "
        "after_rollout, or never; no-op on CPU.",
    )
    memory_cap_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Per-worker memory cap: CUDA allocator fraction, or live tensor bytes on CPU; past it the run "
        "fails with an out-of-memory error (failure.json kind 'oom').",
    )

    def hash(self, plan_json: str) -> str:
        """Identity of the training computation (plan + every setting that changes a step); resume checks it."""
        fields = {k: v for k, v in self.model_dump(mode="json").items() if k not in NOT_HASHED}
        blob = json.dumps({"plan": json.loads(plan_json), "config": fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def capped_threads(threads: int) -> int:
    """`threads` capped to this machine's CPUs (more threads than cores only slow torch down)."""
    return max(1, min(threads, os.cpu_count() or 1))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Raw values from a TOML (`.toml`) or JSON file; a `[run]` table, if present, is the config."""
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
    return dict(raw.get("run", raw)) if isinstance(raw.get("run"), dict) else raw


def build_run_config(
    file_values: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None, *, source: str = "run config"
) -> RunConfig:
    """Merge file values with overrides (flags; `None` values are ignored) into a validated `RunConfig`."""
    merged = dict(file_values or {})
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if isinstance(merged.get("stop"), str):
        merged["stop"] = (merged["stop"],)
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
        raise InputError(
            f"Bad value for '{where}' in the {source}: {first['msg']} (got {got[:80]}).",
            "Fix that setting; see `grpo-run --help`.",
        ) from None


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
