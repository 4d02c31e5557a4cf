#!/usr/bin/env bash
# Train BET(SF) on IWSLT14 De->En with the paper's settings and report test BLEU (beam 5, --remove-bpe:
# the tokenised BLEU the fairseq IWSLT14 recipe reports) in SAVE_DIR/bleu.txt.
#
#   run/train_bet_sf_iwslt.sh DATA_BIN [SAVE_DIR] [extra fairseq-train options...]
#
# DATA_BIN: the binarised IWSLT14 De-En folder (joined dictionary), e.g. OUT/bin after
#   bet-prepare-iwslt14 --raw-dir RAW --out-dir OUT
# Environment: MAX_EPOCH (default 50), ARCH (default bet_sf_iwslt; any --arch of the plugin or fairseq),
#   BEAM and GENERATE_ARGS (other test settings than the row's beam 5: one more fairseq-generate run),
#   PYTHON (default python). Uses the GPU when there is one, else the CPU.
# fairseq's output goes to SAVE_DIR/train.log and SAVE_DIR/eval.log (follow with tail -f), not the terminal.
# This is the Table 2 row bet_sf on iwslt14_de_en (run/table2.py; settings in bet_fairseq/recipes.py,
# checkpoint_best.pt chosen by validation BLEU; an ARCH of another row runs that row, e.g.
# transformer_iwslt_de_en the row transformer), so SAVE_DIR also holds its train.log, eval.log and
# result.json. Every call trains: fairseq resumes from SAVE_DIR/checkpoint_last.pt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py="${PYTHON:-python}"
if [ $# -lt 1 ]; then
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
data="$1"; shift
arch="${ARCH:-bet_sf_iwslt}"
save="${1:-checkpoints/$arch}"; [ $# -gt 0 ] && shift

for f in dict.de.txt dict.en.txt train.de-en.de.idx train.de-en.en.idx valid.de-en.en.idx test.de-en.en.idx; do
    if [ ! -f "$data/$f" ]; then
        echo "error: $data/$f not found: DATA_BIN must be a binarised IWSLT14 De-En folder." >&2
        echo "  Prepare it with: bet-prepare-iwslt14 --raw-dir RAW_DIR --out-dir OUT (then DATA_BIN is OUT/bin)" >&2
        echo "  (RAW_DIR: the IWSLT14 de-en release; without --raw-dir it is downloaded when online)" >&2
        exit 1
    fi
done

train_args=()
if [ -n "${MAX_EPOCH:-}" ]; then train_args+=(--max-epoch "$MAX_EPOCH"); fi
echo "training $arch; fairseq's output: $save/train.log, then the test run: $save/eval.log" >&2
"$py" "$here/table2.py" --row bet_sf --dataset iwslt14_de_en --arch "$arch" --data "$data" --save-dir "$save" \
    --force --quiet -- ${train_args[@]+"${train_args[@]}"} "$@"

if [ -z "${GENERATE_ARGS:-}" ] && [ "${BEAM:-5}" = 5 ]; then
    # the driver's test run (eval.log) is fairseq-generate with the row's settings: its BLEU line, no second run
    grep 'BLEU4' "$save/eval.log" | tee "$save/bleu.txt"
else
    recipe="$(PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$py" -m bet_fairseq.recipes eval iwslt14_de_en)"
    eval "generate_args=($recipe)"
    fairseq-generate "$data" --user-dir "$root/bet_fairseq" --path "$save/checkpoint_best.pt" "${generate_args[@]}" \
        --beam "${BEAM:-5}" ${GENERATE_ARGS:-} > "$save/generate.test.txt" 2>&1
    grep 'BLEU4' "$save/generate.test.txt" | tee "$save/bleu.txt"
fi
