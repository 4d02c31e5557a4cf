#!/usr/bin/env python
"""Train a tiny BET(SF) and a tiny vanilla transformer on Multi30k De->En and print both BLEU scores.

A few minutes on a laptop CPU. The two models share data, sizes, seed and schedule; only the
decoder self-attention differs (``--arch bet_sf_iwslt`` vs ``vanilla_iwslt``, both shrunk to the same tiny
sizes). Data preparation is preprocess/prepare_multi30k.py's (Moses, joint BPE,
fairseq-preprocess); training and scoring run fairseq-train and fairseq-generate.

  python run/demo_side_by_side.py                       # downloads Multi30k (needs a network)
  python run/demo_side_by_side.py --data-dir DIR        # DIR holds {train,val,test_2016_flickr}.{de,en}[.gz]

Each step is skipped when it already finished in --work-dir with the same inputs and settings, so an
interrupted run resumes (data steps: preprocess/common.py's markers in WORK_DIR/.done; models:
``trained.json`` / ``scored.json`` beside the checkpoints, holding the commands and the data they were made
with). A changed option (--max-update, --lr, --seed, --max-tokens, --warmup, or data options that remake the
data) retrains, and says so. Flags: bet_fairseq/recipes.py; runs: bet_fairseq/tools/executor.py.
"""

import argparse
import glob
import json
import os
import shlex
import sys
import time

from bet_fairseq import catalog, recipes
from bet_fairseq.errors import InputError, check_at_least, check_positive, check_writable_folder, run_tool
from bet_fairseq.files import atomic_write
from bet_fairseq.preprocess import prepare_multi30k
from bet_fairseq.tools import executor, markers


INTERRUPTED = "interrupted; finished steps are kept: run the same command again to go on"


def log(msg):
    print(f"[demo] {msg}", flush=True)


def data_identity(bin_dir):
    """What identifies the binarised data a model was trained on: its dictionaries' digests and the sizes
    of its files (remade data means retraining)."""
    found = {os.path.basename(p): markers.file_digest(p) for p in sorted(glob.glob(os.path.join(bin_dir, "dict.*.txt")))}
    found.update({os.path.basename(p): os.path.getsize(p) for p in sorted(glob.glob(os.path.join(bin_dir, "*.bin")))})
    return found


def train_and_score(args, bin_dir, name, arch):
    """Train and score with fairseq-generate, each step skipped when its marker holds the same settings."""
    save = os.path.join(args.work_dir, "checkpoints", name)
    flags = recipes.merge(recipes.DEMO_TRAIN, {"--lr": args.lr, "--warmup-updates": args.warmup,
                                               "--max-tokens": args.max_tokens, "--max-update": args.max_update,
                                               "--seed": args.seed})
    job = executor.Job(arch, bin_dir, save, catalog.dataset("multi30k"), flags, recipes.DEMO_EVAL,
                       checkpoint="checkpoint_last.pt", cpu=True)
    train_argv, eval_argv = job.commands()
    data = data_identity(bin_dir)
    trained_settings = {"train": shlex.join(train_argv), "data": data}
    scored_settings = {**trained_settings, "eval": shlex.join(eval_argv)}
    trained_marker, scored_marker = os.path.join(save, "trained.json"), os.path.join(save, "scored.json")
    timing = None if args.retrain else markers.read(trained_marker, trained_settings, say=log)
    if timing is None:
        if os.path.isdir(save):
            if os.path.exists(trained_marker) or glob.glob(os.path.join(save, "checkpoint*.pt")):
                log(f"{name}: training again from scratch in {save}")
            for old in glob.glob(os.path.join(save, "checkpoint*.pt")) + [trained_marker, scored_marker]:
                if os.path.exists(old):
                    os.remove(old)  # else fairseq-train resumes from checkpoint_last.pt
        log(f"{name}: {shlex.join(train_argv)}")
        timing = markers.write(trained_marker, executor.train(job), trained_settings)
    scored = markers.read(scored_marker, scored_settings, say=log)
    if scored is None:
        log(f"{name}: {shlex.join(eval_argv)}")
        result = executor.evaluate(job)
        scored = markers.write(scored_marker, {"bleu": result["bleu"], "eval_wall_s": result["eval_wall_s"]},
                               scored_settings)
    return dict(model=name, arch=arch, bleu=scored["bleu"], train_seconds=timing["train_wall_s"],
                generate_seconds=scored["eval_wall_s"], settings=scored_settings)


