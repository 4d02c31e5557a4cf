#!/usr/bin/env bash
# Table 2 row "Yang et al. 2018 (Gaussian localness bias)" on De-En (iwslt14_de_en), --arch localness_iwslt.
# Data: bet-prepare-iwslt14 --raw-dir RAW --out-dir DATA/iwslt14 (binarised: DATA/iwslt14/bin)
# Usage: run/iwslt14_de_en/localness.sh DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- extra fairseq-train args]
# (written by run/make_scripts.py from bet_fairseq/results/rows.py; edit the row table, not this file)
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]" >&2
    exit 2
fi
data="$1"; save="$2"; shift 2
exec "${PYTHON:-python}" "$(dirname "$0")/../table2.py" --row localness --dataset iwslt14_de_en --data "$data" --save-dir "$save" "$@"
