"""The static decode loop (static_step, static_decode, cuda_graphs) against the eager loop on the CPU: same tokens
for the same seed, the step's shape stability (what a CUDA graph relies on), and the graph wrapper's bookkeeping."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from tiny_models import VOCAB, tiny

import grpo_pilot.engine.rollout.cuda_graphs as cuda_graphs
import grpo_pilot.engine.rollout.static_decode as static_decode
from grpo_pilot.engine.model_factory import build_char_tokenizer
from grpo_pilot.engine.rollout import SamplingConfig
from grpo_pilot.engine.rollout.decode import decode_batch, left_pad, sample_next
from grpo_pilot.engine.rollout.hf import HFRollout, resolve_decode
from grpo_pilot.engine.rollout.llama_step import LlamaDecodeStep
from grpo_pilot.engine.rollout.static_decode import decode_static
from grpo_pilot.engine.rollout.static_step import DecodeWeights, StaticStep, table_unsupported

torch.set_num_threads(1)
PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [5, 6, 7, 8, 9], [20, 21, 22, 23, 24, 25, 26], [11, 12]]
MANY = PROMPTS * 2 + [[30 + i, 31 + 2 * i, 60 - i][: i + 1] for i in range(4)]  # 14 rows, 7 distinct prompts
EOS = tuple(range(40, 52))  # ~1 in 8 ids ends a row: long-tailed lengths
MODELS = [
    ("qwen2", {}),
    ("qwen3", {}),
    ("llama", {"attention_bias": True, "mlp_bias": True}),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
]
SAMPLERS = [
    {"temperature": 0.0, "top_p": 1.0, "top_k": 0},
    {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
    {"temperature": 0.7, "top_p": 0.8, "top_k": 0},
    {"temperature": 1.3, "top_p": 1.0, "top_k": 5},
    {"temperature": 1.0, "top_p": 0.9, "top_k": 20},
]


def stop_on_thirteen(tails: list[list[int]]) -> list[bool]:
    """Stop once two ids in a row sum to a multiple of 13."""
    return [len(t) == 2 and sum(t) % 13 == 0 for t in tails]


def both(model: torch.nn.Module, prompts: list[list[int]], *, seed: int = 11, stop: bool = True, **kw: Any):
    """(eager, static) completions of the same call."""
    sampler = {k: kw.pop(k) for k in ("temperature", "top_p", "top_k")}
    common = dict(max_new_tokens=kw.pop("max_new_tokens", 20), eos_ids=EOS, pad_id=0, **sampler)
    if stop:
        common.update(stop=stop_on_thirteen, stop_window=2)
    with torch.inference_mode():
        eager = decode_batch(model, prompts, generator=torch.Generator().manual_seed(seed), **common)
        weights = DecodeWeights(model, next(model.parameters()).dtype)
        static = decode_static(model, weights, prompts, generator=torch.Generator().manual_seed(seed), **common, **kw)
    return eager, static


def test_one_draw_per_call_is_the_per_step_stream_on_the_cpu() -> None:
    for rows in (5, 14, 64):
        g = torch.Generator().manual_seed(3)
        per_step = torch.cat([torch.rand((rows, 1), generator=g) for _ in range(20)])
        g = torch.Generator().manual_seed(3)
        assert torch.equal(per_step, torch.rand((20, rows, 1), generator=g).reshape(-1, 1))


@pytest.mark.parametrize(("model_type", "extra"), MODELS)
@pytest.mark.parametrize("sampler", SAMPLERS, ids=["greedy", "t1", "t07_p08", "t13_k5", "k20_p09"])
def test_static_equals_eager_with_eos_and_stop_strings(model_type: str, extra: dict, sampler: dict) -> None:
    model = tiny(model_type, **extra)
    eager, static = both(model, MANY, **sampler)
    assert static == eager
    # long-tailed, ended both ways: by EOS and by the stop check; some rows ran to the cap
    ends = [next((i for i, t in enumerate(r) if t in EOS), None) for r in eager]
    assert any(e is not None for e in ends) and len({len(r) for r in eager}) == 1


@pytest.mark.parametrize(("check_every", "length_bucket"), [(1, 1), (3, 4), (8, 128), (50, 7)])
def test_look_interval_and_length_bucket_do_not_change_completions(check_every: int, length_bucket: int) -> None:
    model = tiny("qwen3")
    for sampler in (SAMPLERS[0], SAMPLERS[2]):
        eager, static = both(model, MANY, check_every=check_every, length_bucket=length_bucket, **sampler)
        assert static == eager


def test_every_row_ends_early_and_the_result_is_cut_like_the_eager_one() -> None:
    model = tiny("qwen2")
    everything = tuple(range(VOCAB))  # every id ends a row: one token each
    with torch.inference_mode():
        weights = DecodeWeights(model, torch.float32)
        common = dict(max_new_tokens=9, eos_ids=everything, pad_id=0, temperature=0.0, top_p=1.0, generator=None)
        assert decode_static(model, weights, PROMPTS, **common) == decode_batch(model, PROMPTS, **common)
        assert [len(r) for r in decode_static(model, weights, PROMPTS, **common)] == [1] * len(PROMPTS)
        one = dict(common, max_new_tokens=1, eos_ids=(1,))
        assert decode_static(model, weights, PROMPTS, **one) == decode_batch(model, PROMPTS, **one)


def test_compaction_halves_the_batch_and_keeps_the_completions(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny("qwen2")
    sizes: list[int] = []
    forward = StaticStep.forward
    monkeypatch.setattr(
        StaticStep, "forward", lambda self, length: (sizes.append(self.num_rows), forward(self, length))[1]
    )
    eager, static = both(model, MANY, check_every=2, max_new_tokens=40, **SAMPLERS[1])
    assert static == eager
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == len(MANY) and sizes[-1] < len(MANY)
    assert all(s & (s - 1) == 0 for s in set(sizes) - {len(MANY)})  # every compacted size is a power of two


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_bf16_static_step_matches_the_eager_modules_step(model_type: str) -> None:
    from transformers import DynamicCache

    model = tiny(model_type).to(torch.bfloat16)
    ids, real = left_pad(PROMPTS, 0, torch.device("cpu"))
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    total = ids.shape[1] + 4
    key_mask = torch.ones((len(PROMPTS), total), dtype=torch.bool)
    key_mask[:, : ids.shape[1]] = real
    rows = torch.arange(len(PROMPTS))
    with torch.no_grad():
        caches = [DynamicCache(config=model.config) for _ in range(2)]
        for cache in caches:
            model(input_ids=ids, attention_mask=real.long(), position_ids=positions, past_key_values=cache)
        eager = LlamaDecodeStep(model, caches[0], rows, key_mask)
        static = StaticStep(model, DecodeWeights(model, torch.bfloat16), rows=len(PROMPTS), total_len=total)
        static.load_prefill(caches[1], rows, key_mask, positions[:, -1] + 1)
        assert not eager.lean and not static.lean and static.keys[0].dtype == torch.bfloat16
        token, last = torch.tensor([3, 4, 5, 6, 7]), positions[:, -1:]
        for t in range(1, 4):
            last = last + 1
            static.tokens.copy_(token)
            ours = static.forward(ids.shape[1] + t)
            theirs = eager(token, last)
            torch.testing.assert_close(ours, theirs, atol=2e-2, rtol=2e-2)  # bf16 rounding: another SDPA shape
            token = theirs.argmax(-1)


def test_fp32_static_step_is_the_eager_lean_step_bit_for_bit_and_close_with_masked_slots() -> None:
    from transformers import DynamicCache

    model = tiny("qwen3")
    ids, real = left_pad(PROMPTS, 0, torch.device("cpu"))
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    total = ids.shape[1] + 6
    key_mask = torch.ones((len(PROMPTS), total), dtype=torch.bool)
    key_mask[:, : ids.shape[1]] = real
    rows = torch.arange(len(PROMPTS))
    with torch.no_grad():
        caches = [DynamicCache(config=model.config) for _ in range(3)]
        for cache in caches:
            model(input_ids=ids, attention_mask=real.long(), position_ids=positions, past_key_values=cache)
        eager = LlamaDecodeStep(model, caches[0], rows, key_mask)
        exact, padded = (StaticStep(model, DecodeWeights(model, torch.float32), rows=5, total_len=total) for _ in "ab")
        exact.load_prefill(caches[1], rows, key_mask, positions[:, -1] + 1)
        padded.load_prefill(caches[2], rows, key_mask, positions[:, -1] + 1)
        assert exact.lean and eager.lean
        token, last = torch.tensor([3, 4, 5, 6, 7]), positions[:, -1:]
        for t in range(1, 5):
            last = last + 1
            exact.tokens.copy_(token)
            padded.tokens.copy_(token)
            theirs = eager(token, last)
            torch.testing.assert_close(exact.forward(ids.shape[1] + t), theirs, atol=0, rtol=0)
            torch.testing.assert_close(padded.forward(total), theirs, atol=1e-6, rtol=1e-6)  # masked slots: zeros
            token = theirs.argmax(-1)


def _buffers(batch: Any) -> dict[str, int]:
    """data_ptr of every tensor the decode step reads or writes (the batch's and its step's attributes)."""
    ptrs = {}
    for owner, obj in (("batch", batch), ("step", batch.step)):
        for name, value in vars(obj).items():
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                if isinstance(item, torch.Tensor):
                    ptrs[f"{owner}.{name}[{i}]"] = item.data_ptr()
    return ptrs


class _Forbidden(torch.utils._python_dispatch.TorchDispatchMode):
    """Fails on any op that reads a tensor value back to the host (item, bool(), int(), float())."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        assert func is not torch.ops.aten._local_scalar_dense.default, f"host read: {func}"
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_step_unit_is_shape_stable_reads_nothing_back_and_repeats_exactly(dtype: torch.dtype) -> None:
    model = tiny("qwen3").to(dtype)
    made: list[Any] = []
    init = static_decode._Batch.__init__

    def keep(self, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        made.append(self)

    with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
        mp.setattr(static_decode._Batch, "__init__", keep)
        decode_static(model, DecodeWeights(model, dtype), PROMPTS, max_new_tokens=4, eos_ids=(1,), pad_id=0,
                      temperature=1.0, top_p=0.9, top_k=7, generator=torch.Generator().manual_seed(0))  # fmt: skip
        (batch,) = made
        batch.step_idx.zero_()  # reuse the finished call's buffers for two more steps from step 0
        before = _buffers(batch)
        state = {k: v.clone() for k, v in _tensors(batch).items()}
        tolist = torch.Tensor.tolist
        mp.setattr(torch.Tensor, "tolist", lambda self: (_ for _ in ()).throw(AssertionError("tolist in the step")))
        length = batch.step.total_len
        with _Forbidden():
            batch.unit(length)
            first = {k: v.clone() for k, v in _tensors(batch).items()}
            assert _buffers(batch) == before  # every buffer updated in place
            for name, value in _tensors(batch).items():  # back to the state before, then the same step again
                value.copy_(state[name])
            batch.unit(length)
        mp.setattr(torch.Tensor, "tolist", tolist)
        assert _buffers(batch) == before
        for name, value in _tensors(batch).items():
            assert torch.equal(value, first[name]), name  # a replay computes what the first run did
        assert int(batch.step_idx) == 1 and int(batch.step.slot) == state["step.slot"].item() + 1


def _tensors(batch: Any) -> dict[str, torch.Tensor]:
    out = {}
    for owner, obj in (("batch", batch), ("step", batch.step)):
        for name, value in vars(obj).items():
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(item, torch.Tensor):
                    out[f"{owner}.{name}" + (f"[{i}]" if isinstance(value, list) else "")] = item
    return out


class _CheckingGraphs(cuda_graphs.StepGraphs):
    """StepGraphs with a stand-in for capture: the first run of a key notes every buffer address, each later run
    (a replay) asserts that the step still works on exactly those buffers."""

    batches: list[Any] = []

    def __init__(self, *, enabled: bool) -> None:
        super().__init__(enabled=False)
        self.seen: dict[Any, dict[str, int]] = {}

    def run(self, key: Any, fn: Any) -> None:
        ptrs = _buffers(self.batches[-1])
        if key in self.seen:
            assert ptrs == self.seen[key], f"buffers moved since the capture of {key}"
            self.replays += 1
        else:
            self.seen[key] = ptrs
            self.captures += 1
        fn()

    def reset(self) -> None:
        self.seen.clear()


def test_graph_keys_see_the_same_buffers_at_every_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[_CheckingGraphs] = []
    init = static_decode._Batch.__init__

    def keep(self, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        _CheckingGraphs.batches.append(self)

    monkeypatch.setattr(static_decode._Batch, "__init__", keep)
    monkeypatch.setattr(
        static_decode, "StepGraphs", lambda enabled: made.append(_CheckingGraphs(enabled=enabled)) or made[-1]
    )
    eager, static = both(
        tiny("llama"), MANY, check_every=4, length_bucket=16, max_new_tokens=40, graphs=True, **SAMPLERS[1]
    )
    assert static == eager
    (graphs,) = made
    assert graphs.captures >= 3 and graphs.replays > graphs.captures  # several lengths and batch sizes, replayed


def test_step_graphs_capture_once_per_key_and_replay_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper's own bookkeeping with a stand-in CUDA: the first run is real, the capture runs nothing, later
    runs replay the recording."""
    events: list[str] = []

    class Graph:
        recorded: Any = None

        def replay(self) -> None:
            events.append("replay")
            self.recorded()

        def pool(self) -> str:
            return "pool"

    recording: list[Graph] = []

    @contextlib.contextmanager
    def graph(g: Graph, pool: Any = None, capture_error_mode: str = "global"):  # type: ignore[no-untyped-def]
        events.append(f"capture(pool={pool}, {capture_error_mode})")
        recording.append(g)
        yield

    fake = type("cuda", (), {})()
    fake.Stream = lambda: type("S", (), {"wait_stream": lambda self, other: None})()
    fake.current_stream = fake.Stream
    fake.stream = lambda s: contextlib.nullcontext()
    fake.CUDAGraph, fake.graph = Graph, graph
    monkeypatch.setattr(cuda_graphs.torch, "cuda", fake)
    x = torch.zeros(1)

    def step() -> None:
        if recording and recording[-1].recorded is None:  # inside the stand-in capture: record, do not run
            recording[-1].recorded = step
            return
        x.add_(1)

    runner = cuda_graphs.StepGraphs(enabled=True)
    for key in ("a", "a", "a", "b", "a", "b"):
        runner.run(key, step)
    assert x.item() == 6 and (runner.captures, runner.replays) == (2, 4)
    assert events == [
        "capture(pool=None, thread_local)", "replay", "replay", "capture(pool=pool, thread_local)", "replay", "replay"
    ]  # fmt: skip
    runner.reset()
    runner.run("a", step)
    assert runner.captures == 3 and x.item() == 7


def test_hf_backend_decode_modes_give_the_same_generations() -> None:
    tok = build_char_tokenizer()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      initializer_range=0.1, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    prompts = [tok.encode(t) for t in ["hello", "abc 12", "x", "The answer is 42.", "q: 3+4=?"] * 3]
    eager = HFRollout(model, tok, max_model_len=64, max_num_seqs=4, decode="eager")
    static = HFRollout(model, tok, max_model_len=64, max_num_seqs=4, decode="static")
    auto = HFRollout(model, tok, max_model_len=64, max_num_seqs=4)
    for sampling in (
        SamplingConfig(temperature=0.0, max_new_tokens=16),
        SamplingConfig(temperature=1.0, top_k=8, max_new_tokens=16, seed=3, stop=("e",)),
        SamplingConfig(temperature=0.9, top_p=0.8, max_new_tokens=16, seed=4, stop=("a b", "42")),
    ):
        want = eager.generate(prompts, sampling)
        assert static.generate(prompts, sampling) == want == auto.generate(prompts, sampling)
    assert any(g.finish_reason == "stop" for g in static.generate(prompts, sampling))
    cpu = torch.device("cpu")
    assert (resolve_decode("auto", model, cpu), resolve_decode("cuda_graph", model, cpu)) == ("eager", "static")
    assert static.weight_copy_bytes(cpu) == 0 and static._weights is not None
    static.sleep()
    assert static._weights is None
    assert table_unsupported(tiny("qwen2", attn="eager")) is not None
    assert resolve_decode("static", tiny("qwen2", attn="eager"), cpu) == "eager"


def test_top_k_keeps_the_k_most_likely_and_composes_with_top_p() -> None:
    import math

    p = [0.5, 0.3, 0.15, 0.05]
    logits = torch.tensor([[math.log(x) for x in p]] * 20000)
    g = torch.Generator().manual_seed(0)

    def freq(**kw: Any) -> torch.Tensor:
        picked = sample_next(logits, temperature=1.0, generator=g, **{"top_p": 1.0, **kw})
        return torch.bincount(picked, minlength=4).float() / logits.shape[0]

    torch.testing.assert_close(freq(top_k=2), torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.015, rtol=0)
    torch.testing.assert_close(freq(top_k=3), torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, atol=0.015, rtol=0)
    # top-k 3 keeps {0.5, 0.3, 0.15}; top-p 0.8 of that kept mass (0.76) keeps the first two
    torch.testing.assert_close(freq(top_k=3, top_p=0.8), torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.015, rtol=0)
    assert freq(top_k=1).tolist() == [1.0, 0.0, 0.0, 0.0]
    u = torch.rand((logits.shape[0], 1), generator=g)
    same = [sample_next(logits, temperature=1.0, top_p=1.0, top_k=k, uniforms=u) for k in (0, 4, 9)]
    assert torch.equal(same[0], same[1]) and torch.equal(same[0], same[2])  # k >= vocabulary: top-k is off


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "llama"])
def test_bf16_static_equals_eager_when_it_attends_exactly_the_filled_slots(model_type: str) -> None:
    # with length buckets the masked slots change bf16 rounding (and near-ties of a random model can flip); one slot
    # per bucket is the eager arithmetic: the same greedy completions
    model = tiny(model_type).to(torch.bfloat16)
    common = dict(max_new_tokens=20, eos_ids=(1,), pad_id=0, temperature=0.0, top_p=1.0, generator=None)
    with torch.inference_mode():
        eager = decode_batch(model, MANY, compact_fraction=None, **common)
        static = decode_static(model, DecodeWeights(model, torch.bfloat16), MANY, length_bucket=1, **common)
    assert static == eager


def test_a_failed_capture_turns_graphs_off_and_the_decode_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    @contextlib.contextmanager
    def graph(g: Any, pool: Any = None, capture_error_mode: str = "global"):  # type: ignore[no-untyped-def]
        raise RuntimeError("operation not permitted when stream is capturing\nmore")
        yield  # pragma: no cover

    fake = type("cuda", (), {})()
    fake.Stream = lambda: type("S", (), {"wait_stream": lambda self, other: None})()
    fake.current_stream = fake.Stream
    fake.stream = lambda s: contextlib.nullcontext()
    fake.CUDAGraph, fake.graph = object, graph
    monkeypatch.setattr(cuda_graphs.torch, "cuda", fake)
    x = torch.zeros(1)
    runner = cuda_graphs.StepGraphs(enabled=True)
    with pytest.warns(UserWarning, match="decoding on without graphs"):
        runner.run("a", lambda: x.add_(1))
    for _ in range(3):
        runner.run("a", lambda: x.add_(1))
    assert x.item() == 4 and not runner.enabled and runner.captures == 0
    assert runner.failure == "RuntimeError: operation not permitted when stream is capturing"


def test_decode_stats_count_the_steps_of_a_call() -> None:
    model = tiny("qwen2")
    stats: dict[str, Any] = {}
    with torch.inference_mode():
        out = decode_static(model, DecodeWeights(model, torch.float32), PROMPTS, max_new_tokens=7, eos_ids=(1,),
                            pad_id=0, temperature=0.0, top_p=1.0, generator=None, stats=stats)  # fmt: skip
    assert stats == {"steps": 7, "captures": 0, "replays": 0} and max(len(r) for r in out) <= 7
