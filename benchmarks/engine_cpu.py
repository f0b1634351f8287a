"""Our GRPO engine beside TRL's GRPOTrainer on this CPU: steps/s and tokens/s, one command.

    .venv/bin/python benchmarks/engine_cpu.py                 # defaults below, ~2-4 minutes on 2 cores
    .venv/bin/python benchmarks/engine_cpu.py --steps 4 --warmup 1 --rounds 1   # quicker

Same everything on both sides: one tiny random Qwen2 (saved once, loaded by both), the character
tokenizer, the same prompts (prompts_per_step of them per step, each sampled n times), the same max new
tokens, temperature 1.0, top_p 1.0, no KL (no reference model), one PPO mini-batch and epoch (on-policy,
so neither side runs an old-log-prob pass), AdamW, fp32 (TRL bf16=False), rollout on the HF policy
module itself, no vLLM (TRL: `generate`; ours: the `hf` backend's own decode loop),
`torch.set_num_threads(1)`. Ours runs with `cpu_memory="rss"` (no per-op tensor tracker);
`--tensor-tracker` adds a column with the default tracker on, the cost of `grpo-run`'s CPU profiling.

Timing: rounds alternate (ours, TRL, ours, TRL, ...) so drift of this shared machine hits both; each
round runs `warmup + steps` GRPO steps and keeps the last `steps`. Reported: medians over every kept
step. Step time = everything a step does (generation, reward, loss, backward, optimizer step); TRL's
is the time between its `on_step_begin` and `on_step_end` callbacks. Tokens = prompt + completion
tokens trained per step (ours: `grpo_step`'s count; TRL: the difference of its logged `num_tokens`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", message="TRL currently supports vLLM")

import torch  # noqa: E402

PROMPT_WORDS = ("say a", "aaa?", "abc", "repeat after me: a", "count the a's", "hello", "the cat", "a b a b")


def make_workspace(root: Path, *, hidden: int, layers: int, heads: int, num_prompts: int) -> tuple[Path, Path]:
    """A tiny random Qwen2 with the character tokenizer saved to `root/model`, and a prompt JSONL."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_pilot.engine.model_factory import build_char_tokenizer, save_model_dir

    tok = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model_dir = save_model_dir(Qwen2ForCausalLM(config), tok, root / "model")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"{PROMPT_WORDS[i % len(PROMPT_WORDS)]} {i}: "}) + "\n" for i in range(num_prompts)
        )
    )
    return model_dir, prompts


def build_plan(model_dir: Path, *, prompts_per_step: int, n: int, prompt_len: int, max_new: int) -> Any:
    """Our plan for the tiny model on the cpu pseudo-device: hf rollout, one mini-batch, no KL."""
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.planner.config import Knobs, Workload
    from grpo_pilot.planner.evaluate import PlanInputs, model_ref
    from grpo_pilot.planner.make_plan import evaluate
    from grpo_pilot.profiles.catalog import resolve_model

    workload = Workload(
        prompts_per_step=prompts_per_step,
        mini_batch_prompts=prompts_per_step,
        n=n,
        prompt_len_tokens=prompt_len,
        response_len_tokens=max_new,
        use_kl_loss=False,
    )
    knobs = Knobs(
        rollout_backend="hf",
        rollout_tp=1,
        micro_batch_size_per_gpu=prompts_per_step * n,
        gradient_checkpointing=False,
        fused_logprob=False,
        log_prob_max_token_len_per_gpu=prompts_per_step * n * (prompt_len + max_new),
    )
    inputs = PlanInputs(
        model=model_ref(resolve_model(str(model_dir))), cluster=parse_cluster("1xcpu"), workload=workload
    )
    return evaluate(inputs, knobs)


def time_ours(
    plan: Any, prompts: Path, out: Path, *, steps: int, warmup: int, max_new: int, cpu_memory: str
) -> list[tuple[float, int]]:
    """(wall s, trained tokens) of `steps` GRPO steps after `warmup`, through the engine's own step function."""
    from grpo_pilot.engine.assemble import build_engine
    from grpo_pilot.engine.loop import grpo_step
    from grpo_pilot.engine.run_config import RunConfig

    cfg = RunConfig(
        dataset=str(prompts),
        reward="char_fraction:char=a",
        steps=warmup + steps,
        lr=1e-5,
        output_dir=str(out),
        threads=1,
        cpu_memory=cpu_memory,
        device="cpu",
        max_new_tokens=max_new,
        seed=0,
    )
    torch.manual_seed(0)
    eng = build_engine(plan, cfg)  # one worker: in this process, no Ray
    kept: list[tuple[float, int]] = []
    try:
        for step in range(1, warmup + steps + 1):
            result = grpo_step(eng, step)
            if step > warmup:
                kept.append((result.wall_s, result.trained_tokens))
    finally:
        eng.group.close()
    return kept


def _a_fraction(completions: list[Any], **_: Any) -> list[float]:
    """TRL reward function: the fraction of 'a' characters (our `char_fraction:char=a`)."""
    return [c.count("a") / max(1, len(c)) for c in completions]


