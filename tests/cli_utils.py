"""Helpers for end-to-end tests through fairseq's real command-line entry points.

Small real data: the first lines of ../shared/data (Multi30k German-English, WikiText-2), binarised
with fairseq-preprocess into a temporary folder. Tiny models: every architecture's sizes are
overridden by ``TINY_*`` flags (fairseq architectures only fill options that are not given).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(ROOT, "bet_fairseq")
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
BIN = os.path.dirname(sys.executable)

TINY_TRANSLATION = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 4 "
    "--decoder-attention-heads 4"
).split()
TINY_LM = "--decoder-layers 2 --decoder-embed-dim 32 --decoder-ffn-embed-dim 64 --decoder-attention-heads 4".split()
COMMON_TRAIN = (
    "--optimizer adam --lr 0.002 --cpu --no-epoch-checkpoints --log-format simple --log-interval 1 "
    "--no-progress-bar --seed 1 --num-workers 0"
).split()


def require_shared(*parts):
    path = os.path.join(SHARED_DATA, *parts)
    if not os.path.exists(path):
        pytest.skip(f"real corpus not found: {path}")
    return path


def cli(name, *args, check=True, env=None, timeout=600):
    """Run a console script of this venv (fairseq-train, ...) and return the CompletedProcess."""
    exe = os.path.join(BIN, name)
    full_env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def cli_in_process(module, argv):
    """A fairseq command's real ``cli_main`` (``fairseq_cli.train``, ...) in this process: no start-up
    cost. fairseq keeps the best validation loss on a function attribute; it is cleared afterwards
    so that one run never decides whether a later one writes checkpoint_best.pt."""
    from fairseq import checkpoint_utils

    old = sys.argv
    sys.argv = [module.__name__, *map(str, argv)]
    try:
        return module.cli_main()
    finally:
        sys.argv = old
        if hasattr(checkpoint_utils.save_checkpoint, "best"):
            del checkpoint_utils.save_checkpoint.best


def head(src, dst, n):
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for i, line in enumerate(f):
            if i >= n:
                break
            g.write(line)


def binarise_multi30k(workdir, n_train=600, n_valid=100, n_test=40):
    """Lower-cased Moses-tokenised Multi30k De->En slice, joined dictionary, no BPE."""
    tok = require_shared("multi30k", "tok")
    raw = os.path.join(workdir, "raw")
    os.makedirs(raw, exist_ok=True)
    for split, name, n in (("train", "train", n_train), ("valid", "val", n_valid), ("test", "test_2016_flickr", n_test)):
        for lang in ("de", "en"):
            head(os.path.join(tok, f"{name}.lc.norm.tok.{lang}"), os.path.join(raw, f"{split}.{lang}"), n)
    dest = os.path.join(workdir, "bin")
    cli("fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
        "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
        "--destdir", dest, "--joined-dictionary", "--workers", "1")
    return dest


def binarise_wikitext2(workdir, n_train=400, n_valid=60, n_test=60):
    """WikiText-2 slice for language modelling (train on valid.txt lines, test on test.txt)."""
    folder = require_shared("wikitext-2")
    raw = os.path.join(workdir, "raw")
    os.makedirs(raw, exist_ok=True)
    with open(os.path.join(folder, "valid.txt"), encoding="utf-8") as f:
        lines = f.readlines()
    with open(os.path.join(raw, "train.txt"), "w", encoding="utf-8") as g:
        g.writelines(lines[:n_train])
    with open(os.path.join(raw, "valid.txt"), "w", encoding="utf-8") as g:
        g.writelines(lines[n_train : n_train + n_valid])
    head(os.path.join(folder, "test.txt"), os.path.join(raw, "test.txt"), n_test)
    dest = os.path.join(workdir, "bin")
    cli("fairseq-preprocess", "--only-source", "--trainpref", f"{raw}/train.txt",
        "--validpref", f"{raw}/valid.txt", "--testpref", f"{raw}/test.txt", "--destdir", dest, "--workers", "1")
    return dest
