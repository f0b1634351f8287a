"""Several workers on Ray (CPU, gloo): colocated and split runs of the tiny example, the 2-rank FSDP2 update
against the 1-process one, offload, typed out-of-memory failures, and a killed worker resumed.

One local Ray cluster (4 logical CPUs) serves the whole module; each run starts its own worker processes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from grpo_pilot.engine.actor import LossSettings, Sample  # noqa: E402
from grpo_pilot.engine.failures import OutOfMemoryRunError  # noqa: E402
from grpo_pilot.engine.loop import run  # noqa: E402
from grpo_pilot.engine.run_config import RunConfig  # noqa: E402
from grpo_pilot.engine.settings import ActorSettings  # noqa: E402
from grpo_pilot.planner.plan import load_plan  # noqa: E402

COLOCATED, SPLIT = "examples/tiny/plan-2xcpu-colocated.json", "examples/tiny/plan-2xcpu-split.json"
SETTINGS = dict(dataset="examples/tiny/prompts.jsonl", reward="char_fraction:char=a", lr=2e-3, threads=1)


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local cluster for the module; `run` joins it instead of starting its own."""
    started = not ray.is_initialized()
    if started:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's own Ray actor below
    yield
    if started:
        ray.shutdown()


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def test_colocated_two_workers_run_the_tiny_example(tmp_path):
    out = tmp_path / "run"
    result = run(load_plan(COLOCATED), RunConfig(output_dir=str(out), steps=3, **SETTINGS))
    rows = lines(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and result.last_step == 3
    assert all(0.0 <= r["reward_mean"] <= 1.0 and r["grad_norm"] > 0 and r["num_updates"] == 1 for r in rows)
    workers = json.loads((out / "workers.json").read_text())
    assert [w["role"] for w in workers] == ["trainer+rollout"] * 2 and len({w["pid"] for w in workers}) == 2
    profile = json.loads((out / "profile.json").read_text())
    assert profile["num_workers"] == 2 and [r["worker"] for r in profile["ranks"]] == [
        "worker 0 (trainer+rollout)",
        "worker 1 (trainer+rollout)",
    ]
    for phase in ("weight_sync", "rollout", "update"):
        peaks = [r["phases"][phase]["measured_peak_bytes"] for r in profile["ranks"]]
        assert profile["phases"][phase]["measured_peak_bytes"] == max(peaks) > 0  # aggregate = max over ranks
    # each worker generated on its own fp32 replica (the trainer's module is sharded): the parameter bytes the engine
    # built are the plan's item, resident in every phase of both workers, and no mismatch note is left
    plan = load_plan(COLOCATED)
    replica = profile["rollout_replica_bytes"]
    assert [w["rollout_replica_bytes"] for w in workers] == [replica] * 2 and replica > 0
    for phase in ("weight_sync", "rollout", "log_prob", "update"):
        assert plan.phases[phase].items["hf_replica_weights"] == replica, phase
    assert not any("own copy of the weights" in n or "replica" in n for n in profile["notes"])
    assert len(lines(out / "lengths.jsonl")) == 3 * 32
    assert (out / "checkpoints" / "step-000003" / "actor" / ".metadata").exists()


def test_split_pools_one_rollout_and_one_training_worker(tmp_path):
    out = tmp_path / "run"
    run(load_plan(SPLIT), RunConfig(output_dir=str(out), steps=3, **SETTINGS))
    rows = lines(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["grad_norm"] > 0 for r in rows)
    profile = json.loads((out / "profile.json").read_text())
    rollout, trainer = profile["ranks"]
    assert rollout["worker"] == "worker 0 (rollout)" and trainer["worker"] == "worker 1 (trainer)"
    assert {"rollout", "weight_sync"} <= set(rollout["phases"]) and "update" not in rollout["phases"]
    assert {"update", "weight_sync"} <= set(trainer["phases"]) and "rollout" not in trainer["phases"]
    # the rollout worker's replica is the plan's item on the rollout GPU; the training worker holds none
    workers = json.loads((out / "workers.json").read_text())
    assert [w["rollout_replica_bytes"] for w in workers][1] == 0
    replica = load_plan(SPLIT).phases["rollout"].items["hf_replica_weights"]
    assert profile["rollout_replica_bytes"] == workers[0]["rollout_replica_bytes"] == replica > 0
    assert not any("replica" in n or "own copy of the weights" in n for n in profile["notes"])
    # the rollout worker generated with the trainer's weights: its completions changed after the updates
    assert len({tuple(r["prompt_indices"]) for r in rows}) == 3


# ---- the 2-rank FSDP2 update against the 1-process update, on a fixed batch -------------------------


def fixed_batch(seed: int = 0, num: int = 12) -> tuple[list[Sample], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(num):
        p, r = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 11, (1,), generator=g))
        ids = torch.randint(3, 100, (p + r,), generator=g).tolist()
        samples.append(Sample(tuple(ids[:p]), tuple(ids[p:])))
    return samples, torch.linspace(-1.5, 2.0, num)


