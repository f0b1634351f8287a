"""Which verl a launch was written for, and what that verl did differently (for `from_verl.py`).

A launch does not name its verl, but its keys date it: verl composes its config with Hydra in struct
mode, so a plain `key=value` runs only on a verl whose `ppo_trainer.yaml` has the key, and `+key=value`
only on one that does not (Hydra refuses to add a key that exists). `KEY_EVIDENCE` lists keys whose
addition or removal (volcengine/verl, commit and PR) bounds the verl: the launch's keys give a window of
upstream commit times [after, before). `VERL_VERSION=<tag or date>` (an `--override` word) pins it;
`VLLM_VERSION=<version>` names the installed vLLM, which picks verl's rollout worker (`vllm_memory_of`).

`CHANGES` lists what changed at one upstream commit and changes memory or time; each is applied from the
window: the old behaviour when the whole window is before the change, today's when it is after, and
today's with a note (naming the override that restores the old one) when the window straddles it.
Times are committer times in UTC, `YYYY-MM-DDTHH:MM` (volcengine/verl history, read with `git log`).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, NamedTuple

from grpo_pilot.errors import InputError
from grpo_pilot.hardware.gpus import GPUSpec
from grpo_pilot.planner.vllm_defaults import (
    A100_RULE_FROM,
    DEVICE_RULE_FROM,
    V1_SMALL_DEVICE_MAX_NUM_SEQS,
    VLLM_DEFAULT_MAX_NUM_SEQS,
    device_gets_large_default,
    parse_vllm_version,
    vllm_default_max_num_seqs,
)

ARR = "actor_rollout_ref."
VERSION_WORD = "VERL_VERSION"  # an --override word that pins the verl release (verl_versions.parse_pin)
VLLM_VERSION_WORD = "VLLM_VERSION"  # an --override word naming the installed vLLM (e.g. 0.6.3)
BEFORE_V1_DEFAULT = re.compile(r"^0\.[0-7]\.")  # vLLM 0.8.0 made V1 the default engine (0.7: VLLM_USE_V1=1 opt-in)
_VENDORED_VLLM = re.compile(r"^0\.(3\.1|4\.2|5\.4|6\.3)(\+.*)?$")  # verl/third_party/vllm/__init__.py@v0.3.0.post1


class Change(NamedTuple):
    name: str
    at: str  # upstream committer time (UTC) of the change
    source: str  # commit and PR
    key: str | None  # the verl key whose default changed (None: a semantic of several keys)
    before: Any
    after: Any
    what: str


CHANGES: tuple[Change, ...] = (
    Change(
        "ref_cpu_offload",
        "2025-01-24T09:29",
        "verl fefca4172 (#121)",
        None,
        False,
        True,
        "the reference model was a plain FSDP module on the GPU unless ref.fsdp_config.param_offload moved it "
        "off at init (fsdp_workers.py@fefca4172^ init_model: offload_fsdp_param_and_grad), and ray_trainer's "
        "init_workers builds it before the actor and its rollout, so the engine measured beside it; since, "
        "_build_model_optimizer wraps the reference in FSDP CPUOffload(offload_params=True) whatever the key "
        "(FSDP2's CPUOffloadPolicy from db84a4007, #1026)",
    ),
    Change(
        "micro_batch_times_n",
        "2025-01-27T03:26",
        "verl f2a76acd9 (#136)",
        None,
        True,
        False,
        "the global micro-batches (actor.ppo_micro_batch_size, rollout/ref log_prob_micro_batch_size) were "
        "divided by world/SP and multiplied by rollout.n (fsdp_workers.py@f2a76acd9^ lines 121-133; "
        "Unakar/Logic-RL@fb31708 verl/workers/fsdp_workers.py lines 97-109); since, divided only",
    ),
    Change(
        "gradient_checkpointing",
        "2025-01-27T23:39",
        "verl 9fca71d2c (#147)",
        ARR + "model.enable_gradient_checkpointing",
        False,
        True,
        "model.enable_gradient_checkpointing defaulted to False (ppo_trainer.yaml@v0.1 line 19)",
    ),
    Change(
        "critic_gradient_checkpointing",
        "2025-01-27T23:39",
        "verl 9fca71d2c (#147)",
        "critic.model.enable_gradient_checkpointing",
        False,
        True,
        "critic.model.enable_gradient_checkpointing defaulted to False (ppo_trainer.yaml@9fca71d2c^ line 103)",
    ),
    Change(
        "vllm_spmd",
        "2025-02-14T16:17",
        "verl f8b4d0857 (#209)",
        None,
        "free",
        "instance",
        "the rollout ran verl's vendored vLLM worker (verl/third_party/vllm/vllm_v_0_6_3/worker.py@v0.1 "
        "determine_num_available_blocks, likewise for vLLM 0.3.1/0.4.2/0.5.4: the only vLLM versions that verl "
        "took), whose KV cache is gpu_memory_utilization × the memory free after its profile run "
        "(vllm_memory=free); since, vLLM >= 0.7 runs its own worker (0.7-0.8 V1: vllm_memory=device) while an "
        "installed vLLM 0.6.3 still takes the vendored one until 52065c640 (#2257)",
    ),
    Change(
        "release_each_call",
        "2025-03-12T13:07",
        "verl 51a5ff999 (#556)",
        None,
        "each_phase",
        "before_sync_after_rollout",
        "every FSDP worker method ended with torch.cuda.empty_cache() (fsdp_workers.py@v0.2: update_actor, "
        "generate_sequences, compute_log_prob, compute_ref_log_prob, update_critic), so no actor phase inherited "
        "another's cached blocks; since (with 3fc3e2b74, #575), the cache is emptied before the weight sync and "
        "after the rollout (the sharding manager's __enter__ and __exit__) and where an offload empties it "
        "(planner/memory/releases.py); the Megatron workers kept theirs",
    ),
    Change(
        "mini_batch_check",
        "2025-03-14T11:15",
        "verl 4d27461d0 (#559)",
        None,
        False,
        True,
        "a ppo_mini_batch_size above data.train_batch_size was legal: dp_actor.update_policy's "
        "batch.split(ppo_mini_batch_size) gives one mini-batch (Unakar/Logic-RL@fb31708 "
        "verl/workers/actor/dp_actor.py line 218); since, ray_trainer asserts train_batch_size >= "
        "ppo_mini_batch_size",
    ),
    Change(
        "sync_release",
        "2025-04-15T17:11",
        "verl 588404196 (#1081)",
        None,
        "before_sync_after_rollout",
        "verl",
        "the FSDP sharding manager emptied the cache before the weight sync (fsdp_vllm.py@3fc3e2b74 __enter__) but "
        "not after it, so the rollout held the sync's cached blocks unless param_offload's offload_fsdp_model_to_cpu "
        "emptied it (fsdp_workers.py@3fc3e2b74 generate_sequences); since, __enter__ empties it after loading the "
        "weights (vLLM >= 0.8.3 from 550bbbbff, #987; every vLLM >= 0.7 from #1081)",
    ),
    Change(
        "entropy",
        "2025-04-17T09:35",
        "verl 25b0f2262 (#1100)",
        ARR + "actor.entropy_coeff",
        0.001,
        0.0,
        "actor.entropy_coeff defaulted to 0.001 (ppo_trainer.yaml@25b0f2262^; verl docs/algo/baseline.md note [2]) "
        "and the update always computed the entropy (dp_actor.py@25b0f2262^)",
    ),
    Change(
        "actor_offload_at_init",
        "2025-04-27T18:11",
        "verl 0fb0bedb7 (#1118)",
        None,
        False,
        True,
        "with actor.fsdp_config.param_offload, init_model moved only the actor's gradients off the GPU ('param is "
        "require during state_dict in sharding manager', fsdp_workers.py@v0.2; from 9db52329f (#284) nothing at "
        "all), so its parameters were resident when the rollout engine was built and measured the GPU; since, "
        "init_model offloads them (offload_fsdp_model_to_cpu) before _build_rollout",
    ),
    Change(
        "vllm_084_allowed",
        "2025-05-14T06:40",
        "verl 43782a24b (#1505)",
        None,
        "0.8.3",
        "0.8.5",
        "setup.py allowed vllm<=0.8.3 (<=0.8.2 before 64672aef3, #1186), whose V1 engine defaults max_num_seqs to "
        "1024 on every device; since, vllm<=0.8.5 (<=0.9.1 from d255783a0, #2747), whose default is 256 on a "
        "device under 70 GiB (planner/vllm_defaults.py)",
    ),
    Change(
        "megatron_sync_release",
        "2025-07-25T02:34",
        "verl dc8b5076c (#2678)",
        None,
        "after_rollout",
        "verl",
        "the Megatron sharding manager emptied the cache only in __exit__ after the rollout (megatron_vllm.py@"
        "cc8fca504), before the sync only through update_actor's own release, after it only where param_offload or "
        "optimizer_offload offloaded (megatron_workers.py@cc8fca504 generate_sequences); since, __enter__ calls "
        "aggressive_empty_cache before and after loading the weights (megatron_vllm.py@dc8b5076c; "
        "megatron_workers.py@b178a3cd5 rollout_mode)",
    ),
    Change(
        "enforce_eager",
        "2025-08-08T13:00",
        "verl ff6978c14 (#2956)",
        ARR + "rollout.enforce_eager",
        True,
        False,
        "rollout.enforce_eager defaulted to True (rollout.yaml@ff6978c14^ line 35): no CUDA graphs",
    ),
    Change(
        "max_num_seqs_passed",
        "2025-08-08T22:55",
        "verl beb624610 (#2960)",
        None,
        False,
        True,
        "rollout.max_num_seqs was not passed to vLLM (vllm_rollout_spmd.py@beb624610^ line 180 LLM(...), "
        "vllm_async_server.py likewise): the engine ran at vLLM's own default",
    ),
    Change(
        "expandable_segments",
        "2025-08-13T07:59",
        "verl e6843cc82 (#3020)",
        None,
        "default",
        "expandable",
        "the trainer ran PyTorch's default caching allocator (fixed cudaMalloc segments; verl sets no "
        "PYTORCH_CUDA_ALLOC_CONF); since, the FSDP workers switch expandable_segments on for training "
        "(sharding manager __exit__, later fsdp_workers.rollout_mode: utils/device.py set_expandable_segments)",
    ),
    Change(
        "megatron_expandable_segments",
        "2025-08-23T02:49",
        "verl bf56a2aa2 (#3181)",
        None,
        "default",
        "expandable",
        "the Megatron trainer ran PyTorch's default caching allocator (e6843cc82, #3020, switched only the FSDP "
        "sharding managers); since, megatron_vllm.py / megatron_sglang.py switch expandable_segments on for training "
        "in __exit__ (utils/device.py set_expandable_segments)",
    ),
    Change(
        "remove_padding",
        "2025-12-09T14:10",
        "verl 561752996 (#4461)",
        ARR + "model.use_remove_padding",
        False,
        True,
        "model.use_remove_padding defaulted to False (ppo_trainer.yaml since 569210e06 (#91)): every row padded",
    ),
)


class KeyEvidence(NamedTuple):
    suffix: str  # the override key ends with this
    added: tuple[str, str] | None  # (UTC time, source) of the commit that added it to ppo_trainer.yaml
    removed: tuple[str, str] | None  # ... that removed it


KEY_EVIDENCE: tuple[KeyEvidence, ...] = (
    KeyEvidence("model.use_remove_padding", ("2025-01-11T08:50", "569210e06 (#91)"), None),
    KeyEvidence("actor.ulysses_sequence_parallel_size", ("2025-01-18T04:21", "e8eb9e4ec (#109)"), None),
    KeyEvidence("actor.use_dynamic_bsz", ("2025-01-21T08:08", "54051c85c (#118)"), None),
    KeyEvidence("actor.ppo_max_token_len_per_gpu", ("2025-01-21T08:08", "54051c85c (#118)"), None),
    KeyEvidence("actor.use_kl_loss", ("2025-01-23T12:25", "cd52d8b35 (#124)"), None),
    KeyEvidence("actor.kl_loss_type", ("2025-01-23T12:25", "cd52d8b35 (#124)"), None),
    KeyEvidence("actor.ppo_micro_batch_size_per_gpu", ("2025-01-27T03:26", "f2a76acd9 (#136)"), None),
    KeyEvidence("log_prob_micro_batch_size_per_gpu", ("2025-01-27T03:26", "f2a76acd9 (#136)"), None),
    KeyEvidence("rollout.enable_chunked_prefill", ("2025-01-27T13:44", "695bdbb03 (#141)"), None),
    KeyEvidence("fsdp_config.grad_offload", None, ("2025-02-17T06:07", "9db52329f (#284)")),
    KeyEvidence("rollout.val_kwargs.", ("2025-03-13T02:40", "d5de9f4ce (#553)"), None),
    KeyEvidence("actor.use_torch_compile", ("2025-03-14T07:27", "545746904 (#554)"), None),
    KeyEvidence("trainer.log_val_generations", ("2025-03-30T15:44", "7fbf60919 (#822)"), None),
    KeyEvidence("trainer.val_before_train", ("2025-03-31T06:05", "64bddb68f"), None),
    KeyEvidence("algorithm.use_kl_in_reward", ("2025-04-01T02:14", "072fc9fee (#644)"), None),
    KeyEvidence("actor.clip_ratio_low", ("2025-04-03T21:46", "3a27a9864 (#623)"), None),
    KeyEvidence("actor.loss_agg_mode", ("2025-04-03T21:46", "3a27a9864 (#623)"), None),
    KeyEvidence("model.use_fused_kernels", ("2025-05-16T14:52", "eb077f66e (#1212)"), None),
    KeyEvidence("model.lora_rank", ("2025-05-28T17:53", "16f6c1ee6 (#1127)"), None),
    KeyEvidence("actor.entropy_checkpointing", ("2025-06-11T04:52", "0bd03d7c0 (#1927)"), None),
    KeyEvidence("rollout.cudagraph_capture_sizes", ("2025-08-08T13:00", "ff6978c14 (#2956)"), None),
)

# release tags (volcengine/verl, committer time of the tagged commit, UTC)
TAGS: dict[str, str] = {
    "0.1": "2024-12-11T16:13",
    "0.2": "2025-02-15T13:45",
    "0.2.0.post1": "2025-02-16T14:42",
    "0.2.0.post2": "2025-02-20T03:03",
    "0.3.0.post0": "2025-03-29T23:20",
    "0.3.0.post1": "2025-04-02T17:21",
    "0.4.0": "2025-06-06T23:52",
    "0.4.1": "2025-06-26T23:57",
    "0.5.0": "2025-07-23T17:57",
    "0.6.0": "2025-10-15T05:19",
    "0.6.1": "2025-11-14T02:42",
    "0.7.0": "2026-01-05T10:10",
}


class VerlWindow(NamedTuple):
    """Upstream commit times the launch's verl lies in: [after, before) (None: unbounded)."""

    after: str | None
    before: str | None
    reasons: tuple[str, ...]
    pinned: bool = False

    def side(self, change: Change) -> str | None:
        """'before' / 'after' the change, or None when the window straddles it (or is contradictory)."""
        if self.after is not None and self.before is not None and self.after >= self.before and not self.pinned:
            return None
        if self.before is not None and self.before <= change.at and not (self.pinned and self.before == change.at):
            return "before"
        if self.after is not None and self.after >= change.at:
            return "after"
        return None

    def describe(self) -> str:
        if self.pinned:
            return f"verl at {self.after} ({'; '.join(self.reasons)})"
        low = f"at or after {self.after}" if self.after else ""
        high = f"before {self.before}" if self.before else ""
        span = " and ".join(p for p in (low, high) if p) or "of unknown date"
        return f"verl {span} (from its keys: {'; '.join(self.reasons) or 'none that date it'})"


