#!/usr/bin/env bash
# Table 2 on WikiText-2: train and evaluate one row with run/table2.py (= bet-run-row), see
# docs/data_and_runs.md section 2.
#
#   run/wikitext2.sh ROW DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]
#
# Without arguments, or with a row this dataset does not have, it prints this usage and the rows.
# PYTHON: the interpreter (default: python).
exec "${PYTHON:-python}" "$(dirname "$0")/table2.py" --script "$0" --dataset wikitext2 "$@"
