#!/usr/bin/env bash
# Python packages the GPU image lacks (see /work/.library/device/KINDS.md's package list), as wheels for its
# python3 (CPython 3.12, x86-64 manylinux) in .whl/ (or $WHEEL_DIR), for gpu_session.sh to unpack there:
# pydantic and its parts (grpo_pilot's models), trl, datasets, dill and multiprocess (engine_gpu.py's TRL rows),
# transformers 5.19.0 (the image has 5.17; the H200 measurements of 2026-11-26 ran 5.19.0), optuna and colorlog
# (grpo-plan, when the session plans on the machine: another GPU kind, or a committed plan it cannot load). ~18 MB.
# Versions: those of this repo's development environment. Run it from the repo, with a python that has pip:
#   PYTHON=.venv/bin/python bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${WHEEL_DIR:-.whl}"
if [ "$dest" = ".whl" ]; then  # keep the wheels out of git; the device tool carries them by name
  exclude="$(git rev-parse --git-path info/exclude)"
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
fi
"${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 transformers==5.19.0 optuna==5.0.0 colorlog==6.12.0
ls -l "$dest"