def change_named(name: str) -> Change:
    """The entry of `CHANGES` called `name`."""
    return next(c for c in CHANGES if c.name == name)


def parse_pin(text: str) -> str:
    """`VERL_VERSION=0.4.1` / `v0.4.1` / `2025-01-24`: the upstream time the launch's verl is at."""
    value = text.strip().lower().removeprefix("v")
    if value in TAGS:
        return TAGS[value]
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return value + "T23:59"
    raise InputError(
        f"VERL_VERSION={text!r} is neither a verl release ({', '.join(TAGS)}) nor a date (YYYY-MM-DD).",
        "Give the release, or the date of the upstream verl commit a fork is based on.",
    )


def window(plain_keys: Iterable[str], added_keys: Iterable[str], pin: str | None = None) -> VerlWindow:
    """The window of upstream times that the keys allow (`added_keys`: given with a leading `+`)."""
    if pin is not None:
        point = parse_pin(pin)
        return VerlWindow(point, point, (f"VERL_VERSION={pin}",), pinned=True)
    after: tuple[str, str] | None = None
    before: tuple[str, str] | None = None
    for key in plain_keys:
        for ev in KEY_EVIDENCE:
            if ev.suffix not in key:
                continue
            if ev.added and (after is None or ev.added[0] > after[0]):
                after = (ev.added[0], f"{key.split('.')[-1]} needs verl {ev.added[1]}")
            if ev.removed and (before is None or ev.removed[0] < before[0]):
                before = (ev.removed[0], f"{key.split('.')[-1]} was removed by verl {ev.removed[1]}")
    for key in added_keys:
        for ev in KEY_EVIDENCE:
            if ev.suffix in key and ev.added:
                if before is None or ev.added[0] < before[0]:
                    before = (ev.added[0], f"+{key.split('.')[-1]} predates verl {ev.added[1]}, which added it")
    reasons = tuple(r for r in (after[1] if after else None, before[1] if before else None) if r)
    return VerlWindow(after[0] if after else None, before[0] if before else None, reasons)