def rank_update(master, rank: int, world: int, settings: ActorSettings, loss: LossSettings) -> dict:
    """In a Ray actor: this rank's share of the fixed batch through `Actor.update`; full gradients and metrics."""
    import datetime

    import torch.distributed as dist

    from grpo_pilot.engine.actor import Actor
    from grpo_pilot.engine.model_factory import build_model
    from grpo_pilot.engine.partition import balance_by_tokens

    torch.set_num_threads(1)
    if world > 1:
        store = dist.TCPStore(master[0], master[1], world, rank == 0, timeout=datetime.timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        actor = Actor(build_model("examples/tiny", seed=0), device=torch.device("cpu"), settings=settings,
                      world_size=world, rank=rank)  # fmt: skip
        samples, adv = fixed_batch()
        share = balance_by_tokens([s.num_tokens for s in samples], world)[rank]
        mine = [samples[i] for i in share]
        ref = actor.log_probs(mine, ref=True) if settings.with_ref else None
        logprobs = actor.log_probs(mine)
        grads: dict[str, torch.Tensor] = {}
        step = actor.optimizer.step

        def capture(*a, **kw):
            for name, p in actor.policy.named_parameters():
                if p.grad is None:  # frozen (a LoRA run's base): no gradient
                    continue
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                grads[name] = g.detach().clone()
            return step(*a, **kw)

        actor.optimizer.step = capture
        metrics = actor.update(
            mine,
            adv[share],
            loss,
            ref_logprobs=ref,
            global_num_tokens=sum(len(s.response_ids) for s in samples),
            global_num_seqs=len(samples),
        )
        after = actor.log_probs(mine)  # the adapted policy after the step (adapters only moved, for LoRA)
        return {
            "metrics": metrics,
            "grads": grads,
            "logprobs": dict(zip(share, logprobs)),
            "after": dict(zip(share, after)),
            "ref": dict(zip(share, ref)) if ref is not None else {},
        }
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@ray.remote(num_cpus=1)
class _Rank:
    def address(self):
        from grpo_pilot.engine.worker import free_address

        return free_address()

    def run(self, *args):
        return rank_update(*args)


@pytest.fixture(scope="module")
def ranks():
    return [_Rank.remote(), _Rank.remote()]


def _update(ranks, world: int, settings: ActorSettings, loss: LossSettings) -> dict:
    master = ray.get(ranks[0].address.remote())
    results = ray.get([r.run.remote(master, k, world, settings, loss) for k, r in enumerate(ranks[:world])])
    merged = dict(results[0])
    for key in ("logprobs", "after", "ref"):
        merged[key] = {i: lp for res in results for i, lp in res[key].items()}
    return merged


def _assert_same_update(got: dict, want: dict) -> None:
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "num_tokens"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-5, abs=1e-7), key
    assert set(got["grads"]) == set(want["grads"]) and got["grads"]
    for name, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert sorted(got["logprobs"]) == list(range(12))
    for i, lp in want["logprobs"].items():
        torch.testing.assert_close(got["logprobs"][i], lp, rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    ("agg", "budget"), [("token-mean", 40), ("seq-mean-token-mean", 24), ("seq-mean-token-sum-norm", None)]
)
def test_two_rank_fsdp2_update_equals_the_one_process_update(ranks, agg, budget):
    settings = ActorSettings(
        max_token_len=budget, micro_batch_size=3, log_prob_max_token_len=40, gradient_checkpointing=False,
        lr=1e-3, max_grad_norm=1e9,
    )  # fmt: skip
    loss = LossSettings(loss_agg_mode=agg, loss_scale_len=10)
    one, two = _update(ranks, 1, settings, loss), _update(ranks, 2, settings, loss)
    # different micro-batches on each side (rank shares, equalised counts): the same mini-batch gradient
    _assert_same_update(two, one)
    assert two["metrics"]["grad_norm"] > 0


