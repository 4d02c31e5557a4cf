"""Multi30k De-En (task 1), prepared as the side-by-side demo and ``bet-reproduce`` use it: Moses on
lowercased text (escaping off), joint BPE with subword-nmt, fairseq-preprocess with a joined dictionary.

Each step goes through ``common.Steps``, so a folder prepared once is reused while the inputs and
settings stay the same. Errors are ``common.PrepareError`` naming the file (and line).
"""

import os

from . import common

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{name}.{lang}.gz"
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
LANGS = ("de", "en")


def find_raw(data_dir, name, lang):
    """``name.lang`` or ``name.lang.gz`` in ``data_dir`` or ``data_dir/raw``; None when absent."""
    for folder in (data_dir, os.path.join(data_dir, "raw")):
        for suffix in ("", ".gz"):
            path = os.path.join(folder, f"{name}.{lang}{suffix}")
            if os.path.isfile(path):
                return path
    return None


def download(raw_dir):
    """The release's gzipped raw files into ``raw_dir`` (needs a network)."""
    for name in SPLITS.values():
        for lang in LANGS:
            common.download(MULTI30K_URL.format(name=name, lang=lang), os.path.join(raw_dir, f"{name}.{lang}.gz"),
                            offline_hint="pass --data-dir with a local copy of multi30k/dataset data/task1/raw")
    return raw_dir


def tokenise(steps, data_dir, tok_dir, max_train, max_eval=0):
    """Moses tokenisation of lowercased text (escaping off); train / valid and test capped when asked."""
    for split, name in SPLITS.items():
        paths = {lang: find_raw(data_dir, name, lang) for lang in LANGS}
        for lang, path in paths.items():
            if path is None:
                raise common.PrepareError(f"missing {name}.{lang} (or {name}.{lang}.gz) in {data_dir}")
        outs = {lang: os.path.join(tok_dir, f"{split}.{lang}") for lang in LANGS}
        cap = max_train if split == "train" else max_eval

        def tokenise_split(paths=paths, outs=outs, cap=cap):
            common.check_parallel(paths["de"], paths["en"])
            for lang in LANGS:
                lines = list(common.read_lines(paths[lang], require_final_newline=False, quiet=True))
                for i, line in enumerate(lines, 1):
                    if not line.strip():
                        raise common.PrepareError(f"{paths[lang]} line {i} is empty (a misaligned or truncated file?)")
                kept = lines[:cap] if cap else lines
                common.moses_tokenize((x.lower() for x in kept), lang, outs[lang], escape=False)

        steps.run(f"tokenise-{split}", list(paths.values()), list(outs.values()), tokenise_split, {"max_lines": cap})


def learn_and_apply_bpe(steps, tok_dir, bpe_dir, merges):
    """Joint BPE (subword-nmt) learnt on train.de + train.en, applied to every split."""
    codes = os.path.join(bpe_dir, "codes")
    train = [os.path.join(tok_dir, f"train.{lang}") for lang in LANGS]
    steps.run("bpe-codes", train, [codes], lambda: common.learn_joint_bpe(train, codes, merges), {"merges": merges})
    for split in SPLITS:
        pairs = [(os.path.join(tok_dir, f"{split}.{lang}"), os.path.join(bpe_dir, f"{split}.{lang}")) for lang in LANGS]
        steps.run(f"bpe-{split}", [codes] + [src for src, _ in pairs], [dst for _, dst in pairs],
                  lambda pairs=pairs: [common.apply_bpe(codes, src, dst) for src, dst in pairs])


def binarise(steps, bpe_dir, bin_dir):
    """fairseq-preprocess with one dictionary for both languages (the demo's shared embeddings)."""
    prefixes = {split: os.path.join(bpe_dir, split) for split in SPLITS}
    texts = [f"{prefix}.{lang}" for prefix in prefixes.values() for lang in LANGS]
    steps.run("binarise", texts, [os.path.join(bin_dir, "test.de-en.en.idx")],
              lambda: common.binarise(bin_dir, prefixes, min(4, os.cpu_count() or 1), "de", "en", joined=True),
              {"bin_dir": bin_dir})


def prepare(work_dir, data_dir, max_train=0, max_eval=0, bpe_merges=4000):
    """Tokenised, BPE and binarised Multi30k under ``work_dir`` (tok/, bpe/, data-bin/); returns
    ``(bpe_dir, bin_dir)``. ``data_dir`` None downloads the release into ``work_dir/raw``."""
    if data_dir is None:
        data_dir = download(os.path.join(work_dir, "raw"))
    elif not os.path.isdir(data_dir):
        raise common.PrepareError(f"--data-dir {data_dir} is not a folder")
    steps = common.Steps(work_dir)
    tok_dir, bpe_dir, bin_dir = (os.path.join(work_dir, d) for d in ("tok", "bpe", "data-bin"))
    tokenise(steps, data_dir, tok_dir, max_train, max_eval)
    learn_and_apply_bpe(steps, tok_dir, bpe_dir, bpe_merges)
    binarise(steps, bpe_dir, bin_dir)
    return bpe_dir, bin_dir
