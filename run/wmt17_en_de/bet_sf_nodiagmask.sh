#!/usr/bin/env bash
# Table 2 row "BET(SF) - DiagFreeMask" on En-De (wmt17_en_de), --arch bet_sf_nodiagmask_wmt_en_de.
# Data: bet-prepare-wmt17 --raw-dir RAW --out-dir DATA/wmt17 (binarised: DATA/wmt17/bin)
# Usage: run/wmt17_en_de/bet_sf_nodiagmask.sh DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- extra fairseq-train args]
# (written by run/make_scripts.py from bet_fairseq/results/rows.py; edit the row table, not this file)
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]" >&2
    exit 2
fi
data="$1"; save="$2"; shift 2
exec "${PYTHON:-python}" "$(dirname "$0")/../table2.py" --row bet_sf_nodiagmask --dataset wmt17_en_de --data "$data" --save-dir "$save" "$@"
