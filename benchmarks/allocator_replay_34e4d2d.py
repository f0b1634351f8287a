"""The allocator replay of the engine the H200 runs measured (commit 34e4d2d), with today's recorder.

The H200 measurements (tests/planner/gpu_measurements/h200-2026-11-26.json) ran the project at 34e4d2d; since then
the engine changed what it allocates (a6ed392: fused AdamW on CUDA, loss rows by one scatter, metrics kept on the
device; 1f504b8: the decode loop frees the prefill's logits; ...). This records the 34e4d2d actor itself — its
Actor, ScoredLogProbs, policy loss and HF decode loop — on fake tensors at full size, with today's recorder
(verify/alloc_record.py, cuda_autocast.py, single_rank.py, fake_trace.py copied into that checkout), and replays
the sequence under PyTorch's allocator rules (verify/allocator_sim.py, in this checkout):

    git worktree add /tmp/eng34 34e4d2d
    cp grpo_pilot/verify/{alloc_record,cuda_autocast,single_rank,fake_trace}.py /tmp/eng34/grpo_pilot/verify/
    PYTHONPATH=/tmp/eng34 .venv/bin/python benchmarks/allocator_replay_34e4d2d.py record \\
        tests/planner/gpu_measurements/h200-2026-11-26.json EVENTS.json.gz \\
        [--case qwen2.5-1.5b-kl-2minibatch] [--steps 2] [--rollout-steps 1] [--variant as_run]
    PYTHONPATH=. .venv/bin/python benchmarks/allocator_replay_34e4d2d.py replay OUT.json EVENTS.json.gz ...

`record` runs the steps as the 34e4d2d loop did (old-policy pass when there are several mini-batches, the
reference pass with KL, one `Actor.update` per mini-batch; the HF rollout's decode loop on the policy in the
steps of --rollout-steps, else skipped: it frees what it allocates before the release) and notes, before the
outputs of the ops whose CUDA kernels allocate scratch the fake tensors cannot show (logsumexp, attention
backward), the op and its tensor arguments. Variants test what the recorded engine might do otherwise:
`as_run`; `fused_adamw` (no foreach temporaries); `eager_adamw_state` (AdamW's states made before the first
update instead of lazily in its first step, while that update's freed blocks are cached); `gc_off` (Python's
cyclic collector off: frees that only a collection makes would move).

`replay` runs each recorded sequence under the default allocator with the measured runs' release (after the
rollout) and, optionally, the CUDA kernels' scratch: `logsumexp` (aten ReduceOps.cpp `logsumexp_out_impl`:
`amax` [c, 1] and `(self - maxes).exp_()` [c, V] in the input dtype, freed once the sum is formed) and
`attention_backward` (a float32 gradient-of-Q accumulator the size of Q, and K/V gradients at the query heads
for grouped-query attention, freed after the op) — sizes from the noted arguments. Results:
benchmarks/allocator_replay_34e4d2d.json; docs/validation.md ("Device footprint") reads them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import sys
import time
import warnings
from math import prod
from pathlib import Path
from typing import Any

CUBLAS_WORKSPACE_BYTES = 32 << 20  # as benchmarks/allocator_replay.py (Hopper's default cuBLAS workspace)
KL_COEF = 0.001  # the 34e4d2d run config's default kl_coef with use_kl_loss (engine/assemble.py VERL_KL_LOSS_COEF)
NOTED_OPS = ("logsumexp", "attention_backward")
VARIANTS = ("as_run", "fused_adamw", "eager_adamw_state", "gc_off")
INJECTIONS = {"none": (), "logsumexp": ("logsumexp",), "cuda_scratch": ("logsumexp", "attention_backward")}
GiB = 1 << 30


def _case(path: str, name: str) -> dict[str, Any]:
    cases = {c["name"]: c for c in json.loads(Path(path).read_text())["cases"]}
    return cases[name]


def _flags(command: str) -> dict[str, str | bool]:
    """`--flag value` / `--flag` pairs of a grpo-plan command line."""
    words, out, i = command.split()[1:], {}, 0
    while i < len(words):
        takes_value = i + 1 < len(words) and not words[i + 1].startswith("--")
        out[words[i].lstrip("-")] = words[i + 1] if takes_value else True
        i += 2 if takes_value else 1
    return out


def _samples(sample_cls: Any, *, count: int, prompt_len: int, response_len: int, vocab: int, offset: int, group: int):
    """Full-length samples in groups of `group` completions of one prompt (verify/traced.py `_samples`)."""
    out = []
    for i in range(count):
        g = (offset + i) // group
        prompt = [(g * prompt_len + j) % vocab for j in range(prompt_len)]
        base = (offset + i) * response_len + 7
        out.append(sample_cls(tuple(prompt), tuple((base + j) % vocab for j in range(response_len))))
    return out


def _op_notes(log: Any) -> Any:
    """A dispatch mode noting ("o", op, [[shape, element bytes], ...]) before the outputs of the NOTED_OPS."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class OpNotes(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = str(func.overloadpacket.__name__)
            if name == "logsumexp" or ("attention" in name and name.endswith("_backward")):
                tensors = [[list(t.shape), t.element_size()] for t in tree_leaves((args, kwargs or {}))
                           if isinstance(t, torch.Tensor)]  # fmt: skip
                log.events.append(("o", name, tensors))
            return func(*args, **(kwargs or {}))

    return OpNotes()


