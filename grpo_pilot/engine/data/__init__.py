"""Prompt data for the engine: JSONL loading in the formats users have, rendering, resumable sampling.

load_prompts(path, *, fmt="auto", transform=None, skip_invalid=False) -> PromptSet
render_prompt(record, tokenizer, *, use_chat_template=None) -> str
PromptSampler(num_records, prompts_per_step, seed).next_batch() -> list[int]
"""

from grpo_pilot.engine.data.callables import load_callable
from grpo_pilot.engine.data.loader import load_prompts
from grpo_pilot.engine.data.records import FORMATS, PromptRecord, PromptSet
from grpo_pilot.engine.data.render import render_prompt
from grpo_pilot.engine.data.sampler import PromptSampler, epoch_permutation

__all__ = [
    "FORMATS",
    "PromptRecord",
    "PromptSampler",
    "PromptSet",
    "epoch_permutation",
    "load_callable",
    "load_prompts",
    "render_prompt",
]