def vllm_memory_of(knobs: Mapping[str, Any], env: Mapping[str, str], win: VerlWindow, notes: list[str]) -> str:
    """What gpu_memory_utilization bounds (`Knobs.vllm_memory`): 'free' for verl's vendored vLLM workers (verl
    before #209, or `VLLM_VERSION` 0.3.1/0.4.2/0.5.4/0.6.3 on a verl before #2257), 'device' for vLLM 0.7-0.8's
    V1 engine, else 'instance' (memory/vllm_budget.py cites each)."""
    change = change_named("vllm_spmd")
    installed = str(env.get(VLLM_VERSION_WORD, "")).strip()
    if knobs["rollout_backend"] != "vllm":
        return "instance"
    if _VENDORED_VLLM.match(installed) or (not installed and win.side(change) == "before"):
        why = f"{VLLM_VERSION_WORD}={installed}" if installed else f"verl before {change.source}"
        notes.append(f"vllm_memory = free ({why}): {change.what}")
        return "free"
    if not installed and win.side(change) is None and (win.after is None or win.after < change.at):
        notes.append(
            f"vllm_memory planned as today's instance; verl before {change.at[:10]} ({change.source}), or any verl "
            f"with vLLM <= 0.6.3 installed: {change.what} — pass --override {VLLM_VERSION_WORD}=<installed vLLM> (or "
            f"{VERSION_WORD}=<release or date>)"
        )
    if re.match(r"^0\.[78]\.", installed) and knobs["vllm_engine"] == "v1":
        notes.append(
            f"vllm_memory = device ({VLLM_VERSION_WORD}={installed}, V1 engine): utilization × total minus everything "
            "on the GPU when the engine profiles"
        )
        return "device"
    return "instance"