def test_lora_under_fsdp2_on_two_ranks_equals_one_process(ranks):
    """peft adapters inside fully_shard'ed layers: the frozen base gets no gradient, the adapters' gradients, the
    reference pass (adapters disabled) and the policy after the step equal the one-process run."""
    from grpo_pilot.planner.adapters import flag_adapter

    settings = ActorSettings(max_token_len=40, log_prob_max_token_len=40, gradient_checkpointing=True, lr=1e-2,
                             max_grad_norm=1e9, with_ref=True, adapter=flag_adapter(4, alpha=8.0))  # fmt: skip
    loss = LossSettings(loss_agg_mode="token-mean", kl_coef=0.1)
    one, two = _update(ranks, 1, settings, loss), _update(ranks, 2, settings, loss)
    _assert_same_update(two, one)
    assert set(one["grads"]) and all(".lora_A." in n or ".lora_B." in n for n in one["grads"])
    for i, lp in one["after"].items():
        torch.testing.assert_close(two["after"][i], lp, rtol=0, atol=2e-5)
        torch.testing.assert_close(two["ref"][i], one["ref"][i], rtol=0, atol=2e-5)
    assert max(float((one["after"][i] - one["ref"][i]).abs().max()) for i in one["after"]) > 1e-3


def test_offload_gives_the_same_update_on_one_and_two_ranks(ranks):
    plain = ActorSettings(max_token_len=40, log_prob_max_token_len=40, gradient_checkpointing=True, lr=1e-3,
                          max_grad_norm=1e9, with_ref=True)  # fmt: skip
    offload = plain.model_copy(update={"param_offload": True, "optimizer_offload": True, "ref_param_offload": True})
    loss = LossSettings(loss_agg_mode="seq-mean-token-mean", kl_coef=0.1)
    want = _update(ranks, 1, plain, loss)
    _assert_same_update(_update(ranks, 1, offload, loss), want)  # one rank: FSDP2 CPUOffloadPolicy on its own
    _assert_same_update(_update(ranks, 2, offload, loss), want)


# ---- failures ------------------------------------------------------------------------------------------


def test_a_cluster_smaller_than_the_plan_is_refused_before_any_worker_starts(tmp_path):
    from grpo_pilot.errors import InputError
    from grpo_pilot.hardware import parse_cluster

    plan = load_plan(COLOCATED)
    eight = plan.model_copy(update={"cluster": parse_cluster("8xcpu")})  # this module's cluster has 4 CPUs
    with pytest.raises(InputError, match=r"has 4 CPU\(s\); the plan needs 8 CPU workers"):
        run(eight, RunConfig(output_dir=str(tmp_path / "run"), steps=1, **SETTINGS))
    assert not (tmp_path / "run" / "workers.json").exists() and ray.is_initialized()  # the shared session is kept
    gpus = plan.model_copy(update={"cluster": parse_cluster("2xH100")})  # a GPU plan needs a GPU per worker
    with pytest.raises(InputError, match=r"has 0 GPU\(s\); the plan needs 2"):
        run(gpus, RunConfig(output_dir=str(tmp_path / "gpu"), steps=1, **SETTINGS))


