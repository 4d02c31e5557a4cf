#!/usr/bin/env bash
# Table 2 row "Zhao et al. 2019 (explicit top-k sparse attention)" on enwik8 (enwik8), --arch sparse_topk_lm_enwik8.
# Data: bet-prepare-enwik8 --raw-dir RAW --out-dir DATA/enwik8 (binarised: DATA/enwik8/bin)
# Usage: run/enwik8/sparse_topk.sh DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- extra fairseq-train args]
# (written by run/make_scripts.py from bet_fairseq/results/rows.py; edit the row table, not this file)
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]" >&2
    exit 2
fi
data="$1"; save="$2"; shift 2
exec "${PYTHON:-python}" "$(dirname "$0")/../table2.py" --row sparse_topk --dataset enwik8 --data "$data" --save-dir "$save" "$@"
