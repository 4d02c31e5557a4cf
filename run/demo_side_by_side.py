#!/usr/bin/env python
"""Train a tiny BET(SF) and a tiny vanilla transformer on Multi30k De->En and print both BLEU scores.

A few minutes on a laptop CPU. The two models share data, sizes, seed and schedule; only the
decoder self-attention differs (``--arch bet_sf_iwslt`` vs fairseq's ``transformer_iwslt_de_en``,
both shrunk to the same tiny sizes). Data preparation is preprocess/prepare_multi30k.py's (Moses, joint BPE,
fairseq-preprocess); training and scoring run fairseq-train and fairseq-generate.

  python run/demo_side_by_side.py                       # downloads Multi30k (needs a network)
  python run/demo_side_by_side.py --data-dir DIR        # DIR holds {train,val,test_2016_flickr}.{de,en}[.gz]

Each step is skipped when it already finished in --work-dir with the same inputs and settings, so an
interrupted run resumes (data steps: preprocess/common.py's markers in WORK_DIR/.done; a changed
--max-train, --max-eval or --bpe-merges redoes them and retrains). Flags: bet_fairseq/recipes.py.
"""

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time

import bet_fairseq
from bet_fairseq import recipes
from bet_fairseq.files import atomic_write
from bet_fairseq.preprocess import prepare_multi30k

USER_DIR = bet_fairseq.user_dir()


def log(msg):
    print(f"[demo] {msg}", flush=True)


def fail(msg):
    sys.exit(f"demo_side_by_side: error: {msg}")


def run(cmd, log_path=None):
    log(" ".join(map(str, cmd)))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env)
    if log_path:
        with atomic_write(log_path) as f:
            f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        fail(f"{cmd[0]} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def save_json(path, value, **kwargs):
    with atomic_write(path) as f:
        json.dump(value, f, **kwargs)


def train_and_score(args, bin_dir, name, arch):
    """Train (unless a finished training newer than the data exists) and score with fairseq-generate."""
    save = os.path.join(args.work_dir, "checkpoints", name)
    ckpt = os.path.join(save, "checkpoint_last.pt")
    gen_log = os.path.join(save, "generate.log")
    timing_path = os.path.join(save, "timing.json")
    os.makedirs(save, exist_ok=True)
    timing = {}
    if os.path.exists(timing_path):
        with open(timing_path, encoding="utf-8") as f:
            timing = json.load(f)
    data_time = os.path.getmtime(os.path.join(bin_dir, "dict.en.txt"))
    stale = os.path.exists(ckpt) and os.path.getmtime(ckpt) < data_time  # made before the data was remade
    if args.retrain or stale or not (os.path.exists(ckpt) and "train_seconds" in timing):
        if args.retrain or stale:
            for old in glob.glob(os.path.join(save, "checkpoint*.pt")):
                os.remove(old)  # else fairseq-train resumes from checkpoint_last.pt
        timing = {}
        save_json(timing_path, timing)  # an interrupted training resumes, but never counts as finished
        flags = recipes.merge(recipes.DEMO_TRAIN, {"--lr": args.lr, "--warmup-updates": args.warmup,
                                                   "--max-tokens": args.max_tokens, "--max-update": args.max_update,
                                                   "--seed": args.seed})
        started = time.time()
        run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", arch, "--save-dir", save,
             *recipes.to_argv(flags)], log_path=os.path.join(save, "train.log"))
        timing["train_seconds"] = round(time.time() - started, 1)
        save_json(timing_path, timing)
    if not (os.path.exists(gen_log) and os.path.getmtime(gen_log) > os.path.getmtime(ckpt)):
        started = time.time()
        run(["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--path", ckpt, *recipes.to_argv(recipes.DEMO_EVAL)],
            log_path=gen_log)
        timing["generate_seconds"] = round(time.time() - started, 1)
        save_json(timing_path, timing)
    with open(gen_log, encoding="utf-8") as f:
        match = re.search(r"BLEU4 = ([\d.]+)", f.read())
    if not match:
        fail(f"no BLEU in fairseq-generate output (see {gen_log})")
    return dict(model=name, arch=arch, bleu=float(match.group(1)), train_seconds=timing.get("train_seconds"),
                generate_seconds=timing.get("generate_seconds"))


def main(argv=None):
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
    save_json(os.path.join(args.work_dir, "results.json"),
              dict(results=results, total_seconds=round(total, 1), args=vars(args)), indent=2)
    return results


if __name__ == "__main__":
    main()
