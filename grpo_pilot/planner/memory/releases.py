"""Where verl's workers empty the CUDA cache beside `Knobs.release_cache` (pure functions).

`Knobs.release_cache` names the releases of the rollout machinery (memory/allocator.py `RELEASED_AFTER`); verl's
worker methods add their own, which depend on the backend and the offload flags (`also_released` of
memory/allocator.py). Every rule below is a call read in volcengine/verl (committer times in UTC); the planner's
phases are allocator.py `STEP_ORDER`. All of verl's roles on a GPU run in one process (ray_trainer.py
`init_workers` fuses the actor/rollout/ref, critic and reward-model workers of the one `global_pool` with
`create_colocated_worker_cls`, single_controller/ray/base.py; main_ppo.py maps every role to "global_pool"; the
same at 30911f133 and b178a3cd5), so these releases act on one caching allocator.

FSDP (fsdp_workers.py):
- actor with `param_offload`: `compute_log_prob` and `update_actor` end with `offload_fsdp_model_to_cpu`, whose
  `empty_cache=True` default calls `empty_cache()` (utils/fsdp_utils.py since 9db52329f #284; fsdp_workers.py
  @49b08e95 L620, L701; @b178a3cd5 L1033-1034, L928-929). The log-prob phase is released only when its last
  pass is the actor's (ray_trainer runs the reference after the old-policy pass: @b178a3cd5 L1502, L1538): no
  reference, or a LoRA reference (`compute_ref_log_prob` → `compute_log_prob` with the adapters disabled). A
  separate reference ends without one (`compute_ref_log_prob` @b178a3cd5 L1041-1072: an FSDP CPUOffload module,
  no offload call). The weight sync is released too: the actor is offloaded after the sync inside the sharding
  manager (fsdp_workers.py@3fc3e2b74 L482-483 `generate_sequences`; fsdp_vllm.py@aacd3660f L121-123) or during
  it (fsdp_workers.py@b178a3cd5 `rollout_mode` L720-721) — it matters where the policy itself does not release
  there (`before_sync_after_rollout`: verl #575 to #1081);
- critic with `critic_param_offload`: `compute_values` and `update_critic` end with
  `offload_fsdp_model_to_cpu(self.critic_module)` (@9db52329f L779, L810; @b178a3cd5 L1554-1555, L1583-1584);
  `offload_fsdp_optimizer` never empties the cache (utils/fsdp_utils.py since 9db52329f). Before 51a5ff99
  (#556, the `each_phase` era) `update_critic` also ended with `torch.cuda.empty_cache()` whatever the flags
  (@9db52329f L813), `compute_values` never did.
Megatron (megatron_workers.py, utils/megatron_utils.py):
- `update_actor`, `compute_log_prob`, `compute_ref_log_prob` and `generate_sequences` each end with
  `torch.cuda.empty_cache()` (@818e4de2f L347, L404, L389, L369; #556 and #575 touched only the FSDP workers),
  `aggressive_empty_cache(force_sync=True)` since dc8b5076c (#2678) (@b178a3cd5 L782, L905, L858, L832), whatever
  the offload flags; MegatronPPOActor.compute_log_prob and update_policy end with one too (actor/megatron_actor.py
  @b178a3cd5 L326, L842);
- the weight sync: since dc8b5076c (#2678) the sharding manager (later `rollout_mode`) empties the cache after
  loading the weights (sharding_manager/megatron_vllm.py@dc8b5076c L176; megatron_workers.py@b178a3cd5 L733): the
  `verl` policy, which --from-verl picks from that commit on (verl_versions.CHANGES "megatron_sync_release";
  `after_rollout` before it). Before it, from cc8fca504 (#1162), only `param_offload` / `optimizer_offload` did,
  through `offload_megatron_model_to_cpu` / `offload_megatron_optimizer` (each ends with `gc.collect()` and
  `torch.cuda.empty_cache()`, utils/megatron_utils.py@cc8fca504 L274-275, L376-377) called right after the sync
  inside the sharding manager (megatron_workers.py@cc8fca504 L420-424 `generate_sequences`).
Not modelled: verl's reward-model worker (its pass is counted in `values`: memory/critic_plan.py), which ended
`compute_rm_score` with `empty_cache()` before 3fc3e2b7 (#575); the vendored vLLM (<= 0.6.3) sharding manager,
which never released after the sync from #575 until 52065c64 (#2257) dropped it.
"""

from __future__ import annotations

from grpo_pilot.planner.config import ReleasePolicy

VERL = "verl"  # the executor whose workers these rules describe (planner/traits.py)


def fsdp_actor_releases(*, param_offload: bool, reference_pass_last: bool) -> frozenset[str]:
    """The phases after which verl's FSDP actor empties the cache beside the policy (module docstring)."""
    if not param_offload:
        return frozenset()
    if reference_pass_last:
        return frozenset({"update", "weight_sync"})
    return frozenset({"log_prob", "update", "weight_sync"})


def fsdp_critic_releases(*, critic_param_offload: bool, release_cache: ReleasePolicy) -> frozenset[str]:
    """The phases after which verl's FSDP critic empties the cache (module docstring)."""
    if critic_param_offload:
        return frozenset({"values", "critic_update"})
    if release_cache == "each_phase":  # update_critic's own empty_cache() before #556
        return frozenset({"critic_update"})
    return frozenset()


def megatron_releases(*, param_offload: bool, optimizer_offload: bool) -> frozenset[str]:
    """The phases after which verl's Megatron workers empty the cache beside the policy (module docstring)."""
    every_method = frozenset({"log_prob", "update", "rollout"})
    return every_method | ({"weight_sync"} if (param_offload or optimizer_offload) else set())
