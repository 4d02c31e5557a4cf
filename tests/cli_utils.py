"""Helpers for end-to-end tests through fairseq's real command-line entry points.

Small real data: the first lines of ../shared/data (Multi30k German-English, WikiText-2), binarised
with fairseq-preprocess into a temporary folder (``session_corpus``: once per pytest session). Tiny
models: every architecture's sizes are overridden by ``TINY_*`` flags (fairseq architectures only fill
options that are not given). In process: a command's ``cli_main`` (``cli_in_process``), what
fairseq-generate prints (``generate_in_process``), what fairseq-eval-lm computes
(``eval_lm_in_process``), and the model fairseq-train builds for a command line (``build_model``).
"""

import contextlib
import io
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

# One short training run of each kind (add --arch and the rest): tiny sizes, in-process friendly.
MT_TRAIN = [*TINY_TRANSLATION, *COMMON_TRAIN, "--max-tokens", "1500", "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1"]
LM_TRAIN = ["--task", "language_modeling", *TINY_LM, *COMMON_TRAIN, "--tokens-per-sample", "64", "--max-tokens", "1024"]
# Options under which each variant's own rule bites on the tests' short sequences (other variants: defaults).
VARIANT_FLAGS = {
    "diag_scale": ["--diag-scale", "0.2"],
    "sparse_topk": ["--sparse-topk", "2"],
    "hopfield": ["--hopfield-steps", "2"],
    "routing": ["--routing-clusters", "3", "--routing-window", "2"],
}


def variant_flags(variant):
    """``--self-attn-mode NAME`` and the variant's VARIANT_FLAGS."""
    return ["--self-attn-mode", variant, *VARIANT_FLAGS.get(variant, [])]


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


def train_in_process(data, save_dir, *flags, updates=3):
    """fairseq-train's real ``cli_main`` in this process (``flags``: --arch, MT_TRAIN or LM_TRAIN, ...) for
    ``updates`` updates; returns the path of checkpoint_last.pt."""
    from fairseq_cli import train

    cli_in_process(train, [data, "--user-dir", USER_DIR, *flags, "--max-update", updates, "--save-dir", save_dir])
    return os.path.join(str(save_dir), "checkpoint_last.pt")


# In process, no data loader workers: each would fork this process, and its shutdown waits up to 5 s.
NO_WORKERS = ["--num-workers", "0"]


def generate_in_process(argv):
    """fairseq-generate's real ``cli_main`` in this process; returns what it prints (S-/H- lines, BLEU)."""
    from fairseq_cli import generate

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli_in_process(generate, [*argv, *NO_WORKERS])
    return out.getvalue()


def eval_lm_in_process(argv):
    """fairseq-eval-lm's ``main`` in this process on ``argv`` as its parser reads it; returns its result
    (``loss``, ``perplexity``)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import eval_lm

    args = options.parse_args_and_arch(options.get_eval_lm_parser(), list(map(str, [*argv, *NO_WORKERS])))
    return eval_lm.main(convert_namespace_to_omegaconf(args))


def toy_dictionaries(folder, n=50):
    """dict.txt, dict.de.txt and dict.en.txt of ``n`` words: all a task needs to build a model."""
    for name in ("dict.txt", "dict.de.txt", "dict.en.txt"):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.writelines(f"w{i} {100 + n - i}\n" for i in range(n))
    return str(folder)


def build_model(argv):
    """(model, task, args): the model fairseq-train builds for ``argv`` (data folder first), parsed by its
    parser and built by its task, with random weights (from the parsed namespace: no hydra round trip)."""
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), list(map(str, argv)))
    task = tasks.setup_task(args)
    return task.build_model(args), task, args


def n_params(model):
    return sum(p.numel() for p in model.parameters())


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


def session_corpus(tmp_path_factory, binarise, **sizes):
    """``binarise(folder, **sizes)`` (``binarise_multi30k``, ``binarise_wikitext2``) once per pytest
    session: test modules that ask for the same corpus share one binarised copy (read only)."""
    folder = tmp_path_factory.getbasetemp() / "corpora" / "-".join(
        [binarise.__name__, *(f"{k}{v}" for k, v in sorted(sizes.items()))])
    done = folder / "done"
    if not done.exists():
        dest = binarise(str(folder), **sizes)
        done.write_text(dest)
    return done.read_text()
