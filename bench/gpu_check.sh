#!/usr/bin/env bash
# GPU check of the gpt-124m preset (bench/gpu_check.py): trains the 124M model on synthetic tokens,
# prints tokens/s and MFU, runs one GRPO step; exit 1 on a NaN/inf loss, 124 past the time limit.
#
#   bench/gpu_check.sh                          # 30 steps of 0.5M tokens, torch.compile as the preset says
#   bench/gpu_check.sh --steps 10 --no-compile --json gpu.json
#   GPU_CHECK_SECONDS=600 bench/gpu_check.sh --steps 60
#
# PYTHON picks the interpreter (default .venv/bin/python); GPU_CHECK_SECONDS the limit (default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
LIMIT="${GPU_CHECK_SECONDS:-300}"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "bench/gpu_check.sh: $PY sees no CUDA GPU (torch.cuda.is_available() is False); install a CUDA" \
         "build of torch (make run TORCH_SPEC=torch), or run the CPU version: $PY bench/gpu_check.py --tiny --steps 2" >&2
    exit 3
fi
# SIGINT first, so DeepSpeed and the check stop cleanly; SIGKILL 20 s later if they do not.
exec timeout --signal=INT --kill-after=20 "$LIMIT" "$PY" bench/gpu_check.py "$@"
