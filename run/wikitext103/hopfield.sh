#!/usr/bin/env bash
# Table 2 row "Hopfield (Ramsauer et al. 2020)" on WikiText-103 (wikitext103), --arch hopfield_lm_wikitext103.
# Data: bet-prepare-wikitext --dataset wikitext-103 --raw-dir RAW --out-dir DATA/wikitext103 (binarised: DATA/wikitext103/bin)
# Usage: run/wikitext103/hopfield.sh DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- extra fairseq-train args]
# (written by run/make_scripts.py from bet_fairseq/results/rows.py; edit the row table, not this file)
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]" >&2
    exit 2
fi
data="$1"; save="$2"; shift 2
exec "${PYTHON:-python}" "$(dirname "$0")/../table2.py" --row hopfield --dataset wikitext103 --data "$data" --save-dir "$save" "$@"
