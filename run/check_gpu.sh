#!/usr/bin/env bash
# bet_fairseq.hf on a CUDA GPU in one go (under 10 minutes): the fused and compiled paths of every family in float16
# and bfloat16 against float32 on the CPU and against eager, the compiled static cache against the dynamic one, then
# the speed ratios (BET / stock training step, eager and compiled; static / dynamic cache generation). The logic is
# run/check_gpu.py (its --device cpu dry run is what tests/hf runs). No GPU: a non-zero exit and a message, never a
# skip.
#
#   run/check_gpu.sh [OUT_DIR]          # the output also goes to OUT_DIR/check_gpu.log (default: ./check_gpu_out)
set -euo pipefail
OUT=${1:-check_gpu_out}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python}
mkdir -p "$OUT"
if ! reason=$("$PY" - 2>&1 <<'PYEOF'
import sys
try:
    import torch
except ImportError as err:
    sys.exit(f"{sys.executable} cannot import torch ({err}): set PYTHON to the project's environment")
if not torch.cuda.is_available():
    sys.exit(f"no CUDA GPU visible to torch {torch.__version__}: this script checks the GPU paths and runs only on a "
             "machine with one (python run/check_gpu.py --device cpu is the CPU dry run)")
PYEOF
); then
    echo "check_gpu.sh: FAILED: $reason" >&2
    exit 2
fi
"$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__)' | tee "$OUT/check_gpu.log"
# A run past the limit is a failure too (exit 124), not a partial pass.
timeout "${CHECK_GPU_TIMEOUT:-570}" "$PY" "$HERE/check_gpu.py" --device cuda 2>&1 | tee -a "$OUT/check_gpu.log"
echo "check_gpu.sh: passed; log in $OUT/check_gpu.log"
