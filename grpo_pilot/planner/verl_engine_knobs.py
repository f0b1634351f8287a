"""The engine-side knobs a verl launch's version implies: the trainer's caching allocator and cache releases, and
the max_num_seqs its vLLM engine really ran with (`verl_versions.CHANGES`; read by from_verl.py)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from grpo_pilot.hardware.gpus import GPUSpec
from grpo_pilot.planner.verl_versions import VERSION_WORD, VerlWindow, change_named, vllm_default_seqs_of

ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"  # c10 CUDAAllocatorConfig reads it at the first CUDA allocation
EXPANDABLE_ENV = f"{ALLOC_CONF_VAR}=expandable_segments:True"
EXPANDABLE_SEGMENTS_TRUE = re.compile(r"(^|,)\s*expandable_segments\s*:\s*true\s*(,|$)", re.I)


# the changes that set each knob, per backend, oldest first (verl_versions.CHANGES; memory/releases.py)
RELEASE_CHANGES = {False: ("release_each_call", "sync_release"), True: ("megatron_sync_release",)}
ALLOCATOR_CHANGES = {False: ("expandable_segments",), True: ("megatron_expandable_segments",)}


def allocator_knobs(env: Mapping[str, str], win: VerlWindow, notes: list[str], *, megatron: bool) -> dict[str, Any]:
    """The trainer's allocator setting and cache releases of the launch's verl (`verl_versions.CHANGES`): for the
    FSDP workers expandable segments since #3020 (or where PYTORCH_CUDA_ALLOC_CONF sets them), a release after every
    worker method before #556, none after the weight sync before #1081; for the Megatron workers expandable
    segments since #3181 and a release after the sync since #2678 (their own per-method releases:
    memory/releases.py); where the window straddles a change, today's behaviour with a note."""
    conf = str(env.get(ALLOC_CONF_VAR, ""))
    env_expandable = EXPANDABLE_SEGMENTS_TRUE.search(conf) is not None
    out = {"release_cache": _era_value("release_cache", "verl", RELEASE_CHANGES[megatron], win=win, notes=notes)}
    allocator_changes = ALLOCATOR_CHANGES[megatron]
    if env_expandable:
        if win.side(change_named(allocator_changes[0])) == "before":
            notes.append(f"{ALLOC_CONF_VAR}={conf[:60]}: the trainer runs expandable segments")
        out["allocator"] = "expandable"
    else:
        out["allocator"] = _era_value("allocator", "expandable", allocator_changes, win=win, notes=notes)
    return out


def _era_value(knob: str, today: str, names: tuple[str, ...], *, win: VerlWindow, notes: list[str]) -> str:
    """The value of `knob` in the launch's verl: the old value of the oldest change the window lies before, else
    today's; a window that straddles a change gets the newer side's value, with a note."""
    changes = [change_named(name) for name in names]
    first_before = next((c for c in changes if win.side(c) == "before"), None)
    planned = today if first_before is None else str(first_before.before)
    for change in changes:
        if change is first_before:
            notes.append(f"{knob} = {planned}: that verl's behaviour ({change.source} changed it): {change.what}")
            break
        if win.side(change) is None and (win.after is None or win.after < change.at):
            notes.append(
                f"{knob} planned as {planned}; verl before {change.at[:10]} ({change.source}): "
                f"{change.what} — if the launch's verl is older, pass --override {VERSION_WORD}=<release or date>"
                + (f" (or set {EXPANDABLE_ENV})" if knob == "allocator" else "")
            )
    return planned


def engine_max_num_seqs(
    knobs: Mapping[str, Any], win: VerlWindow, notes: list[str], *, installed: str, gpu: GPUSpec | None
) -> int:
    """The max_num_seqs the vLLM engine runs with: rollout.max_num_seqs since verl passes it (#2960), vLLM's own
    default before (`verl_versions.CHANGES` "max_num_seqs_passed"; `vllm_default_seqs_of` for `installed`, the
    VLLM_VERSION word, and `gpu`); where the window straddles, the key with a note."""
    value = int(knobs["max_num_seqs"])
    if knobs["rollout_backend"] != "vllm":
        return value
    change = change_named("max_num_seqs_passed")
    side = win.side(change)
    if side == "after" or (side is None and win.after is not None and win.after >= change.at):
        return value
    engine_default, caveat = vllm_default_seqs_of(str(knobs["vllm_engine"]), win, installed, gpu)
    if side == "before":
        notes.append(f"max_num_seqs = {engine_default}: vLLM's default, not the key's {value} ({change.what})")
        if caveat:
            notes.append(caveat)
        return engine_default
    if value != engine_default:
        notes.append(
            f"max_num_seqs planned at the key's {value}; verl before {change.at[:10]} ({change.source}): "
            f"{change.what} ({engine_default}) — if the launch's verl is older, pass --override "
            f"{VERSION_WORD}=<release or date>"
        )
    return value
