"""Search-R1's `rollout.n_agent` (planner/verl_batches.py): the group size of the fork's GRPO.

Search-R1@ba78b68 ray_trainer.py line 702 repeats each prompt n_agent times before generation, and its workers
scale the mini- and micro-batches by rollout.n only (fsdp_workers.py lines 97-109): the step has n_agent times
the sequences, while a GPU's micro-batch is what the global key gives."""

from __future__ import annotations

from grpo_pilot.planner.from_verl import verl_launch

SEARCH_R1 = {  # the batch keys of Search-R1's train_grpo.sh, on 8 GPUs
    "algorithm.adv_estimator": "grpo",
    "data.train_batch_size": "512",
    "data.max_prompt_length": "4096",
    "data.max_response_length": "500",
    "actor_rollout_ref.model.path": "Qwen/Qwen2.5-7B",
    "actor_rollout_ref.actor.use_kl_loss": "true",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "256",
    "actor_rollout_ref.actor.ppo_micro_batch_size": "64",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "128",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "128",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
    "trainer.n_gpus_per_node": "8",
}


def test_n_agent_multiplies_the_group_not_the_micro_batches() -> None:
    plain = verl_launch(SEARCH_R1, version="2025-01-23")
    agents = verl_launch(SEARCH_R1 | {"actor_rollout_ref.rollout.n_agent": "5"}, version="2025-01-23")
    assert (plain.workload["n"], agents.workload["n"]) == (1, 5)
    assert agents.workload["prompts_per_step"] == plain.workload["prompts_per_step"] == 512
    assert agents.workload["mini_batch_prompts"] == 256
    # the micro-batches follow rollout.n (1) whatever n_agent is: 64 // 8 and 128 // 8 per GPU
    assert agents.knobs["micro_batch_size_per_gpu"] == plain.knobs["micro_batch_size_per_gpu"] == 8
    assert agents.knobs["log_prob_micro_batch_size_per_gpu"] == plain.knobs["log_prob_micro_batch_size_per_gpu"] == 16
    assert any(n.startswith("rollout.n_agent=5 (Search-R1)") for n in agents.notes)
    assert not any("n_agent" in n for n in plain.notes)
