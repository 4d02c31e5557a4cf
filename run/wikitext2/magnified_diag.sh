#!/usr/bin/env bash
# Table 2 row "Transformer (Magnified Diag)" on WikiText-2 (wikitext2), --arch transformer_lm_wikitext2_magnified_diag.
# Data: bet-prepare-wikitext --dataset wikitext-2 --raw-dir RAW --out-dir DATA/wikitext2 (binarised: DATA/wikitext2/bin)
# Usage: run/wikitext2/magnified_diag.sh DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- extra fairseq-train args]
# (written by run/make_scripts.py from bet_fairseq/results/rows.py; edit the row table, not this file)
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]" >&2
    exit 2
fi
data="$1"; save="$2"; shift 2
exec "${PYTHON:-python}" "$(dirname "$0")/../table2.py" --row magnified_diag --dataset wikitext2 --data "$data" --save-dir "$save" "$@"
