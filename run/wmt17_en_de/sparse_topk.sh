#!/usr/bin/env bash
# Table 2 row "Zhao et al. 2019 (explicit top-k sparse attention)" on En-De (wmt17_en_de), --arch sparse_topk_wmt_en_de.
# Data: bet-prepare-wmt17 --raw-dir RAW --out-dir DATA/wmt17 (binarised: DATA/wmt17/bin)
# Usage: run/wmt17_en_de/sparse_topk.sh DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- extra fairseq-train args]
# (written by run/make_scripts.py from bet_fairseq/results/rows.py; edit the row table, not this file)
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]" >&2
    exit 2
fi
data="$1"; save="$2"; shift 2
exec "${PYTHON:-python}" "$(dirname "$0")/../table2.py" --row sparse_topk --dataset wmt17_en_de --data "$data" --save-dir "$save" "$@"
