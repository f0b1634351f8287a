"""`grpo-plan` inputs: the workload from flags, a lengths file or a dataset, and a verl / TRL launch.

Side effects live here (reading files, tokenizing a dataset through the engine's own loader); the
planner modules these call are pure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grpo_pilot.errors import InputError
from grpo_pilot.hardware.cluster import Cluster, parse_cluster
from grpo_pilot.hardware.gpus import lookup_gpu
from grpo_pilot.inputs import read_input_text
from grpo_pilot.planner.config import Workload
from grpo_pilot.planner.lengths_file import LengthStats, read_lengths_jsonl, stats_of, workload_fields

DEFAULT_PROMPT_LEN = 512
DEFAULT_RESPONSE_LEN = 1024


def make_workload(**fields: Any) -> Workload:
    """`Workload(**fields)` with a one-paragraph error naming the flag."""
    try:
        return Workload(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "workload"
        raise InputError(
            f"Bad workload ({where}): {first['msg']}.",
            "Check --prompts-per-step, --mini-batch, --n, --prompt-len(-mean), --response-len(-mean) and the "
            "lengths file.",
        ) from None


def dataset_prompt_stats(data: str, tokenizer_dir: str) -> LengthStats:
    """Prompt lengths of a JSONL dataset, rendered and tokenized as `grpo-run` does (needs the engine extra)."""
    try:
        from grpo_pilot.engine.data import load_prompts, render_prompt
        from grpo_pilot.engine.model_factory import build_tokenizer
    except ImportError as exc:
        raise InputError(
            f"--lengths-from needs the engine extra (torch, transformers): {exc}.",
            'Install it (pip install ".[engine]"), or give --prompt-len-mean instead.',
        ) from None
    if not Path(tokenizer_dir).exists():
        raise InputError(f"No tokenizer directory at '{tokenizer_dir}'.", "Pass --tokenizer DIR (a model directory).")
    prompts = load_prompts(data)
    tokenizer = build_tokenizer(tokenizer_dir)
    lengths = [len(tokenizer(render_prompt(r, tokenizer))["input_ids"]) for r in prompts.records]
    return stats_of(lengths)


def length_fields(
    *,
    prompt_len: int | None,
    response_len: int | None,
    prompt_len_mean: float | None,
    response_len_mean: float | None,
    prompt_len_std: float | None,
    response_len_std: float | None,
    lengths: str | None,
    lengths_from: str | None,
    tokenizer: str | None,
) -> dict[str, Any]:
    """Workload length fields from the flags (explicit flags win over what a file says; which of --lengths and
    --lengths-from may be given together is `plan_flags.RULES`')."""
    out: dict[str, Any] = {}
    if lengths:
        out = workload_fields(read_lengths_jsonl(lengths), prompt_len, response_len, Path(lengths).name)
    elif lengths_from:
        stats = dataset_prompt_stats(lengths_from, str(tokenizer))
        out = workload_fields(stats, prompt_len, response_len, f"{Path(lengths_from).name} prompts")
    out.setdefault("prompt_len_tokens", prompt_len or DEFAULT_PROMPT_LEN)
    out.setdefault("response_len_tokens", response_len or DEFAULT_RESPONSE_LEN)
    for key, value in (
        ("prompt_len_mean_tokens", prompt_len_mean),
        ("response_len_mean_tokens", response_len_mean),
        ("prompt_len_std_tokens", prompt_len_std),
        ("response_len_std_tokens", response_len_std),
    ):
        if value is not None:
            out[key] = value
    return out


def launch_cluster(gpus: str | None, num_nodes: int, gpus_per_node: int, host_bytes: int | None) -> Cluster:
    """The cluster a verl script names (nodes × GPUs per node) with the GPU type from --gpus
    (`--gpus H800`, or a full `2xH800` that must agree with the script)."""
    if not gpus:
        raise InputError(
            f"The script runs {num_nodes} node(s) × {gpus_per_node} GPUs but does not say which GPU.",
            "Pass --gpus NAME (e.g. --gpus H800) or the full layout (--gpus 2xH800).",
        )
    gpu = lookup_gpu(gpus)
    if gpu is not None:
        return parse_cluster(f"{num_nodes}x{gpus_per_node}x{gpu.name}", host_bytes)
    cluster = parse_cluster(gpus, host_bytes)
    if (cluster.num_nodes, cluster.gpus_per_node) != (num_nodes, gpus_per_node):
        raise InputError(
            f"--gpus {gpus} is {cluster.num_nodes} × {cluster.gpus_per_node} but the script runs "
            f"{num_nodes} node(s) × {gpus_per_node} GPUs (trainer.nnodes, trainer.n_gpus_per_node).",
            f"Pass only the GPU name (--gpus {cluster.gpu.name}) or override the script's counts.",
        )
    return cluster


def read_text(path: str, what: str) -> str:
    """A launch file's text: a regular UTF-8 file (inputs.py refuses pipes, devices, binary files)."""
    return read_input_text(path, what, hint="Check the path.")
