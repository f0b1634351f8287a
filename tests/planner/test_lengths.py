"""Length statistics: quantiles of what a micro-batch holds, lengths files, and the workload they feed."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.hardware import parse_cluster
from grpo_pilot.planner.config import Knobs, Workload
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.lengths import (
    MEMORY_QUANTILE,
    MEMORY_QUANTILE_Z,
    batch_max_width_tokens,
    lengths_of,
    longest_of_z,
    micro_batch_tokens,
    one_quantile_tokens,
    response_share,
    std_bound,
    sum_quantile_tokens,
    tokens_per_sequence_for_time,
)
from grpo_pilot.planner.lengths_file import read_lengths_jsonl, stats_of, workload_fields
from grpo_pilot.planner.suggest import capped_response
from grpo_pilot.planner.timing import estimate_time
from grpo_pilot.profiles.catalog import resolve_model

# verl's reference GRPO log (eric-haibin-lin/verl-data gsm8k/qwen2-7b-fsdp2.log): caps 512 / 1024,
# prompt_length/mean ≈ 94, response_length/mean ≈ 198.
GSM8K = Workload(
    prompt_len_tokens=512, response_len_tokens=1024, prompt_len_mean_tokens=94.0, response_len_mean_tokens=198.0
)


def test_unknown_lengths_are_the_worst_case() -> None:
    w = Workload()
    lens = lengths_of(w)
    assert w.at_max_lengths and lens.prompt_std == 0.0 and lens.response_std == 0.0
    assert micro_batch_tokens(4, lens, padding="remove") == 4 * w.seq_len_tokens
    assert micro_batch_tokens(4, lens, padding="sorted_rows", pool=64) == 4 * w.seq_len_tokens
    assert response_share(lens) == pytest.approx(1024 / 1536, abs=1e-3)


def test_bhatia_davis_bound_is_the_largest_std() -> None:
    # a two-point distribution on {0, max} with this mean reaches the bound
    mean, top = 200.0, 1000
    p = mean / top
    two_point_std = math.sqrt(p * (1 - p)) * top
    assert std_bound(mean, top) == pytest.approx(two_point_std)
    assert std_bound(top, top) == 0.0 and std_bound(0.0, top) == 0.0


def test_sum_quantile_matches_simulation_and_stays_within_the_maxima() -> None:
    """The CLT quantile of a sum of 64 lengths covers the simulated 0.999 quantile (uniform lengths)."""
    rng = random.Random(0)
    count, top = 64, 1000
    sums = sorted(sum(rng.randint(0, top) for _ in range(count)) for _ in range(20000))
    simulated = sums[int(MEMORY_QUANTILE * len(sums))]
    std = top / math.sqrt(12)
    predicted = sum_quantile_tokens(count=count, mean=top / 2, std=std, max_len=top)
    assert simulated <= predicted <= simulated * 1.02
    assert sum_quantile_tokens(count=4, mean=900.0, std=500.0, max_len=1000) == 4000  # capped by count × max
    assert sum_quantile_tokens(count=0, mean=100.0, std=10.0, max_len=1000) == 0
    assert one_quantile_tokens(100.0, 10.0, 1000) == math.ceil(100 + MEMORY_QUANTILE_Z * 10)


def test_longest_of_many_rows_sits_higher() -> None:
    assert longest_of_z(1) == MEMORY_QUANTILE_Z
    assert MEMORY_QUANTILE_Z < longest_of_z(4) < longest_of_z(256)
    lens = lengths_of(GSM8K.model_copy(update={"prompt_len_std_tokens": 20.0, "response_len_std_tokens": 80.0}))
    packed = micro_batch_tokens(8, lens, padding="remove")
    sorted_rows = micro_batch_tokens(8, lens, padding="sorted_rows", pool=256)
    assert 8 * lens.seq_mean < packed < sorted_rows
    # TRL pads every row to the longest prompt + the longest completion of the rank's generation batch (`pool`):
    # each at the quantile of the longest of the pool, so at least the sorted rows' width, at most the maxima
    padded = micro_batch_tokens(8, lens, padding="batch_max", pool=256)
    longest = longest_of_z(256)
    width = one_quantile_tokens(lens.prompt_mean, lens.prompt_std, lens.prompt_max, longest) + one_quantile_tokens(
        lens.response_mean, lens.response_std, lens.response_max, longest
    )
    assert sorted_rows <= padded == 8 * width < 8 * lens.seq_max
    # a generation batch of its own 8 rows (TRL <= 0.16 generated per micro-step) pads less than one of 256
    assert micro_batch_tokens(8, lens, padding="batch_max", pool=8) < padded
    at_maxima = lens._replace(prompt_mean=float(lens.prompt_max), response_mean=float(lens.response_max))
    assert micro_batch_tokens(8, at_maxima, padding="batch_max", pool=256) == 8 * lens.seq_max


def test_real_lengths_shrink_the_memory_peak(spec_of) -> None:
    """The same verl job, worst case vs GSM8K-like lengths: activations follow the tokens a micro-batch
    holds, the states do not."""
    model, cluster = spec_of("qwen2-7b"), parse_cluster("8xH100")
    knobs = Knobs(micro_batch_size_per_gpu=16, gradient_checkpointing=False)
    worst = estimate_memory(model, cluster, GSM8K.worst_case(), knobs, target="verl")
    real = estimate_memory(model, cluster, GSM8K, knobs, target="verl")
    assert real.peak_gpu_bytes < worst.peak_gpu_bytes
    upd_w, upd_r = worst.phases["update"].items, real.phases["update"].items
    assert upd_r["actor_params"] == upd_w["actor_params"]
    assert upd_r["activations"] < upd_w["activations"] / 2


def test_capped_response_keeps_the_statistics_as_bounds() -> None:
    w = GSM8K.model_copy(update={"response_len_std_tokens": 150.0, "response_tail_tokens": 900})
    short = capped_response(w, 150)
    assert short.response_len_tokens == 150 and short.response_len_mean_tokens == 150
    assert short.response_len_std_tokens == 0.0 and short.response_tail_tokens == 150
    longer = capped_response(w, 600)
    assert longer.response_len_mean_tokens == 198.0 and longer.response_len_std_tokens == 150.0
    assert capped_response(Workload(), 300).response_len_mean_tokens is None


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_lengths_file_statistics_and_workload_fields(tmp_path: Path) -> None:
    rows = [{"step": i // 4, "prompt_tokens": 90 + i, "response_tokens": 100 + 10 * i} for i in range(8)]
    stats = read_lengths_jsonl(_write(tmp_path / "lengths.jsonl", rows + [{"prompt_tokens": 98, "response_tokens": 0}]))
    assert stats.count == 9 and stats.prompt_max == 98 and stats.response_max == 170
    assert stats.prompt_mean == pytest.approx(sum(90 + i for i in range(8)) / 9 + 98 / 9)
    fields = workload_fields(stats, 512, 1024, "lengths.jsonl")
    w = Workload(**fields)
    assert w.prompt_len_tokens == 512 and w.response_len_tokens == 1024 and w.response_tail_tokens == 170
    assert w.response_len_std_tokens == pytest.approx(stats.response_std)
    # caps default to the largest observed
    assert Workload(**workload_fields(stats, None, None, "x")).response_len_tokens == 170
    with pytest.raises(InputError, match="above --response-len 150"):
        workload_fields(stats, 512, 150, "lengths.jsonl")


def test_prompt_only_statistics_keep_the_response_cap() -> None:
    fields = workload_fields(stats_of([10, 20, 30]), 64, 256, "data.jsonl")
    assert fields["response_len_tokens"] == 256 and "response_len_mean_tokens" not in fields
    assert fields["prompt_len_mean_tokens"] == 20.0


@pytest.mark.parametrize(
    "content, expected",
    [
        ("not json\n", "not valid JSON"),
        ('{"prompt_tokens": 3}\n', "no prompt_tokens / response_tokens"),
        ('{"prompt_tokens": -1, "response_tokens": 2}\n', "non-negative integer"),
        ('{"prompt_tokens": 1.5, "response_tokens": 2}\n', "non-negative integer"),
        ("\n\n", "has no samples"),
    ],
)
def test_bad_lengths_files_are_input_errors(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "lengths.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=expected):
        read_lengths_jsonl(path)
    with pytest.raises(InputError, match="No lengths file"):
        read_lengths_jsonl(tmp_path / "missing.jsonl")


def test_balanced_partitions_shrink_the_spread_of_a_share() -> None:
    """verl balances each step's tokens across ranks: a micro-batch drawn from a rank's share varies less
    (finite-population factor), and the whole share is exactly its mean."""
    free = sum_quantile_tokens(count=40, mean=300.0, std=100.0, max_len=1536)
    balanced = sum_quantile_tokens(count=40, mean=300.0, std=100.0, max_len=1536, population=160)
    assert 40 * 300 < balanced < free
    assert (balanced - 12000) == pytest.approx((free - 12000) * math.sqrt(120 / 159), abs=1)
    assert sum_quantile_tokens(count=160, mean=300.0, std=100.0, max_len=1536, population=160) == 160 * 300


def test_trl_rows_cost_the_generation_batchs_median_longest_width_in_time() -> None:
    """TRL pads every row to the longest prompt + longest completion of the rank's generation batch: a step's
    training time follows that width (the median longest of the batch's rows), not the configured maxima."""
    short = Workload(
        prompts_per_step=64, mini_batch_prompts=64, n=8, prompt_len_tokens=1024, response_len_tokens=4096,
        prompt_len_mean_tokens=150.0, prompt_len_std_tokens=40.0,
        response_len_mean_tokens=600.0, response_len_std_tokens=200.0,
    )  # fmt: skip
    lengths = lengths_of(short)
    rows = 64 * 8 // 8  # the rank's generation batch on 8 GPUs
    width = tokens_per_sequence_for_time(lengths, "batch_max", rows)
    assert width == batch_max_width_tokens(lengths, rows, 0.0)
    assert 150 + 600 < width < 1024 + 4096  # wider than a mean row, far from the maxima
    assert tokens_per_sequence_for_time(lengths, "batch_max", 1) < width  # a larger batch holds a longer row
    spec, cluster = resolve_model("qwen2.5-1.5b").spec, parse_cluster("8xH100")
    at_max = short.model_copy(update={"prompt_len_mean_tokens": None, "prompt_len_std_tokens": None,
                                      "response_len_mean_tokens": None, "response_len_std_tokens": None})  # fmt: skip
    knobs = Knobs(micro_batch_size_per_gpu=8)
    fast = estimate_time(spec, cluster, short, knobs, target="trl").phases_s["update"]
    slow = estimate_time(spec, cluster, at_max, knobs, target="trl").phases_s["update"]
    assert fast < 0.5 * slow
