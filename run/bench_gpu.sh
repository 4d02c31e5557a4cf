#!/usr/bin/env bash
# BET(SF) vs the vanilla transformer on a GPU in under 5 minutes: the whole-model speed benchmark (enwik8-size
# language model, blocks 512 and 1024; IWSLT-size translation) and the attention-core sweep T = 128 .. 8192 in
# float16 and bfloat16 (forward, backward, peak memory per T).
#
#   run/bench_gpu.sh OUT_DIR                 # CUDA
#   run/bench_gpu.sh OUT_DIR --device cpu    # the same steps at toy sizes on CPU (proves the script runs)
set -euo pipefail
OUT=${1:?usage: run/bench_gpu.sh OUT_DIR [--device cpu|cuda]}
DEVICE=cuda
if [[ "${2:-}" == "--device" ]]; then DEVICE=${3:?--device needs cpu or cuda}; fi
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python}
mkdir -p "$OUT"
if [[ "$DEVICE" == cpu ]]; then
    "$PY" "$HERE/bench_lm.py" --size lm_tiny --quick --no-memory --device cpu --out "$OUT"
    "$PY" "$HERE/bench_attention.py" --sweep 32,64 --sweep-tokens 256 --dtypes float32,bfloat16 --reps 1 \
        --device cpu --out "$OUT"
else
    "$PY" "$HERE/bench_lm.py" --size lm_enwik8 --block 512,1024 --max-tokens 16384 --reps 3 --device cuda --out "$OUT"
    "$PY" "$HERE/bench_translation.py" --size iwslt --max-tokens 4096 --reps 3 --device cuda --out "$OUT"
    "$PY" "$HERE/bench_attention.py" --sweep 128,512,1024,2048,4096,8192 --sweep-tokens 65536 \
        --dtypes float16,bfloat16 --reps 5 --device cuda --out "$OUT"
fi
echo "results: $OUT/speed_*.md $OUT/attention_sweep.md"
