#!/usr/bin/env bash
# The four example plans (run from anywhere; paths are the repo's).
#   bash examples/tiny/make_plans.sh            re-evaluate each plan at the knobs it records with today's planner
#   bash examples/tiny/make_plans.sh --search   make them from scratch: the grpo-plan commands below (a new search
#                                               may choose other knobs than the ones the tests sweep around)
# Re-run after a planner change: the plans record the planner's predictions, grpo-run re-checks them (a peak that
# moved by more than 10 % is refused until re-planned), and tests/tuner/test_prior.py checks that plan.json is what
# the current planner gives for its inputs and knobs.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = "--search" ]; then
  common=(--model examples/tiny --prompts-per-step 8 --mini-batch 8 --n 4 --prompt-len 32 --response-len 16
          --pin rollout_backend=hf)
  grpo-plan "${common[@]}" --gpus 1xcpu --no-kl --out examples/tiny/plan.json
  grpo-plan "${common[@]}" --gpus 2xcpu --no-kl --pin placement=colocated --out examples/tiny/plan-2xcpu-colocated.json
  grpo-plan "${common[@]}" --gpus 2xcpu --no-kl --pin placement=split --out examples/tiny/plan-2xcpu-split.json
  grpo-plan "${common[@]}" --gpus 1xcpu --kl --lora-rank 8 --lora-alpha 16 --out examples/tiny/plan-lora.json
  exit 0
fi
python - <<'PY'
from grpo_pilot.planner.make_plan import evaluate
from grpo_pilot.planner.plan import load_plan, save_plan
from grpo_pilot.planner.recheck import plan_inputs

for name in ("plan", "plan-2xcpu-colocated", "plan-2xcpu-split", "plan-lora"):
    path = f"examples/tiny/{name}.json"
    old = load_plan(path)
    new = evaluate(plan_inputs(old), old.knobs)
    search = ("search_trials", "search_seed", "feasible_trials", "refine_evaluations")  # how the knobs were found
    searched = {k: getattr(old.provenance, k) for k in search}
    new = new.model_copy(update={"provenance": new.provenance.model_copy(update=searched)})
    save_plan(new, path)
    print(f"{path}: peak {old.peak_gpu_bytes:,} -> {new.peak_gpu_bytes:,} B, step {old.predicted_step_s:.4f} -> "
          f"{new.predicted_step_s:.4f} s")
PY