def vllm_default_seqs_of(engine: str, win: VerlWindow, installed: str, gpu: GPUSpec | None) -> tuple[int, str | None]:
    """vLLM's default max_num_seqs for this launch (planner/vllm_defaults.py) and a caveat where it is assumed:
    the installed vLLM's when VLLM_VERSION names it, else vLLM 0.8.3's (what verl allowed before #1505), with a
    note where a later vLLM verl allowed would give this GPU another value."""
    today = VLLM_DEFAULT_MAX_NUM_SEQS[engine]
    version = parse_vllm_version(installed) if installed else None
    if version is not None:
        resolved = vllm_default_max_num_seqs(engine, version, gpu)
        if resolved is not None:
            return resolved, None
        return today, (
            f"max_num_seqs planned at {today}; vLLM {installed}'s V1 default depends on the device (1024 from "
            f"70 GiB, 256 below: vllm #16158), which is not known here"
        )
    allowed = change_named("vllm_084_allowed")
    if engine == "v0" or win.side(allowed) == "before" or gpu is None or gpu.is_cpu:
        return today, None
    if device_gets_large_default(gpu, DEVICE_RULE_FROM) and device_gets_large_default(gpu, A100_RULE_FROM):
        return today, None
    return today, (
        f"max_num_seqs = {today} assumes vLLM <= 0.8.3; from {allowed.at[:10]} ({allowed.source}) verl allowed "
        f"later vLLM, whose V1 default on a {gpu.name} is {V1_SMALL_DEVICE_MAX_NUM_SEQS} (under 70 GiB: vllm #16158, "
        f"0.8.4; an A100: #17885, 0.9.0) — pass --override {VLLM_VERSION_WORD}=<installed vLLM>"
    )