def _old_rollout(model: Any, prompts: list[list[int]], new_tokens: int) -> None:
    """The 34e4d2d HFRollout.generate: one decode_batch over every row in its `_generation_mode`."""
    import torch

    from grpo_pilot.engine.rollout.decode import decode_batch
    from grpo_pilot.engine.rollout.hf import _refreshes_no_buffers

    was_training = model.training
    model.eval()
    mode = torch.inference_mode() if _refreshes_no_buffers(model) else torch.no_grad()
    try:
        with mode, torch.autocast("cpu", dtype=torch.bfloat16):
            decode_batch(model, prompts, max_new_tokens=new_tokens, eos_ids=[0], pad_id=0, temperature=1.0,
                         top_p=1.0, generator=torch.Generator().manual_seed(0))  # fmt: skip
    finally:
        model.train(was_training)


def _apply_variant(actor: Any, variant: str, settings: Any) -> None:
    import torch

    if variant == "fused_adamw":
        actor.optimizer = torch.optim.AdamW(
            actor.policy.parameters(),
            lr=settings.lr,
            betas=(settings.adam_beta1, settings.adam_beta2),
            weight_decay=settings.weight_decay,
            fused=True,
        )
    elif variant == "eager_adamw_state":  # what AdamW's first step (torch/optim/adam.py `_init_group`) makes
        for p in actor.policy.parameters():
            state = actor.optimizer.state[p]
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)


def _step(log: Any, actor: Any, *, plan: dict[str, Any], step: int, rollout: bool) -> None:
    """One 34e4d2d `grpo_step` on the actor (module docstring)."""
    import torch

    from grpo_pilot.engine.actor import LossSettings, Sample

    count, n = plan["count"], plan["n"]
    samples = _samples(Sample, count=count, prompt_len=plan["prompt"], response_len=plan["response"],
                       vocab=plan["vocab"], offset=step * count, group=n)  # fmt: skip
    log.events.append(("r", "before_weight_sync"))
    log.phase("weight_sync")
    log.events.append(("r", "after_weight_sync"))
    log.phase("rollout")
    if rollout:
        _old_rollout(actor.policy, [list(s.prompt_ids) for s in samples], plan["response"])
    log.events.append(("r", "after_rollout"))
    log.phase("log_prob")
    size = plan["mini_prompts"] * n
    minis = [list(range(i, min(i + size, count))) for i in range(0, count, size)]
    old = actor.log_probs(samples) if len(minis) > 1 else None
    log.events.append(("r", "after_log_prob"))
    ref = actor.log_probs(samples, ref=True) if plan["kl"] else None
    log.events.append(("r", "after_log_prob"))
    log.phase("update")
    loss = LossSettings(kl_coef=KL_COEF if plan["kl"] else 0.0, loss_scale_len=plan["response"])
    advantages = torch.ones(count)
    for mb in minis:
        actor.update(
            [samples[i] for i in mb],
            advantages[mb],
            loss,
            old_logprobs=[old[i] for i in mb] if old is not None else None,
            ref_logprobs=[ref[i] for i in mb] if ref is not None else None,
        )
    del old, ref, advantages, samples
    log.phase("idle")


def record(case: dict[str, Any], *, steps: int, rollout_steps: set[int], variant: str) -> list[tuple]:
    """The allocation events of `steps` steps of the 34e4d2d engine on `case` (module docstring)."""
    import torch

    from grpo_pilot.engine.actor import Actor
    from grpo_pilot.engine.settings import ActorSettings
    from grpo_pilot.profiles.catalog import resolve_model
    from grpo_pilot.verify.alloc_record import AllocationLog, note_module, recording
    from grpo_pilot.verify.cuda_autocast import cuda_autocast_policy
    from grpo_pilot.verify.fake_trace import gpu_attention_masks, hf_config_from_spec, host_sync_fake_mode
    from grpo_pilot.verify.single_rank import build_fake_model, fake_module_moves

    flags, knobs = _flags(case["plan_command"]), case["knobs"]
    spec = resolve_model(str(flags["model"])).spec
    plan = dict(count=int(flags["prompts-per-step"]) * int(flags["n"]), n=int(flags["n"]), kl=bool(flags.get("kl")),
                mini_prompts=int(flags["mini-batch"]), prompt=int(flags["prompt-len"]) - 2,
                response=int(flags["response-len"]), vocab=spec.vocab_size)  # fmt: skip
    settings = ActorSettings.from_knobs(type("Knobs", (), knobs), with_ref=plan["kl"])
    log = AllocationLog(cublas_workspace_bytes=CUBLAS_WORKSPACE_BYTES)
    if variant == "gc_off":
        gc.disable()
    marks = lambda phase, _: log.events.append(("c", f"gc_{phase}"))  # noqa: E731 - frees inside a collection
    gc.callbacks.append(marks)
    with warnings.catch_warnings(), gpu_attention_masks(), host_sync_fake_mode(), cuda_autocast_policy():
        warnings.filterwarnings("ignore")
        model = build_fake_model(hf_config_from_spec(spec))
        note_module(log, model)
        with recording(log), _op_notes(log):
            with fake_module_moves():
                actor = Actor(model, device=torch.device("cpu"), settings=settings, world_size=1, numerics="cuda")
            _apply_variant(actor, variant, settings)
            actor.optimizer.register_step_pre_hook(lambda *_: log.events.append(("c", "optimizer_step")))
            for step in range(steps):
                _step(log, actor, plan=plan, step=step, rollout=step in rollout_steps)
    gc.callbacks.remove(marks)
    gc.enable()
    return log.events


