"""Assemble a run from a plan and a run config (`build_engine`): validate, then start the workers.

All input validation happens here, before any worker starts: the dataset (every record rendered and
tokenised, each prompt between 1 and the plan's prompt_len_tokens), the reward spec, the sampling
cap against the plan's response length, the KL setting against the plan (a KL loss needs the
reference model the plan budgeted), the token budgets against the longest sequence, the device, and
what the engine cannot execute (Ulysses sequence parallelism, hf rollout with tensor parallelism,
a placement the workers cannot form, adapter settings engine/lora.py refuses — QLoRA on a CPU among them).
The driver keeps the data, sampler and reward; the workers
(engine/worker.py, engine/workers.py) get a `WorkerSetup` and build the model, actor and rollout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from grpo_pilot.engine.actor import LossSettings
from grpo_pilot.engine.data import PromptSampler, PromptSet, load_prompts, render_prompt
from grpo_pilot.engine.device import pick_device
from grpo_pilot.engine.lora import check_adapter_run
from grpo_pilot.engine.model_factory import build_tokenizer
from grpo_pilot.engine.ray_cluster import check_local_gpus, in_ray_session, local_gpus
from grpo_pilot.engine.rewards import RewardSettings, build_reward
from grpo_pilot.engine.rollout import SamplingConfig
from grpo_pilot.engine.run_config import RunConfig, capped_threads
from grpo_pilot.engine.settings import ActorSettings
from grpo_pilot.engine.topology import Topology, topology_for
from grpo_pilot.engine.worker import RolloutSettings, WorkerSetup
from grpo_pilot.engine.workers import WorkerGroup
from grpo_pilot.errors import InputError
from grpo_pilot.planner.plan import Plan
from grpo_pilot.profiles.spec import kv_bytes_per_token

VERL_KL_LOSS_COEF = 0.001  # verl actor.kl_loss_coef default (trainer/config/actor/actor.yaml)


@dataclass
class Engine:
    """The assembled run, the driver's side: what `grpo_step` reads. `prompt_ids[i]` is record i rendered
    and tokenised; `group` runs the model work (one in-process worker, or Ray actors)."""

    plan: Plan
    config: RunConfig
    tokenizer: Any
    prompts: PromptSet
    prompt_ids: list[list[int]]
    sampler: PromptSampler
    reward: Any
    group: Any
    loss: LossSettings
    sampling: SamplingConfig
    n: int
    prompts_per_step: int
    mini_batch_prompts: int
    ppo_epochs: int

    @property
    def topology(self) -> Topology:
        return self.group.topology


def model_source(plan: Plan, plan_path: str | Path | None) -> str:
    """The plan's model as `build_model` takes it: a local directory/config/GGUF file (as given, or next to
    the plan) or an alias."""
    requested = plan.model.requested
    for candidate in (Path(requested), Path(plan.model.resolved)):
        if candidate.exists():
            return str(candidate.resolve())  # absolute: workers may run in another directory (or node)
    if plan_path is not None:
        beside = Path(plan_path).parent / requested
        if beside.exists():
            return str(beside.resolve())
    return plan.model.resolved


def tokenize_prompts(prompts: PromptSet, tokenizer: Any, max_tokens: int) -> list[list[int]]:
    """Render and tokenise every record; a prompt longer than the plan's prompt_len_tokens stops the run."""
    out = []
    for rec in prompts.records:
        ids = list(tokenizer(render_prompt(rec, tokenizer), add_special_tokens=False)["input_ids"])
        if not 1 <= len(ids) <= max_tokens:
            raise InputError(
                f"{prompts.source}:{rec.line}: the prompt has {len(ids)} tokens; the plan allows 1 to {max_tokens} "
                "(prompt_len_tokens).",
                "Shorten or drop that record, or re-plan with a larger --prompt-len.",
            )
        out.append(ids)
    return out


def _check_budgets(plan: Plan, longest: int) -> None:
    k = plan.knobs
    for name, budget in (
        ("max_token_len_per_gpu", k.max_token_len_per_gpu),
        ("log_prob_max_token_len_per_gpu", k.log_prob_max_token_len_per_gpu),
    ):
        if budget is not None and budget < longest:
            raise InputError(
                f"The plan's {name} = {budget} is below the longest sequence ({longest} tokens = prompt + response).",
                f"Re-plan (or --pin {name}={longest} or more).",
            )


def _check_executable(plan: Plan, backend: str) -> Topology:
    """What this engine cannot run is refused before any worker starts; returns the plan's workers."""
    k = plan.knobs
    if k.ulysses_sp > 1:
        raise InputError(
            f"The plan uses Ulysses sequence parallelism (ulysses_sp={k.ulysses_sp}); grpo-run does not implement "
            "it (it needs all-to-all attention over the training ranks and a sequence-split loss).",
            "Re-plan with --pin ulysses_sp=1 (a smaller token budget per GPU, gradient checkpointing or offload "
            "instead), or export the plan to verl (grpo-plan --emit verl), which has it.",
        )
    if backend == "hf" and k.rollout_tp != 1:
        raise InputError(
            f"The hf rollout backend generates on one device per worker; the plan asks for rollout_tp={k.rollout_tp}.",
            "Use --backend vllm, or re-plan with --pin rollout_tp=1.",
        )
    return topology_for(plan)


