"""The training and evaluation recipes, in one place: the paper's settings per kind of dataset (each
dataset's own flags are its entry in ``catalog.py``), the tiny ``--quick`` ones, and the side-by-side demo's and the speed benchmark's (each a dataset recipe plus
overrides). The Table 2 row driver (``bet-run-row``), the main job (``run/train_bet_sf_iwslt.sh``),
``run/demo_side_by_side.py``, ``run/bench_translation.py`` and ``run/bench_lm.py`` all take their flags from here,
so they cannot drift apart.

A recipe is a dict ``{"--flag": value}`` of fairseq command-line options; ``to_argv`` turns it into
an argv list: ``True`` gives a bare flag, ``None`` (or ``False``) leaves the flag out, so that in an
override it removes the flag of the recipe underneath (``merge``). Pure Python: imports neither
fairseq nor torch.

    python -m bet_fairseq.recipes train iwslt14_de_en [--quick] [--updates N]   # fairseq-train flags
    python -m bet_fairseq.recipes eval iwslt14_de_en                            # fairseq-generate / eval-lm flags
    python -m bet_fairseq.recipes demo-train | demo-eval | bench                # the demo's, the benchmark's

(prints the flags shell-quoted, for scripts; the data folder, ``--arch``, ``--user-dir``,
``--save-dir`` and ``--path`` are the caller's).
"""

import argparse
import shlex
import sys
from typing import Dict, List, Optional

from . import catalog
from .catalog import Flags
from .errors import check_at_least


def merge(*recipes: Flags) -> Flags:
    """Later recipes override earlier ones (and move the flag to their position); ``None`` removes."""
    out: Flags = {}
    for recipe in recipes:
        for name, value in recipe.items():
            out.pop(name, None)
            out[name] = value
    return out


def to_argv(flags: Flags) -> List[str]:
    """``{"--lr": 5e-4, "--cpu": True, "--patience": None}`` -> ``["--lr", "0.0005", "--cpu"]``."""
    argv = []
    for name, value in flags.items():
        if value is None or value is False:
            continue
        argv.append(name)
        if value is not True:
            argv.append(str(value))
    return argv


def mt_sizes(layers: int, dim: int, ffn: int, heads: int) -> Flags:
    """Encoder and decoder sizes of a small translation model (given sizes override the --arch's)."""
    return {f"--{side}-{name}": value for side in ("encoder", "decoder")
            for name, value in (("layers", layers), ("embed-dim", dim), ("ffn-embed-dim", ffn),
                                ("attention-heads", heads))}


def lm_sizes(layers: int, dim: int, ffn: int, heads: int) -> Flags:
    """Decoder sizes of a small language model."""
    return {"--decoder-layers": layers, "--decoder-embed-dim": dim, "--decoder-ffn-embed-dim": ffn,
            "--decoder-attention-heads": heads}


# ----------------------------------------------------------------------------- the paper's settings

# Validation BLEU choosing checkpoint_best.pt (beam 5, Moses detokenised, BPE removed).
VALID_BLEU: Flags = {
    "--eval-bleu": True, "--eval-bleu-args": '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}',
    "--eval-bleu-detok": "moses", "--eval-bleu-remove-bpe": True,
    "--best-checkpoint-metric": "bleu", "--maximize-best-checkpoint-metric": True,
}
NO_VALID_BLEU: Flags = {flag: None for flag in VALID_BLEU}  # checkpoint_best.pt by validation loss

# fairseq's IWSLT14 recipe (examples/translation/README.md); the authors used it for WMT17 too.
_MT_RECIPE: Flags = {
    "--share-decoder-input-output-embed": True,
    "--optimizer": "adam", "--adam-betas": "(0.9, 0.98)", "--clip-norm": 0.0,
    "--lr": 5e-4, "--lr-scheduler": "inverse_sqrt", "--warmup-updates": 4000,
    "--dropout": 0.3, "--weight-decay": 0.0001,
    "--criterion": "label_smoothed_cross_entropy", "--label-smoothing": 0.1,
    "--max-tokens": 4096,
    **VALID_BLEU,
}
# LM (docs/method.md, §6): Adam lr 1e-3 with the authors' eps 1e-3, batch 64 blocks of 512 tokens.
# The authors' amsgrad is not an option of fairseq's adam (FairseqAdamConfig has no amsgrad field).
_LM_RECIPE: Flags = {
    "--task": "language_modeling", "--tokens-per-sample": 512, "--sample-break-mode": "none", "--batch-size": 64,
    "--optimizer": "adam", "--adam-betas": "(0.9, 0.98)", "--adam-eps": 1e-3, "--clip-norm": 0.0,
    "--lr": 1e-3, "--lr-scheduler": "inverse_sqrt", "--warmup-updates": 4000, "--warmup-init-lr": 1e-7,
    "--weight-decay": 0.01, "--dropout": 0.1, "--criterion": "cross_entropy",
}
BASE_TRAIN: Dict[str, Flags] = {"mt": _MT_RECIPE, "lm": _LM_RECIPE}  # kind -> the recipe under every dataset's own flags
COMMON_TRAIN: Flags = {"--seed": 1, "--no-epoch-checkpoints": True, "--log-format": "json", "--log-interval": 100}

