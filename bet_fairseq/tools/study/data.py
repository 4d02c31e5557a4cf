"""Data of the study, prepared once in the work folder with the project's own steps (each skipped
when it already finished with the same inputs and settings, ``bet_fairseq.tools.markers.Steps``):

* Multi30k De-En: ``preprocess/prepare_multi30k.py``, as the side-by-side demo (Moses, lowercased; joint
  BPE with subword-nmt; fairseq-preprocess with a joined dictionary);
* WikiText-2: ``bet-prepare-wikitext`` (fairseq-preprocess --only-source);
* BET(SG)'s syntax hints: ``bet-syntax-hints`` on the English side / the LM text, into the same folder.

``--data-dir`` is a folder laid out like ``multi30k/`` (``raw/{train,val,test_2016_flickr}.{de,en}``)
and ``wikitext-2/`` (``{train,valid,test}.txt`` or ``wiki.*.tokens``); without it the public releases
are downloaded (Multi30k: github multi30k/dataset data/task1/raw; WikiText-2: the v1 release zip).
"""

import os
import sys

from bet_fairseq.errors import InputError
from bet_fairseq.files import atomic_write
from bet_fairseq.tools import markers


class DataError(InputError):
    """The study's data cannot be prepared from what the user gave (--data-dir): one line, exit status 2."""


def _head(src, dst, n):
    with open(src, encoding="utf-8") as f, atomic_write(dst) as g:
        for i, line in enumerate(f):
            if i >= n:
                break
            g.write(line)


def prepare_multi30k(work, data_dir, sizes, hints=True):
    """Binarised Multi30k De-En under ``work/multi30k/data-bin`` (+ BET(SG) hints); returns that folder.
    ``sizes``: ``max_train``/``max_eval`` (0: all) and ``bpe_merges``."""
    from bet_fairseq.preprocess import prepare_multi30k

    out = os.path.join(work, "multi30k")
    raw = None
    if data_dir:
        raw = os.path.join(data_dir, "multi30k")
        if not os.path.isdir(raw):
            raise DataError(f"--data-dir {data_dir} has no multi30k/ folder")
    bpe, bin_dir = prepare_multi30k.prepare(out, raw, sizes["max_train"], sizes["max_eval"], sizes["bpe_merges"])
    steps = markers.Steps(out)
    # the raw (cased, untokenised) test references, for sacreBLEU against the release's own files
    source = prepare_multi30k.find_raw(raw or os.path.join(out, "raw"), prepare_multi30k.SPLITS["test"], "en")
    steps.run("raw-references", [source], [raw_references(work)],
              lambda: _copy_lines(source, raw_references(work), sizes["max_eval"]), {"lines": sizes["max_eval"]})
    if hints:
        texts = [os.path.join(bpe, f"{s}.en") for s in ("train", "valid")]
        outputs = [os.path.join(bin_dir, f"{s}.hints.en.bin") for s in ("train", "valid")]
        steps.run("syntax-hints", texts, outputs, lambda: _hints(bin_dir, os.path.join(bpe, "train"),
                                                                 os.path.join(bpe, "valid"), "en"))
    return bin_dir


def raw_references(work):
    """The raw Multi30k test references of a study (``test_2016_flickr.en``, capped like the test split)."""
    return os.path.join(work, "multi30k", "reference", "test_2016_flickr.en")


def _copy_lines(src, dst, n):
    from bet_fairseq.preprocess import common

    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with atomic_write(dst) as g:
        for i, line in enumerate(common.read_lines(src, require_final_newline=False, quiet=True)):
            if n and i >= n:
                break
            g.write(line + "\n")


def prepare_wikitext2(work, data_dir, sizes, hints=True):
    """Binarised WikiText-2 under ``work/wikitext2/bin`` (+ hints); ``sizes``: ``max_train``/``max_eval``
    lines (0: the whole release, its line counts checked)."""
    from bet_fairseq.preprocess import common, prepare_wikitext

    out = os.path.join(work, "wikitext2")
    if data_dir:
        raw = os.path.join(data_dir, "wikitext-2")
        if not os.path.isdir(raw):
            raise DataError(f"--data-dir {data_dir} has no wikitext-2/ folder")
    else:
        release = prepare_wikitext.RELEASES["wikitext-2"]["url"]
        raw = os.path.join(out, "raw")
        archive = common.download(release, os.path.join(raw, os.path.basename(release)))
        common.extract(archive, raw)
    files = {s: prepare_wikitext.locate([raw], s) for s in prepare_wikitext.SPLITS}
    missing = [s for s, f in files.items() if f is None]
    if missing:
        raise DataError(f"{raw} holds no {missing[0]}.txt / wiki.{missing[0]}.tokens")
    argv = ["--out-dir", out]
    if sizes["max_train"] or sizes["max_eval"]:
        sliced = os.path.join(out, "slice")
        steps = markers.Steps(out)
        for split, path in files.items():
            n = sizes["max_train"] if split == "train" else sizes["max_eval"]
            dst = os.path.join(sliced, f"{split}.txt")
            steps.run(f"slice-{split}", [path], [dst], lambda p=path, d=dst, n=n: _head(p, d, n), {"lines": n})
        raw = sliced
        argv.append("--no-size-check")
    prepare_wikitext.main(["--raw-dir", raw, *argv])
    bin_dir = os.path.join(out, "bin")
    if hints:
        files = {s: prepare_wikitext.locate([raw], s) for s in ("train", "valid")}
        outputs = [os.path.join(bin_dir, f"{s}.hints.bin") for s in ("train", "valid")]
        markers.Steps(out).run("syntax-hints", list(files.values()), outputs,
                               lambda: _hints(bin_dir, files["train"], files["valid"], None))
    return bin_dir


def _hints(bin_dir, trainpref, validpref, lang):
    from bet_fairseq.preprocess import syntax_hints

    argv = ["--trainpref", trainpref, "--validpref", validpref, "--destdir", bin_dir, "--no-progress"]
    if lang:
        argv += ["--lang", lang]
    rc = syntax_hints.main(argv)
    if rc:
        raise DataError(f"bet-syntax-hints {' '.join(argv)} failed (exit {rc})")


PREPARE = {"multi30k": prepare_multi30k, "wikitext2": prepare_wikitext2}


def prepare(dataset, work, data_dir, sizes, hints=True):
    if dataset not in PREPARE:
        raise DataError(f"the study cannot prepare {dataset!r} yet: add its preparation to PREPARE in {__file__}")
    sys.stdout.flush()
    return PREPARE[dataset](work, data_dir, sizes, hints)