def init_offload_knobs(
    knobs: Mapping[str, Any], win: VerlWindow, notes: list[str], *, has_ref: bool
) -> dict[str, bool]:
    """What verl's init left on the GPU when the rollout engine measured it (`Knobs.actor_offload_at_init`, from
    "actor_offload_at_init"; `Knobs.ref_forced_cpu_offload`, from "ref_cpu_offload"): the old behaviour when the
    window is before the change, today's otherwise. A note says so where it moves the plan: the actor's only for
    the engine's budget (vLLM's 'device' and 'free', SGLang: memory/context.py `engine_start_resident_bytes`) under
    param_offload; the reference's wherever a reference is kept without its offload key, because the forced
    CPUOffload also takes it off the GPU in every phase (planner/ref_offload.py). FSDP launches only (the caller
    skips Megatron, whose workers honour ref.megatron.param_offload)."""
    counts = knobs["vllm_memory"] != "instance" or knobs["rollout_backend"] == "sglang"
    actor_moves = counts and bool(knobs["param_offload"])
    ref_moves = has_ref and not knobs["ref_param_offload"]
    out: dict[str, bool] = {}
    for change_name, knob, relevant, where in (
        (
            "actor_offload_at_init",
            "actor_offload_at_init",
            actor_moves,
            "actor's parameters on the GPU when the rollout engine measures it",
        ),
        ("ref_cpu_offload", "ref_forced_cpu_offload", ref_moves, "reference model on the GPU in every phase"),
    ):
        change = change_named(change_name)
        side = win.side(change)
        out[knob] = side != "before"
        if not relevant:
            continue
        if side == "before":
            notes.append(f"{knob} = false, the {where}: {change.what}")
        elif side is None and (win.after is None or win.after < change.at):
            notes.append(
                f"{knob} planned as today's verl; verl before {change.at[:10]} ({change.source}): {change.what} — if "
                f"the launch's verl is older, pass --pin {knob}=false (or --override {VERSION_WORD}=<release or date>)"
            )
    return out
