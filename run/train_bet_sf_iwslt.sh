#!/usr/bin/env bash
# Train BET(SF) on IWSLT14 De->En with the paper's settings (fairseq's IWSLT14 recipe, --arch
# bet_sf_iwslt) and report test BLEU (beam 5, --remove-bpe: the tokenised BLEU the recipe reports).
#
#   run/train_bet_sf_iwslt.sh DATA_BIN [SAVE_DIR] [extra fairseq-train options...]
#
# DATA_BIN: the binarised IWSLT14 De-En folder (joined dictionary), e.g. OUT/bin after
#   bet-prepare-iwslt14 --raw-dir RAW --out-dir OUT
# Environment: MAX_EPOCH (default 50), ARCH (default bet_sf_iwslt; any --arch of the plugin or fairseq),
#   BEAM (default 5), GENERATE_ARGS (extra fairseq-generate options). Uses the GPU when fairseq finds
#   one; add --cpu (and GENERATE_ARGS=--cpu) to force the CPU.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
user_dir="$(dirname "$here")/bet_fairseq"
if [ $# -lt 1 ]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
data="$1"; shift
save="${1:-checkpoints/${ARCH:-bet_sf_iwslt}}"; [ $# -gt 0 ] && shift

for f in dict.de.txt dict.en.txt train.de-en.de.idx train.de-en.en.idx valid.de-en.en.idx test.de-en.en.idx; do
    if [ ! -f "$data/$f" ]; then
        echo "error: $data/$f not found: DATA_BIN must be a binarised IWSLT14 De-En folder." >&2
        echo "  Prepare it with: bet-prepare-iwslt14 --raw-dir RAW_DIR --out-dir OUT (then DATA_BIN is OUT/bin)" >&2
        echo "  (RAW_DIR: the IWSLT14 de-en release; without --raw-dir it is downloaded when online)" >&2
        exit 1
    fi
done

mkdir -p "$save"
fairseq-train "$data" --user-dir "$user_dir" --arch "${ARCH:-bet_sf_iwslt}" \
    --share-decoder-input-output-embed \
    --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 \
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 \
    --dropout 0.3 --weight-decay 0.0001 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens 4096 --max-epoch "${MAX_EPOCH:-50}" \
    --save-dir "$save" --keep-last-epochs 5 --log-format simple --log-interval 100 \
    "$@" 2>&1 | tee "$save/train.log"

fairseq-generate "$data" --user-dir "$user_dir" --path "$save/checkpoint_best.pt" \
    --gen-subset test --batch-size 128 --beam "${BEAM:-5}" --remove-bpe ${GENERATE_ARGS:-} \
    > "$save/generate.test.txt"
grep 'BLEU4' "$save/generate.test.txt" | tee "$save/bleu.txt"