def _check_adapter(plan: Plan, backend: str, topology: Topology, device: torch.device) -> None:
    """LoRA / QLoRA (the plan's workload.adapter): what this engine cannot run of it, before any worker starts."""
    adapter, k = plan.workload.adapter, plan.knobs
    if adapter is None:
        return
    offload = k.param_offload or k.optimizer_offload
    check_adapter_run(
        adapter,
        device_type=device.type,
        train_world=topology.train_world,
        offload=offload,
        shares_policy=backend == "hf" and topology.num_workers == 1 and not offload,
    )


def check_executable(plan: Plan, cfg: RunConfig) -> None:
    """What this engine can never run (whatever the memory): refused before the planner's re-check."""
    _check_executable(plan, cfg.rollout_backend or plan.knobs.rollout_backend)


def resolve_loss(plan: Plan, cfg: RunConfig, max_new_tokens: int) -> LossSettings:
    """Loss keywords: config values, with the plan deciding KL (ref model) and default entropy."""
    kl_coef = cfg.kl_coef if cfg.kl_coef is not None else (VERL_KL_LOSS_COEF if plan.workload.use_kl_loss else 0.0)
    if kl_coef > 0 and not plan.workload.use_kl_loss:
        raise InputError(
            f"kl_coef = {kl_coef} needs a reference model, but the plan was made without a KL loss (no memory for it).",
            "Re-plan with --kl, or set kl_coef = 0.",
        )
    return LossSettings(
        loss_agg_mode=cfg.loss_agg_mode,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        clip_c=cfg.clip_c,
        ratio_level=cfg.ratio_level,
        kl_coef=kl_coef,
        kl_type=cfg.kl_type,
        entropy_coeff=cfg.entropy_coeff if cfg.entropy_coeff is not None else plan.workload.entropy_coeff,
        loss_scale_len=cfg.loss_scale_len or max_new_tokens,
        mask_truncated=cfg.mask_truncated,
    )


def actor_settings(plan: Plan, cfg: RunConfig, loss: LossSettings) -> ActorSettings:
    """The actor's resolved settings: the plan's knobs, the run's optimizer and temperature."""
    return ActorSettings.from_knobs(
        plan.knobs,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2,
        max_grad_norm=cfg.max_grad_norm,
        temperature=cfg.temperature,
        with_ref=loss.kl_coef > 0,
        share_prompts=cfg.share_prompts,
        adapter=plan.workload.adapter,
    )


