#!/usr/bin/env bash
# The four example plans, made by grpo-plan from the tiny model in this directory (run from the repo root).
# Re-run after a planner change: the plans record the planner's predictions, and grpo-run re-checks them
# (a peak that moved by more than 10% is refused until re-planned). tests/tuner/test_prior.py checks that
# plan.json is what the current planner gives for its inputs.
set -euo pipefail
cd "$(dirname "$0")/../.."
common=(--model examples/tiny --prompts-per-step 8 --mini-batch 8 --n 4 --prompt-len 32 --response-len 16
        --pin rollout_backend=hf)
grpo-plan "${common[@]}" --gpus 1xcpu --no-kl --out examples/tiny/plan.json
grpo-plan "${common[@]}" --gpus 2xcpu --no-kl --pin placement=colocated --out examples/tiny/plan-2xcpu-colocated.json
grpo-plan "${common[@]}" --gpus 2xcpu --no-kl --pin placement=split --out examples/tiny/plan-2xcpu-split.json
grpo-plan "${common[@]}" --gpus 1xcpu --kl --lora-rank 8 --lora-alpha 16 --out examples/tiny/plan-lora.json
