"""Pure estimation and search: no torch, no vLLM, no Ray. The front door of the planner.

    from grpo_pilot.planner import PlanInputs, Workload, Knobs, model_ref, make_plan, evaluate
    from grpo_pilot.hardware import parse_cluster
    from grpo_pilot.profiles import resolve_model

    inputs = PlanInputs(model=model_ref(resolve_model("qwen-32b")), cluster=parse_cluster("8xA100-80G"))
    plan = make_plan(inputs)                      # search the knobs; a frozen Plan (plan.json)
    plan = evaluate(inputs, Knobs(rollout_tp=4))  # exactly these knobs

The verbs: `estimate_memory` / `estimate_time` give one configuration's numbers; `assess` adds every rule's
check (the search's inner loop); `evaluate` turns one configuration into a `Plan` (with its worst case,
verdict and the engine's numbers); `make_plan` searches first; `recheck` re-assesses a plan file before a
run; `verl_command` / `trl_config_text` export a plan. The launch families: `Workload(algorithm="ppo",
critic=CriticSettings(...))`, `Workload(adapter=AdapterSettings(...))`, `Knobs(strategy="megatron", ...)`,
`Knobs(rollout_backend="sglang")`; `unsupported` says what an executor cannot run (docs/families.md).
"""

from grpo_pilot.planner.adapters import AdapterSettings
from grpo_pilot.planner.calibration import choose_calibration, load_calibration
from grpo_pilot.planner.config import Knobs, Target, Workload
from grpo_pilot.planner.critic_settings import CriticSettings
from grpo_pilot.planner.estimate import estimate_memory
from grpo_pilot.planner.evaluate import Assessment, PlanInputs, assess, model_ref
from grpo_pilot.planner.export import trl_config_text, verl_command
from grpo_pilot.planner.make_plan import evaluate, make_plan
from grpo_pilot.planner.plan import Plan, Verdict, load_plan, save_plan
from grpo_pilot.planner.recheck import recheck
from grpo_pilot.planner.support import unsupported
from grpo_pilot.planner.timing import estimate_time

__all__ = [
    "AdapterSettings",
    "Assessment",
    "CriticSettings",
    "Knobs",
    "Plan",
    "PlanInputs",
    "Target",
    "Verdict",
    "Workload",
    "assess",
    "choose_calibration",
    "estimate_memory",
    "estimate_time",
    "evaluate",
    "load_calibration",
    "load_plan",
    "make_plan",
    "model_ref",
    "recheck",
    "save_plan",
    "trl_config_text",
    "unsupported",
    "verl_command",
]
