"""The unsharded actor's shared-prompt layout: a micro-batch computes each distinct prompt once.

Our engine's unsharded actor (one training rank, engine/actor.py `share_prompts and not sharded`) runs a
micro-batch holding several completions of one prompt through engine/shared_prefix.py for the Llama
family with SDPA (`kernels.LLAMA_FAMILY_MODEL_TYPES`): U distinct prompt rows [U, P] and B response rows
[B, R'] (R' = the longest response − 1) as one flat token batch of U·P + B·R' positions instead of
B·(P + R'). What a micro-batch of B rows holds depends on the order the engine batches them in: rows are
sorted by length, longest first, ties by index (engine/micro_batches.py), and the step loop hands over
each GRPO group's n completions consecutively. With every sequence the same length (the worst case the
planner's memory is judged at, `Workload.worst_case`, and every fixed-length workload) the sort keeps
each group together, so B rows span ceil(B/n) groups when B and n divide one another (at most one more
otherwise, as micro-batch and group boundaries drift apart).
With varying lengths a group's rows scatter and the layout is not assumed (U = B: the plain forward).

Per layer, beside the per-token activations of the U·P + B·R' positions (traced through the engine's
actor, verify/traced.py, Qwen2.5-1.5B shape, 16 rows of 126 + 256 tokens in groups of 4: exact to the
byte but for 1.2 kB of 512-byte rounding):
- the response keys and values gathered with their prompt's ([B, kv, P + R', d] each, kept by SDPA):
  under autocast the keys are cast anew (fp32 after the rotary embedding) and only the prompt part is
  extra (c·kv_dim·B·P), the values are extra whole (c·kv_dim·B·(P + R')); without autocast both are
  views of one buffer and extra whole;
- the attention outputs of the two parts concatenated for o_proj (c·q_dim per position, a copy the
  plain layout does not make);
- the boolean mask [B, 1, R', P + R'] (built once per forward) converted to the compute dtype and kept
  for backward by SDPA in every layer (c bytes per element).
Once per forward: the boolean mask and the rotary tables cos, sin of every position ([T, 1, d] fp32).
The final norm runs on the scored positions only (`memory/activations.head_side_activation_bytes`).

A forward-only pass (the log-prob passes) keeps nothing for backward, but the layer function holds its
attention's locals until it returns, so inside the MLP (the pass's layer peak) they sit beside the
plain layout's working set (traced: Qwen2.5-1.5B shape, 16 rows of 126 + 256 tokens in groups of 4 and
of 2, and 8 rows: to within 0.04%): the rotated queries and keys (fp32 under autocast) and the values
per position, the two attention outputs (c·q_dim per position), and the gathered keys (fp32 under
autocast) and values of the response rows [B, kv, P + R', d].
"""

from __future__ import annotations

import math
from typing import NamedTuple

from grpo_pilot.kernels import LLAMA_FAMILY_MODEL_TYPES
from grpo_pilot.planner.lengths import Lengths
from grpo_pilot.profiles.spec import ModelSpec
from grpo_pilot.units import FP32_BYTES


class SharedLayout(NamedTuple):
    """One micro-batch in the shared-prompt layout (module docstring)."""

    positions: int  # U·P + B·R': positions every decoder layer computes
    layer_extra_bytes: int  # saved per layer, beside the per-token activations of `positions`
    forward_extra_bytes: int  # held inside a layer of a forward-only pass, beside the plain working set
    once_bytes: int  # per forward: the boolean mask and the rotary tables


def groups_spanned(rows: int, group_size: int) -> int:
    """Most distinct prompts among the `rows` consecutive rows of any micro-batch, when micro-batches of
    `rows` are cut from the start of rows ordered in groups of `group_size` (module docstring)."""
    if group_size <= 1:
        return rows
    cycle = group_size // math.gcd(rows, group_size)  # micro-batch starts repeat modulo the group size
    return max(((k * rows + rows - 1) // group_size) - (k * rows // group_size) + 1 for k in range(cycle))


def shared_layout(
    *,
    rows: int,
    prompt_tokens: int,
    response_tokens: int,
    group_size: int,
    q_dim: int,
    kv_dim: int,
    head_dim: int,
    compute_bytes: int,
    autocast: bool,
) -> SharedLayout | None:
    """The layout of `rows` full-length rows, or None when no prompt repeats among them (the plain forward)."""
    prompts = groups_spanned(rows, group_size)
    if prompts >= rows or response_tokens < 2:
        return None
    fed = response_tokens - 1  # a sequence's last token is not fed
    c, rotated = compute_bytes, FP32_BYTES if autocast else compute_bytes
    mask_elements = rows * fed * (prompt_tokens + fed)
    gathered = rows * (prompt_tokens + fed)  # key/value positions of the response rows
    keys = c * kv_dim * (rows * prompt_tokens if autocast else gathered)
    positions = prompts * prompt_tokens + rows * fed
    saved = keys + c * kv_dim * gathered + c * q_dim * positions + c * mask_elements
    held = positions * (rotated * (q_dim + kv_dim) + c * (kv_dim + q_dim)) + gathered * kv_dim * (rotated + c)
    once = mask_elements + 2 * FP32_BYTES * head_dim * positions
    return SharedLayout(positions=positions, layer_extra_bytes=saved, forward_extra_bytes=held, once_bytes=once)


def micro_batch_layouts(
    model: ModelSpec,
    lengths: Lengths,
    *,
    tokens: tuple[int, ...],
    group_size: int,
    applies: bool,
    compute_bytes: int,
    autocast: bool,
) -> tuple[SharedLayout | None, ...]:
    """The shared layout (or None) of micro-batches of each of `tokens` (whole rows at the lengths' means).
    `applies`: the executor shares prompts on this rank (unsharded, `ExecutorTraits.shares_prompts`); the
    model must be of the Llama family and every sequence the same length (module docstring)."""
    fixed = lengths.prompt_std == 0 and lengths.response_std == 0
    if not (applies and fixed and group_size > 1 and model.model_type in LLAMA_FAMILY_MODEL_TYPES):
        return tuple(None for _ in tokens)
    prompt, response = round(lengths.prompt_mean), round(lengths.response_mean)
    return tuple(
        shared_layout(
            rows=t // max(1, prompt + response),
            prompt_tokens=prompt,
            response_tokens=response,
            group_size=group_size,
            q_dim=model.q_dim,
            kv_dim=model.kv_dim,
            head_dim=model.head_dim,
            compute_bytes=compute_bytes,
            autocast=autocast,
        )
        for t in tokens
    )


def shared_positions(
    tokens: int, layout: SharedLayout | None, mask_per_layer: int, bool_mask: int, *, forward_only: bool = False
) -> tuple[int, int, int]:
    """(positions the layers compute, bytes per layer beside their per-token activations — kept for
    backward, or held inside a forward-only layer — and bytes once per forward) of a micro-batch of
    `tokens`: the plain layout's own when `layout` is None."""
    if layout is None:
        return tokens, mask_per_layer, bool_mask
    extra = layout.forward_extra_bytes if forward_only else layout.layer_extra_bytes
    return layout.positions, mask_per_layer + extra, bool_mask + layout.once_bytes