def freed_by_collections(events: list) -> tuple[int, int]:
    """(collections, bytes of the storages freed inside them): frees that depend on when Python collects."""
    sizes: dict[int, int] = {}
    collections = freed = 0
    inside = False
    for event in events:
        if event[0] == "a":
            sizes[event[1]] = event[2]
        elif event[0] == "c" and event[1] in ("gc_start", "gc_stop"):
            inside = event[1] == "gc_start"
            collections += inside
        elif event[0] == "f" and inside:
            freed += sizes.get(event[1], 0)
    return collections, freed


def with_scratch(events: list, ops: tuple[str, ...]) -> list[tuple]:
    """`events` with the CUDA kernels' scratch of `ops` allocated at each note and freed after the op's first
    output (module docstring); the notes themselves dropped."""
    out: list[tuple] = []
    pending: list[int] = []
    next_id = 1 << 40
    for event in events:
        if event[0] != "o":
            out.append(tuple(event))
            if event[0] == "a" and pending:
                out.extend(("f", i) for i in reversed(pending))
                pending = []
            continue
        name, tensors = event[1], event[2]
        sizes: list[int] = []
        if name == "logsumexp" and "logsumexp" in ops:
            shape, element = tensors[0]
            sizes = [shape[0] * element, prod(shape) * element]
        elif name != "logsumexp" and "attention_backward" in ops:
            q, k = tensors[1][0], tensors[2][0]  # grad_out, query, key, ...: [B, H, M, K], [B, H_kv, N, K]
            sizes = [prod(q) * 4]
            if k[1] != q[1]:
                sizes += [2 * q[0] * q[1] * k[2] * k[3] * tensors[2][1]]
        for nbytes in sizes:
            next_id += 1
            out.append(("a", next_id, nbytes))
            pending.append(next_id)
    return out


def replay_file(path: str) -> dict[str, Any]:
    from grpo_pilot.engine.device_memory import RELEASE_POINTS
    from grpo_pilot.verify.allocator_sim import replay

    with gzip.open(path, "rt") as handle:
        events = json.load(handle)
    collections, freed = freed_by_collections(events)
    out: dict[str, Any] = {"gc_collections": collections, "gc_freed_bytes": freed}
    for label, ops in INJECTIONS.items():
        r = replay(with_scratch(events, ops), expandable=False, release_points=RELEASE_POINTS["after_rollout"])
        out[label] = {
            "peak_allocated_gib": round(r.peak_allocated_bytes / GiB, 4),
            "peak_reserved_gib": round(r.peak_reserved_bytes / GiB, 3),
            "phases_gib": {k: [round(v.allocated_bytes / GiB, 4), round(v.reserved_bytes / GiB, 3)]
                           for k, v in r.phases.items()},
        }  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("measurements")
    rec.add_argument("events")
    rec.add_argument("--case", default="qwen2.5-1.5b-kl-2minibatch")
    rec.add_argument("--steps", type=int, default=2)
    rec.add_argument("--rollout-steps", default="", help="comma-separated step indices that run the decode loop")
    rec.add_argument("--variant", choices=VARIANTS, default="as_run")
    rep = sub.add_parser("replay")
    rep.add_argument("out")
    rep.add_argument("events", nargs="+")
    a = parser.parse_args(argv)
    if a.command == "record":
        started = time.perf_counter()
        rollout_steps = {int(x) for x in a.rollout_steps.split(",") if x}
        events = record(_case(a.measurements, a.case), steps=a.steps, rollout_steps=rollout_steps, variant=a.variant)
        with gzip.open(a.events, "wt") as handle:
            json.dump(events, handle)
        print(f"{len(events)} events in {time.perf_counter() - started:.0f} s")
        return 0
    results = {Path(p).name: replay_file(p) for p in a.events}
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: {i: v[i]["peak_reserved_gib"] for i in INJECTIONS} for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main(sys.argv[1:]))
