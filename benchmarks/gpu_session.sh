#!/usr/bin/env bash
# The one GPU session (benchmarks/gpu_session.py), run from a copy of this repo on the lent GPU machine.
#
#   here, before the session (pydantic, trl, datasets, ... as py3.12 wheels in .whl/, git-ignored):
#       bash benchmarks/gpu_wheels.sh
#   the device tool's command (carry [".whl"], timeout_s 600; about 8 minutes of tasks on an H100):
#       bash benchmarks/gpu_session.sh
#   what comes back: $OUT/session.json (every task's results) and $OUT/session.log
#
# No pip install of grpo-pilot itself: PYTHONPATH points at this checkout (the image already has torch,
# transformers, typer, rich, numpy, pandas); the carried wheels are unpacked into /tmp/site.
# GPU_SESSION_BUDGET_S (default 450) bounds the tasks' wall time; extra arguments go to gpu_session.py
# (e.g. --only engine-0.5b,run-qwen2.5-0.5b).
set -uo pipefail
cd "$(dirname "$0")/.."
site=""
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_session.sh: installing .whl/ failed" >&2; exit 1; }
  site=/tmp/site
fi
export PYTHONPATH="$PWD${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out="${OUT:-$PWD/gpu-session-out}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
python3 benchmarks/gpu_session.py --out "$out" --budget-s "${GPU_SESSION_BUDGET_S:-450}" "$@"