def worker_threads(cfg: RunConfig, topology: Topology, device: torch.device) -> int | None:
    """torch threads per worker: the run's setting, else (CPU, several workers) the node's cores shared out."""
    if cfg.threads is not None or device.type == "cuda" or topology.num_workers == 1:
        return None if cfg.threads is None else capped_threads(cfg.threads)
    return max(1, (os.cpu_count() or 1) // topology.workers_per_node)


def hf_decode_of(plan: Plan, cfg: RunConfig) -> str:
    """The hf rollout's decode loop: the run config's `hf_decode` when set, else the plan's knob (auto in plans
    made before the knob existed)."""
    return cfg.hf_decode or plan.knobs.hf_decode


class _Checked(NamedTuple):
    """What the checks before any worker starts resolve: the sampling cap, the mini-batch, the loss, the
    rollout backend, the worker topology and the device."""

    max_new: int
    mini: int
    loss: LossSettings
    backend: str
    topology: Topology
    device: torch.device


def _check_run(plan: Plan, cfg: RunConfig, address: str | None) -> _Checked:
    """The run config against the plan, the workers the plan needs against this machine's (module docstring)."""
    w = plan.workload
    max_new = cfg.max_new_tokens or w.response_len_tokens
    if max_new > w.response_len_tokens:
        raise InputError(
            f"max_new_tokens = {max_new} exceeds the plan's response_len_tokens = {w.response_len_tokens}.",
            "Lower max_new_tokens or re-plan with a larger --response-len.",
        )
    mini = cfg.mini_batch_prompts or w.mini_batch_prompts
    if mini > w.prompts_per_step:
        raise InputError(
            f"mini_batch_prompts = {mini} exceeds the plan's prompts_per_step = {w.prompts_per_step}.",
            "Use a mini-batch <= prompts per step.",
        )
    _check_budgets(plan, w.prompt_len_tokens + max_new)
    loss = resolve_loss(plan, cfg, max_new)
    backend = cfg.rollout_backend or plan.knobs.rollout_backend
    topology = _check_executable(plan, backend)
    if address is None and not in_ray_session():  # this machine alone: its GPUs must hold the plan, before Ray
        check_local_gpus(
            topology,
            "cpu" if cfg.device == "cpu" else topology.device_kind,
            plan_gpu=plan.cluster.gpu.name,
            plan_gpu_bytes=plan.cluster.gpu.memory_bytes,
            local=local_gpus(),
        )
    device = pick_device(cfg.device)
    _check_adapter(plan, backend, topology, device)
    return _Checked(max_new, mini, loss, backend, topology, device)


class _Inputs(NamedTuple):
    """The driver's data: the tokenizer, the prompt records and their token ids, the reward."""

    tokenizer: Any
    prompts: PromptSet
    prompt_ids: list[list[int]]
    reward: Any


def _load_inputs(plan: Plan, cfg: RunConfig, source: str) -> _Inputs:
    """Build the tokenizer, load and tokenise the prompts, build the reward and check it against the records."""
    tokenizer = build_tokenizer(source)
    prompts = load_prompts(
        cfg.dataset,
        fmt=cfg.dataset_format,
        transform=cfg.transform,
        skip_invalid=cfg.skip_invalid,
        timeout_s=cfg.user_code_timeout_s,
    )
    prompt_ids = tokenize_prompts(prompts, tokenizer, plan.workload.prompt_len_tokens)
    settings = RewardSettings(
        user_code_timeout_s=cfg.user_code_timeout_s, allow_unsandboxed_code=cfg.allow_unsandboxed_code
    )
    reward = build_reward(cfg.reward, tokenizer=tokenizer, settings=settings)
    reward.check_records(prompts.records)  # e.g. exact_match needs an answer on every record: fail before training
    return _Inputs(tokenizer, prompts, prompt_ids, reward)


def _cpu_vllm_kv_bytes(plan: Plan, backend: str, device: torch.device) -> int | None:
    """vLLM-CPU's KV cache size from the plan (None elsewhere: vLLM sizes it from its utilisation)."""
    if backend == "vllm" and device.type == "cpu" and plan.kv_cache_tokens_per_gpu > 0:
        spec = plan.model.spec  # the plan's own token count × the planner's own bytes per token (vLLM-CPU: fp32)
        return plan.kv_cache_tokens_per_gpu * kv_bytes_per_token(  # profiles/spec.py: the planner's formula
            num_layers=spec.num_layers,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            tensor_parallel=1,
            kv_bytes=4,
        )
    return None


def _sampling(cfg: RunConfig, max_new: int) -> SamplingConfig:
    """The rollout's sampling settings from the run config, capped at `max_new` tokens."""
    return SamplingConfig(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        max_new_tokens=max_new,
        stop=cfg.stop,
        seed=cfg.seed,
    )


def build_engine(
    plan: Plan, cfg: RunConfig, *, plan_path: str | Path | None = None, address: str | None = None
) -> Engine:
    """Validate inputs, build tokenizer, prompts, reward and sampler, then start the workers."""

    w, k = plan.workload, plan.knobs
    max_new, mini, loss, backend, topology, device = _check_run(plan, cfg, address)
    source = model_source(plan, plan_path)
    tokenizer, prompts, prompt_ids, reward = _load_inputs(plan, cfg, source)
    kv_bytes = _cpu_vllm_kv_bytes(plan, backend, device)
    vocab = plan.model.spec.vocab_size
    setup = WorkerSetup(
        model_source=source,
        vocab_size=len(tokenizer) if len(tokenizer) > vocab else None,
        seed=cfg.seed,
        device=cfg.device,
        threads=worker_threads(cfg, topology, device),
        cpu_memory=cfg.cpu_memory,
        memory_cap_bytes=cfg.memory_cap_bytes,
        allocator=cfg.allocator or k.allocator,
        release_cache=cfg.release_cache or k.release_cache,
        memory_history=cfg.memory_history,
        actor=actor_settings(plan, cfg, loss),
        rollout=RolloutSettings(
            backend=backend,
            max_model_len=w.prompt_len_tokens + max_new,
            gpu_memory_utilization=k.gpu_memory_utilization,
            tensor_parallel_size=k.rollout_tp,
            max_num_seqs=k.max_num_seqs,
            max_num_batched_tokens=k.max_num_batched_tokens,
            enforce_eager=k.enforce_eager,
            kv_cache_bytes=kv_bytes,
            seed=cfg.seed,
            hf_decode=hf_decode_of(plan, cfg),
            weight_sync_bucket_bytes=plan.run.weight_sync_bucket_bytes,
        ),
        topology=topology,
        workdir=str(Path(cfg.output_dir) / "workers"),
    )
    group = WorkerGroup.start(setup, address=address)
    return Engine(
        plan=plan,
        config=cfg,
        tokenizer=tokenizer,
        prompts=prompts,
        prompt_ids=prompt_ids,
        sampler=PromptSampler(len(prompts.records), w.prompts_per_step, cfg.seed),
        reward=reward,
        group=group,
        loss=loss,
        sampling=_sampling(cfg, max_new),
        n=w.n,
        prompts_per_step=w.prompts_per_step,
        mini_batch_prompts=mini,
        ppo_epochs=cfg.ppo_epochs or w.ppo_epochs,
    )