# --required-batch-size-multiple 1: fairseq-fixed 0.12.3.1's batch_by_size drops the last
# (n mod multiple) items of a split (default multiple 8), e.g. 6 of IWSLT14's 6,750 test pairs.
EVAL: Dict[str, Flags] = {
    "mt": {"--task": "translation", "--gen-subset": "test", "--beam": 5, "--batch-size": 128, "--remove-bpe": True,
           "--required-batch-size-multiple": 1},
    "lm": {"--task": "language_modeling", "--gen-subset": "test", "--tokens-per-sample": 512, "--context-window": 400,
           "--batch-size": 8, "--required-batch-size-multiple": 1},
}

# ----------------------------------------------------------------------------- --quick

# A tiny model and a few updates, minutes on a CPU (smoke tests, not results).
QUICK_UPDATES = 20
QUICK_TRAIN: Dict[str, Flags] = {
    "mt": {**mt_sizes(2, 32, 64, 4), "--max-tokens": 1024, "--warmup-updates": 10, "--lr": 2e-3,
           "--max-epoch": None, **NO_VALID_BLEU},
    "lm": {**lm_sizes(2, 32, 64, 4), "--tokens-per-sample": 64, "--batch-size": 16, "--warmup-updates": 10,
           "--lr": 2e-3, "--max-epoch": None, "--patience": None},
}
QUICK_COMMON: Flags = {"--log-interval": 2, "--num-workers": 0}
QUICK_EVAL: Dict[str, Flags] = {
    "mt": {"--batch-size": 64, "--max-len-a": 1.2, "--max-len-b": 10, "--num-workers": 0},
    "lm": {"--tokens-per-sample": 64, "--context-window": 32, "--batch-size": 16, "--num-workers": 0},
}


# An adaptive softmax (--adaptive-softmax-cutoff) is trained by fairseq's adaptive_loss, which has no label
# smoothing: the criterion of a recipe -> its adaptive-softmax counterpart.
ADAPTIVE_CRITERIA = {"cross_entropy": "adaptive_loss",
                     "label_smoothed_cross_entropy_with_pointer": "adaptive_loss_with_pointer"}


def for_softmax(flags: Flags) -> Flags:
    """``flags`` with the criterion its output layer needs: with ``--adaptive-softmax-cutoff``, the adaptive
    counterpart of its criterion (``ADAPTIVE_CRITERIA``; label smoothing, which it does not have, must be 0)."""
    criterion = flags.get("--criterion")
    if not flags.get("--adaptive-softmax-cutoff") or criterion not in ADAPTIVE_CRITERIA:
        return flags
    if float(flags.get("--label-smoothing") or 0.0) != 0.0:
        raise ValueError(f"--adaptive-softmax-cutoff: {ADAPTIVE_CRITERIA[criterion]} has no label smoothing, "
                         f"got --label-smoothing {flags['--label-smoothing']}")
    return merge(flags, {"--criterion": ADAPTIVE_CRITERIA[criterion], "--label-smoothing": None})