def time_trl(
    model_dir: Path, prompts: Path, out: Path, *, steps: int, warmup: int, prompts_per_step: int, n: int, max_new: int
) -> list[tuple[float, int]]:
    """(wall s, trained tokens) of `steps` GRPOTrainer steps after `warmup`."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_pilot.engine.model_factory import build_char_tokenizer

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.walls: list[float] = []
            self._t0 = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.walls.append(time.perf_counter() - self._t0)

    rows = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
    args = GRPOConfig(
        output_dir=str(out),
        bf16=False,
        use_cpu=True,
        use_vllm=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        max_steps=warmup + steps,
        learning_rate=1e-5,
        beta=0.0,
        num_generations=n,
        per_device_train_batch_size=prompts_per_step * n,
        gradient_accumulation_steps=1,
        max_completion_length=max_new,
        temperature=1.0,
        top_p=1.0,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    clock = StepClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=_a_fraction,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": rows}),
        processing_class=build_char_tokenizer(),
        callbacks=[clock],
    )
    trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
    trainer.train()
    seen = [int(h["num_tokens"]) for h in trainer.state.log_history if "num_tokens" in h]
    per_step = [b - a for a, b in zip([0] + seen[:-1], seen)]
    if len(per_step) != len(clock.walls):
        raise RuntimeError(f"TRL logged {len(per_step)} token counts for {len(clock.walls)} steps; set logging_steps=1")
    return list(zip(clock.walls, per_step))[warmup:]


def summarise(name: str, samples: list[tuple[float, int]]) -> dict[str, float | str]:
    walls = [w for w, _ in samples]
    step_s = statistics.median(walls)
    tokens_per_s = statistics.median([t / w for w, t in samples])
    return {
        "name": name,
        "steps": len(samples),
        "step_s": step_s,
        "steps_per_s": 1.0 / step_s,
        "tokens_per_step": statistics.median([t for _, t in samples]),
        "tokens_per_s": tokens_per_s,
        "spread": (max(walls) - min(walls)) / step_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument(
        "--heads", type=int, default=2, help="query heads (head_dim = hidden / heads; vLLM-CPU needs >= 32, HF any)"
    )
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--n", type=int, default=4, help="completions per prompt")
    p.add_argument("--max-new", type=int, default=32, help="max new tokens per completion")
    p.add_argument("--steps", type=int, default=5, help="measured steps per round")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per round (not measured)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (ours, TRL) per system")
    p.add_argument(
        "--tensor-tracker",
        action="store_true",
        help="also time ours with the per-op tensor tracker (grpo-run's CPU default)",
    )
    a = p.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    results: dict[str, list[tuple[float, int]]] = {"ours": [], "trl": []}
    if a.tensor_tracker:
        results["ours+tracker"] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        root = Path(tmp)
        model_dir, prompts = make_workspace(
            root,
            hidden=a.hidden,
            layers=a.layers,
            heads=a.heads,
            num_prompts=a.prompts_per_step * (a.warmup + a.steps) * 2,
        )
        prompt_len = 32  # every prompt above is < 32 characters = tokens
        plan = build_plan(
            model_dir, prompts_per_step=a.prompts_per_step, n=a.n, prompt_len=prompt_len, max_new=a.max_new
        )
        for r in range(a.rounds):
            results["ours"] += time_ours(
                plan, prompts, root / f"ours-{r}", steps=a.steps, warmup=a.warmup, max_new=a.max_new, cpu_memory="rss"
            )
            results["trl"] += time_trl(
                model_dir,
                prompts,
                root / f"trl-{r}",
                steps=a.steps,
                warmup=a.warmup,
                prompts_per_step=a.prompts_per_step,
                n=a.n,
                max_new=a.max_new,
            )
            if a.tensor_tracker:
                results["ours+tracker"] += time_ours(
                    plan,
                    prompts,
                    root / f"ourst-{r}",
                    steps=a.steps,
                    warmup=a.warmup,
                    max_new=a.max_new,
                    cpu_memory="tensors",
                )
            print(f"round {r + 1}/{a.rounds} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    rows = [summarise(k, v) for k, v in results.items()]
    trl = next(r for r in rows if r["name"] == "trl")
    print(
        f"\nmodel: Qwen2 hidden {a.hidden}, {a.layers} layers, {a.heads} heads, char vocab; {a.prompts_per_step} "
        f"prompts x n={a.n}, max {a.max_new} new tokens; {a.rounds} rounds x ({a.warmup} warm-up + {a.steps} "
        f"measured) steps; 1 thread; torch {torch.__version__}"
    )
    print(
        f"{'engine':14s} {'steps':>5s} {'median step s':>13s} {'steps/s':>8s} {'tokens/step':>11s} {'tokens/s':>9s} "
        f"{'spread':>7s} {'steps/s vs TRL':>14s} {'tokens/s vs TRL':>15s}"
    )
    for r in rows:
        print(
            f"{r['name']:14s} {r['steps']:5d} {r['step_s']:13.3f} {r['steps_per_s']:8.2f} {r['tokens_per_step']:11.0f} "
            f"{r['tokens_per_s']:9.0f} {r['spread']:7.0%} {r['steps_per_s'] / trl['steps_per_s']:13.2f}x "
            f"{r['tokens_per_s'] / trl['tokens_per_s']:14.2f}x"
        )
    print(
        "spread = (max - min) / median of the kept step times; tokens/step differ when completions stop at EOS at "
        "different points."
    )
    print(f"total wall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