def check_options(args):
    """Every number the demo passes on, checked before anything is prepared, trained or removed: fairseq reads
    --max-update 0 as "no limit" (a training without end), and a negative --max-train as "all but the last N"."""
    check_positive(args.max_update, "--max-update", "number of updates")
    check_positive(args.max_tokens, "--max-tokens", "number of tokens")
    check_positive(args.lr, "--lr", "learning rate")
    check_positive(args.bpe_merges, "--bpe-merges", "number of merges")
    check_at_least(args.warmup, "--warmup", 0, "number of updates")
    check_at_least(args.max_train, "--max-train", 0, "number of pairs (0: all)")
    check_at_least(args.max_eval, "--max-eval", 0, "number of pairs (0: all)")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise InputError(f"--data-dir {args.data_dir} is not a folder (one holding "
                         "{train,val,test_2016_flickr}.{de,en})")
    check_writable_folder(args.work_dir, "--work-dir")


def main(argv=None):
    """The demo as a command: its exit status (bad input: one line, status 2; a failed fairseq run: one line naming
    its log, status 1)."""
    return run_tool("demo_side_by_side", run, argv, interrupted=INTERRUPTED)


def run(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", help="local Multi30k task1 raw files (default: download into --work-dir)")
    p.add_argument("--work-dir", default="work-dirs/demo_side_by_side", help="outputs (default: %(default)s)")
    p.add_argument("--max-train", type=int, default=0, help="use only the first N training pairs (0: all 29k)")
    p.add_argument("--max-eval", type=int, default=0,
                   help="use only the first N valid and test pairs (0: all 1,014 / 1,000)")
    p.add_argument("--bpe-merges", type=int, default=4000)
    train = recipes.DEMO_TRAIN  # the defaults below come from bet_fairseq/recipes.py
    p.add_argument("--max-update", type=int, default=train["--max-update"])
    p.add_argument("--max-tokens", type=int, default=train["--max-tokens"])
    p.add_argument("--lr", type=float, default=train["--lr"])
    p.add_argument("--warmup", type=int, default=train["--warmup-updates"])
    p.add_argument("--seed", type=int, default=train["--seed"])
    p.add_argument("--retrain", action="store_true", help="train again even if checkpoints exist")
    args = p.parse_args(argv)
    check_options(args)

    started = time.time()
    # each data step is skipped when its inputs and settings are unchanged
    _, bin_dir = prepare_multi30k.prepare(args.work_dir, args.data_dir, args.max_train, args.max_eval,
                                          args.bpe_merges)
    results = [train_and_score(args, bin_dir, name, arch) for name, arch in recipes.SIDE_BY_SIDE]
    total = time.time() - started

    print("\n| model | --arch | test BLEU (beam 5) | train s | generate s |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['arch']} | {r['bleu']:.2f} | {r['train_seconds']} | {r['generate_seconds']} |")
    n_test = args.max_eval or "all"
    print(f"\nMulti30k De->En test_2016_flickr ({n_test} sentences), {args.max_update} updates each, "
          f"total {total:.0f} s")
    with atomic_write(os.path.join(args.work_dir, "results.json")) as f:
        json.dump(dict(results=results, total_seconds=round(total, 1), args=vars(args)), f, indent=2)
    return results


if __name__ == "__main__":
    sys.exit(main())