def train_recipe(dataset: str, quick: bool = False, updates: Optional[int] = None) -> Flags:
    """fairseq-train flags of a Table 2 run on ``dataset`` (before a row's own flags): its kind's recipe, the
    dataset's own flags (those of the dataset it takes its recipe from), the common flags."""
    if updates is not None:  # 0 would read as "no --updates" below, and fairseq reads --max-update 0 as no limit
        check_at_least(updates, "--updates", 1, "number of updates")
    ds = catalog.dataset(dataset)
    own = catalog.dataset(ds.recipe).train if ds.recipe else ds.train
    flags = merge(BASE_TRAIN[ds.kind], own, COMMON_TRAIN)
    if quick:
        updates = updates or QUICK_UPDATES
        flags = merge(flags, QUICK_TRAIN[ds.kind], QUICK_COMMON,
                      {"--max-update": updates, "--validate-interval-updates": max(1, updates // 2)})
    elif updates:
        flags = merge(flags, {"--max-update": updates})
    return flags


def eval_recipe(dataset: str, quick: bool = False) -> Flags:
    """fairseq-generate (translation) or fairseq-eval-lm (language modelling) flags on the test split."""
    k = catalog.dataset(dataset).kind
    return merge(EVAL[k], QUICK_EVAL[k]) if quick else dict(EVAL[k])


# ----------------------------------------------------------------------------- demo and benchmark

# The two models compared side by side (demo, speed benchmark): only the decoder self-attention differs.
SIDE_BY_SIDE = tuple((key, catalog.row(key).arch("iwslt14_de_en")) for key in ("vanilla", "bet_sf"))

# run/demo_side_by_side.py: IWSLT14's recipe on a 3+3-layer, 128-dimension model, 500 updates on a CPU,
# no weight decay, lighter dropout and a faster schedule; keeps the last checkpoint (no validation BLEU).
DEMO_TRAIN: Flags = merge(train_recipe("iwslt14_de_en"), mt_sizes(3, 128, 256, 4), NO_VALID_BLEU, {
    "--lr": 2e-3, "--warmup-updates": 400, "--dropout": 0.1, "--weight-decay": None,
    "--max-epoch": None, "--max-update": 500,
    "--log-format": "simple", "--log-interval": 50, "--no-progress-bar": True, "--cpu": True, "--num-workers": 0,
})
DEMO_EVAL: Flags = merge(eval_recipe("iwslt14_de_en"), {"--cpu": True, "--max-len-a": 1.2, "--max-len-b": 10})

# run/bench_translation.py: IWSLT14's recipe as fairseq's builders see it (no validation BLEU, no logging);
# the benchmark sets its own --max-tokens and languages.
BENCH_TRAIN: Flags = merge(train_recipe("iwslt14_de_en"), NO_VALID_BLEU, {"--log-format": "none", "--num-workers": 0})
BENCH_SMALL = mt_sizes(3, 256, 512, 4)  # its --size small: a CI-sized model

# ----------------------------------------------------------------------------- the study's language model

# A language model with fairseq's adaptive softmax (the criterion follows: for_softmax); fairseq's adaptive_loss
# refuses the default pytorch_ddp backend even on one process; Adam eps 1e-8 (the authors' 1e-3 brakes a short run).
ADAPTIVE_LM: Flags = {"--adaptive-softmax-cutoff": "2000,10000", "--ddp-backend": "legacy_ddp", "--adam-eps": 1e-8}
# The decoder of the study's cpu-scale language model (bet-reproduce --scale cpu adds ADAPTIVE_LM and its schedule);
# here, not in the study, so that run/bench_lm.py --size lm_study times that model without importing the study.
STUDY_LM: Flags = lm_sizes(3, 128, 512, 4)

_NAMED = {"demo-train": DEMO_TRAIN, "demo-eval": DEMO_EVAL, "bench": BENCH_TRAIN}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bet_fairseq.recipes",
                                description="Print a recipe's fairseq flags, shell-quoted on one line.")
    p.add_argument("recipe", choices=("train", "eval", *_NAMED))
    p.add_argument("dataset", nargs="?", help="with train / eval: " + ", ".join(catalog.DATASETS))
    p.add_argument("--quick", action="store_true", help="the tiny --quick settings")
    p.add_argument("--updates", type=int, help="train: --max-update")
    args = p.parse_args(argv)
    if args.updates is not None and args.updates < 1:
        p.error(f"--updates must be a number of updates >= 1, got {args.updates}")
    if args.recipe in _NAMED:
        if args.dataset or args.quick or args.updates:
            p.error(f"{args.recipe} takes no dataset, --quick or --updates")
        flags = _NAMED[args.recipe]
    elif args.dataset not in catalog.DATASETS:
        p.error(f"{args.recipe} needs a dataset: {', '.join(catalog.DATASETS)}")
    elif args.recipe == "train":
        flags = train_recipe(args.dataset, args.quick, args.updates)
    else:
        if args.updates:
            p.error("--updates goes with train")
        flags = eval_recipe(args.dataset, args.quick)
    print(shlex.join(to_argv(flags)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