def test_memory_cap_fails_with_the_worker_phase_and_step(tmp_path):
    out = tmp_path / "run"
    cfg = RunConfig(output_dir=str(out), steps=2, memory_cap_bytes=3 << 20, **SETTINGS)  # 3 MiB: the update needs more
    with pytest.raises(OutOfMemoryRunError) as info:
        run(load_plan(COLOCATED), cfg)
    failure = json.loads((out / "failure.json").read_text())
    assert failure["kind"] == "oom" and failure["step"] == 1
    assert failure["phase"] in ("weight_sync", "rollout", "update")
    assert failure["worker"].startswith("worker ") and failure["worker"] in info.value.message
    assert info.value.worker == failure["worker"] and info.value.phase == failure["phase"]


def _cli(plan: str, out: Path, *extra: str) -> list[str]:
    args = [sys.executable, "-c", "from grpo_pilot.cli import run_entry; run_entry()", plan, "--out", str(out), "-q"]
    for key, value in dict(SETTINGS, steps=6, seed=3, checkpoint_every=2, cpu_memory="rss").items():
        args += ["--set", f"{key}={value}"]
    return args + list(extra)


@pytest.mark.slow
def test_killed_worker_stops_the_run_and_resume_matches_an_uninterrupted_run(tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cli(COLOCATED, killed), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while len(lines(killed / "metrics.jsonl")) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1]
    victim = json.loads((killed / "workers.json").read_text())[1]
    os.kill(victim["pid"], signal.SIGKILL)  # step 3 logged, checkpoint 2 written: step 4 is under way
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 1, stderr
    assert "worker 1 (trainer+rollout) died" in stderr and "--resume" in stderr
    failure = json.loads((killed / "failure.json").read_text())
    assert failure["kind"] == "worker_died" and failure["worker"] == "worker 1 (trainer+rollout)"
    assert failure["step"] is not None and failure["step"] >= 3
    assert 3 <= len(lines(killed / "metrics.jsonl")) < 6

    resumed = subprocess.run(_cli(COLOCATED, killed, "--resume"), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert not (killed / "failure.json").exists()

    reference = tmp_path / "reference"
    cfg = RunConfig(output_dir=str(reference), **dict(SETTINGS, steps=6, seed=3, checkpoint_every=2, cpu_memory="rss"))
    run(load_plan(COLOCATED), cfg)
    got, want = lines(killed / "metrics.jsonl"), lines(reference / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, 7)) == [r["step"] for r in want]
    assert [r["prompt_indices"] for r in got] == [r["prompt_indices"] for r in want]
    for key in ("reward_mean", "response_len_mean", "loss", "entropy"):
        assert [r[key] for r in got] == pytest.approx([r[key] for r in want], abs=1e-6), key
    assert [r["grad_norm"] for r in got] == pytest.approx([r["grad_norm"] for r in want], rel=1e-4)
    assert lines(killed / "lengths.jsonl") == lines(reference / "lengths.jsonl")


@pytest.mark.vllm
@pytest.mark.parametrize("rollout_tp", [1, 2])
def test_vllm_rollout_on_two_colocated_workers(tmp_path, rollout_tp):
    """Each worker's in-process vLLM joins the training group (external_launcher): two replicas, or one of TP 2."""
    pytest.importorskip("vllm")
    plan = load_plan(COLOCATED)
    plan = plan.model_copy(update={"knobs": plan.knobs.model_copy(update={"rollout_tp": rollout_tp})})
    out = tmp_path / "run"
    cfg = RunConfig(output_dir=str(out), steps=2, rollout_backend="vllm", **SETTINGS)
    run(plan, cfg)
    rows = lines(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reward_mean"] <= 1.0 and r["grad_norm"] > 0 and r["phase_s"]["weight_sync"] > 0 for r in rows)
    profile = json.loads((out / "profile.json").read_text())
    # vLLM-CPU preallocates its KV cache on every worker: each rank's tracker sees it
    assert all(r["phases"]["rollout"]["measured_peak_bytes"] >= 1 << 30 for r in profile["ranks"])
