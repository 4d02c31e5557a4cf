"""Shared steps of the ``bet-prepare-*`` commands: checked reading, resumable steps,
Moses tokenisation (sacremoses), joint BPE (subword-nmt) and fairseq binarisation.

Every step writes its outputs under temporary names and renames them when complete
(``bet_fairseq.files``), then leaves a ``.done`` marker (``bet_fairseq.tools.markers.Steps``) that records its
inputs (path, size, mtime, SHA-256) and settings: a re-run skips a step whose marker still matches and redoes it
otherwise, so a half-written output never looks finished. An input with a new mtime but the recorded content (a
copied or restored data folder, an earlier step redone to the same bytes) still matches, so hours of preparation
are not redone for a timestamp.
"""

import gzip
import hashlib
import http.client
import io
import json
import os
import shutil
import sys
import tarfile
import unicodedata
import urllib.error
import urllib.request
import zipfile
from typing import NamedTuple, Optional

from tqdm import tqdm

from bet_fairseq import __version__
from bet_fairseq.errors import InputError, check_at_least, check_writable_folder, run_tool
from bet_fairseq.files import atomic_path, atomic_write
from bet_fairseq.tools.markers import Steps, file_digest  # noqa: F401  (the prepare_* commands' steps)
from bet_fairseq.workers import worker_pool


class PrepareError(InputError):
    """A clear, user-facing failure (bad, truncated or missing input): one line, exit status 2."""

    def __init__(self, message):
        super().__init__(message)
        self.message = message


INTERRUPTED = ("interrupted; finished steps are kept (OUT_DIR/.done) and the step that was running starts again: "
               "run the same command to go on")


def cli(prog, main):
    """A ``bet-prepare-*`` command: errors one line (status 2), Ctrl-C one line (status 130), quiet workers."""
    sys.exit(run_tool(prog, main, None, interrupted=INTERRUPTED))


def check_output_folders(args):
    """--out-dir and --bin-dir can be written: checked before any download or step."""
    check_writable_folder(args.out_dir, "--out-dir")
    if getattr(args, "bin_dir", None):
        check_writable_folder(args.bin_dir, "--bin-dir")


def check_options(args, dataset):
    """The options every ``bet-prepare-*`` shares, checked before any download or step: --workers, the output
    folders, and that they hold no other dataset's preparation (which the steps would replace file by file)."""
    check_at_least(args.workers, "--workers", 1, "number of processes")
    check_output_folders(args)
    if not args.force:
        check_not_another_preparation(args.out_dir, dataset, "--out-dir")
        if getattr(args, "bin_dir", None):
            check_not_another_preparation(args.bin_dir, dataset, "--bin-dir",
                                          os.path.join(args.out_dir, "summary.json"))


def check_not_another_preparation(folder, dataset, option, summary=None):
    """``folder`` (an --out-dir, or a --bin-dir with ``summary`` the --out-dir's summary.json) holds no finished
    preparation of another dataset, nor binarised data that this output folder did not make: a PrepareError
    naming both, unless the user asks with --force."""
    if summary is None:  # an --out-dir: its own summary.json says which dataset it holds
        found = _read_summary(os.path.join(folder, "summary.json"))
        if found is not None and found.get("dataset") not in (None, dataset):
            raise PrepareError(f"{option} {folder} holds a finished {found['dataset']} preparation (summary.json), "
                               f"which preparing {dataset} there would replace: choose another {option}, or add "
                               "--force to replace it")
        return
    made_here = (_read_summary(summary) or {}).get("bin_dir")
    if (os.path.isdir(folder) and any(n.startswith("dict.") and n.endswith(".txt") for n in os.listdir(folder))
            and (made_here is None or os.path.abspath(made_here) != os.path.abspath(folder))):
        raise PrepareError(f"{option} {folder} already holds binarised data (dict*.txt) that this --out-dir did not "
                           f"make, which preparing {dataset} there would replace: choose another {option}, or add "
                           "--force to replace it")


def _read_summary(path):
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


class Folders(NamedTuple):
    """Where a preparation writes: ``out`` (--out-dir, which holds the step markers), ``orig`` (downloads),
    ``tmp`` (intermediate text) and ``bin`` (--bin-dir, default OUT/bin)."""
    out: str
    orig: str
    tmp: str
    bin: str


def folders(args, text_steps: bool = False):
    """The preparation's ``Folders`` (``tmp`` made when it has ``text_steps``) and its ``Steps``."""
    out = os.path.abspath(args.out_dir)
    where = Folders(out, os.path.join(out, "orig"), os.path.join(out, "tmp"),
                    os.path.abspath(args.bin_dir or os.path.join(out, "bin")))
    if text_steps:
        os.makedirs(where.tmp, exist_ok=True)
    return where, Steps(out, force=args.force)


def add_bpe_args(parser, merges: int, source: str):
    """--bpe-merges (default ``merges``, as ``source`` has it) and --bpe-codes, checked by check_bpe_options."""
    parser.add_argument("--bpe-merges", type=int, default=merges, help=f"joint BPE merge operations ({source}: "
                        f"{merges})")
    parser.add_argument("--bpe-codes", help="use these subword-nmt codes instead of learning them")


def check_bpe_options(args):
    """--bpe-merges and --bpe-codes of the translation recipes, checked before any step (subword-nmt itself
    fails later with "invalid line 2 in BPE codes file", naming neither)."""
    if args.bpe_codes:
        check_bpe_codes(args.bpe_codes, "--bpe-codes")
    else:
        check_at_least(args.bpe_merges, "--bpe-merges", 1, "number of merges")


def check_bpe_codes(path, option):
    """``path`` is a subword-nmt codes file: an optional "#version:" line, then one merge (two symbols) a line."""
    if not os.path.exists(path):
        raise PrepareError(f"{option} {path}: no such file")
    if not os.path.isfile(path):
        raise PrepareError(f"{option} {path} is a folder; give the subword-nmt codes file (learn_bpe's output)")
    merges = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise PrepareError(f"{option} {path}, line {n}: not UTF-8 text: not a subword-nmt codes file") from None
            if n == 1 and line.startswith("#version:"):
                continue
            if len(line.split(" ")) != 2:
                raise PrepareError(f"{option} {path}, line {n}: {line[:40]!r} is not a merge (two symbols separated "
                                   "by a space): not a subword-nmt codes file (learn_bpe's output)")
            merges += 1
    if not merges:
        raise PrepareError(f"{option} {path} holds no merges: not a subword-nmt codes file (learn_bpe's output)")


def log(message):
    print(message, file=sys.stderr, flush=True)


def progress(iterable, desc, total=None, quiet=False):
    return tqdm(iterable, desc=desc, total=total, unit=" lines", disable=quiet, mininterval=1.0,
                file=sys.stderr, leave=False)


# ----------------------------------------------------------------------------- checked reading

def open_text(path):
    """Text stream of a plain or .gz file (bytes are decoded per line by ``read_lines``)."""
    if not os.path.exists(path):
        raise PrepareError(f"input file not found: {path}")
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_lines(path, require_final_newline=True, quiet=False, desc=None):
    """Yield the lines of ``path`` (without newline), failing clearly on undecodable bytes, a
    truncated .gz, or a missing final newline (the usual sign of a truncated download)."""
    n = 0
    last = b"\n"
    with open_text(path) as f:
        it = iter(f)
        bar = progress(range(0), desc or os.path.basename(path), quiet=quiet)
        while True:
            try:
                raw = next(it)
            except StopIteration:
                break
            except (EOFError, OSError, zlib_error()) as exc:
                raise PrepareError(f"{path}: corrupt or truncated compressed file after line {n} ({exc})")
            n += 1
            last = raw
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PrepareError(f"{path}, line {n}: not valid UTF-8 ({exc.reason} at byte {exc.start}): "
                                   "corrupt download?")
            bar.update(1)
            yield line.rstrip("\n").rstrip("\r") if line.endswith("\n") else line
        bar.close()
    if n and require_final_newline and not last.endswith(b"\n"):
        raise PrepareError(f"{path}, line {n}: the file ends in the middle of a line (no final newline): "
                           "truncated download or copy?")


def zlib_error():
    import zlib

    return zlib.error


def count_lines(path):
    n = 0
    with open_text(path) as f:
        for _ in f:
            n += 1
    return n


def write_lines(path, lines):
    n = 0
    with atomic_write(path) as f:
        for line in lines:
            f.write(line + "\n")
            n += 1
    return n


def check_parallel(path_a, path_b):
    """Line counts of a parallel pair must agree; return the count."""
    na, nb = count_lines(path_a), count_lines(path_b)
    if na != nb:
        raise PrepareError(f"parallel files differ in length: {path_a} has {na:,} lines, {path_b} has {nb:,}: "
                           "truncated or misaligned input")
    return na


def check_line_count(path, expected, what):
    n = count_lines(path)
    if n != expected:
        raise PrepareError(f"{path} has {n:,} lines, {what} has {expected:,}: truncated or wrong file? "
                           "(pass --no-size-check for a custom slice)")
    return n


# ----------------------------------------------------------------------------- archives, downloads

class Source(NamedTuple):
    """Where an archive can be downloaded, and its published SHA-256 and size in bytes (None where no
    published value was found: then only the length the server announces is checked, and the digest
    that came is logged; docs/data_and_runs.md lists these gaps)."""

    url: str
    sha256: Optional[str] = None
    size: Optional[int] = None


# Some mirrors (wikitext.smerity.com) refuse urllib's default "Python-urllib/3.x" agent.
USER_AGENT = f"Mozilla/5.0 (compatible; bet-fairseq/{__version__}; +https://github.com/facebookresearch/fairseq)"
RAW_DIR_HINT = "download it elsewhere and pass its folder with --raw-dir"


class _Refused(Exception):
    """One source did not give the archive; the message says what came back."""


def _fetch(source, dest, timeout):
    """``source`` into ``dest`` (atomic), checked against its size and SHA-256; returns (size, sha256)."""
    request = urllib.request.Request(source.url, headers={"User-Agent": USER_AGENT})
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp, atomic_write(dest, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr, leave=False) as bar:
                while True:
                    chunk = resp.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
            got = out.tell()
            if total is not None and got != total:
                raise _Refused(f"the transfer stopped at {got:,} of {total:,} bytes")
            if source.size is not None and got != source.size:
                raise _Refused(f"{got:,} bytes, the release has {source.size:,}")
            if source.sha256 is not None and digest.hexdigest() != source.sha256:
                raise _Refused(f"SHA-256 {digest.hexdigest()}, the release's is {source.sha256}")
    except urllib.error.HTTPError as exc:
        raise _Refused(f"HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise _Refused(f"no connection ({exc.reason})") from None
    except (OSError, http.client.HTTPException) as exc:  # a reset connection, a short read, a timeout
        raise _Refused(f"{type(exc).__name__}: {exc}") from None
    return got, digest.hexdigest()


def download(sources, dest, offline_hint=RAW_DIR_HINT, timeout=60):
    """Fetch the first of ``sources`` (Source, or URL strings) that gives the archive into ``dest`` (atomic),
    each checked against its recorded size and SHA-256; a PrepareError naming every URL, what came back
    and ``offline_hint`` when none does. An existing ``dest`` is checked the same way and kept."""
    sources = [Source(s) if isinstance(s, str) else s for s in ([sources] if isinstance(sources, (str, Source))
                                                                else sources)]
    if os.path.exists(dest):
        _check_existing(dest, sources)
        log(f"{dest} already exists, skipping download")
        return dest
    failures = []
    for source in sources:
        log(f"downloading {source.url} -> {dest}")
        try:
            size, sha256 = _fetch(source, dest, timeout)
        except _Refused as exc:
            failures.append(f"{source.url}: {exc}")
            log(f"  failed: {exc}")
            continue
        if source.sha256 is None:
            log(f"note: no SHA-256 is recorded for {source.url}; only its length was checked (got {size:,} bytes, "
                f"SHA-256 {sha256})")
        return dest
    raise PrepareError(f"could not download {os.path.basename(dest)}: {'; '.join(failures)}. {offline_hint[0].upper()}"
                       f"{offline_hint[1:]}")


def _check_existing(dest, sources):
    recorded = {(s.sha256, s.size) for s in sources if s.sha256 is not None}
    if not recorded:
        return
    size, sha256 = os.path.getsize(dest), file_digest(dest)
    if (sha256, size) not in recorded:
        raise PrepareError(f"{dest}: {size:,} bytes with SHA-256 {sha256}, not the release ({sources[0].url}): "
                           "a truncated or other file; delete it to download again, or use --raw-dir")


def extract(archive, dest_dir):
    """Extract a .tgz/.tar/.zip into ``dest_dir`` (once: marker file), failing clearly when corrupt."""
    marker = os.path.join(dest_dir, f".extracted-{os.path.basename(archive)}")
    if os.path.exists(marker):
        return dest_dir
    log(f"extracting {archive}")
    os.makedirs(dest_dir, exist_ok=True)
    try:
        if archive.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                bad = z.testzip()
                if bad is not None:
                    raise PrepareError(f"{archive}: corrupt member {bad}")
                z.extractall(dest_dir)
        else:
            with tarfile.open(archive) as t:
                t.extractall(dest_dir, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise PrepareError(f"{archive}: corrupt or truncated archive ({exc}); delete it and download again")
    with open(marker, "w") as f:
        f.write("ok\n")
    return dest_dir


def find_file(roots, name):
    """First ``root/**/name`` (roots searched in order, breadth-first); None when absent. Folders that
    hold this project's own outputs (a ``.done`` marker folder) are not searched, except ``orig/``."""
    for root in roots:
        if not root or not os.path.isdir(root):
            continue
        walk = [w for w in os.walk(root) if not _inside_output(w[0], root)]
        for dirpath, dirnames, filenames in sorted(walk, key=lambda x: x[0].count(os.sep)):
            if name in filenames:
                return os.path.join(dirpath, name)
    return None


def _inside_output(path, root):
    """True for a folder that is (or is under) an output folder of ours (one with a .done marker
    folder), except that output folder's orig/ (downloads)."""
    rel = os.path.relpath(path, root)
    parts = [] if rel == "." else rel.split(os.sep)
    cur = root
    for k in range(len(parts) + 1):
        if os.path.isdir(os.path.join(cur, ".done")):
            return not (k < len(parts) and parts[k] == "orig")
        if k < len(parts):
            cur = os.path.join(cur, parts[k])
    return False


# ----------------------------------------------------------------------------- text processing

_TOKENIZER = {}


def _moses_init(lang, aggressive, escape, lowercase, normalise):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    _TOKENIZER["tok"] = MosesTokenizer(lang)
    _TOKENIZER["norm"] = MosesPunctNormalizer(lang) if normalise else None
    _TOKENIZER["opts"] = (aggressive, escape, lowercase)


def remove_non_printing(line):
    """Moses remove-non-printing-char.perl: every Unicode 'Other' (C*) character becomes a space."""
    return "".join(" " if unicodedata.category(c).startswith("C") else c for c in line)


def _moses_line(line):
    aggressive, escape, lowercase = _TOKENIZER["opts"]
    if _TOKENIZER["norm"] is not None:
        line = remove_non_printing(_TOKENIZER["norm"].normalize(line))
    out = _TOKENIZER["tok"].tokenize(line, aggressive_dash_splits=aggressive, escape=escape, return_str=True)
    return out.lower() if lowercase else out


def moses_tokenize(lines, lang, out_path, aggressive=False, escape=True, lowercase=False, normalise=False,
                   workers=1, desc=None):
    """Moses-tokenise ``lines`` (an iterable of str) into ``out_path`` (tokenizer.perl -l LANG [-a])."""
    init = (lang, aggressive, escape, lowercase, normalise)
    desc = desc or f"tokenise {os.path.basename(out_path)}"
    with atomic_write(out_path) as f:
        if workers > 1:
            with worker_pool(workers, _moses_init, init) as pool:
                for tok in progress(pool.imap(_moses_line, lines, chunksize=256), desc):
                    f.write(tok + "\n")
        else:
            _moses_init(*init)
            for line in progress(lines, desc):
                f.write(_moses_line(line) + "\n")


def moses_clean(src_in, tgt_in, src_out, tgt_out, min_len=1, max_len=175, ratio=1.5, max_word_length=1000):
    """Moses clean-corpus-n.perl: drop pairs with an empty side, a side shorter than ``min_len`` or
    longer than ``max_len`` words, a length ratio above ``ratio``, or a word over ``max_word_length``
    characters; whitespace is squeezed. Returns (pairs read, pairs kept)."""
    n_in = n_out = 0
    factored = None
    with atomic_write(src_out) as fo, atomic_write(tgt_out) as eo:
        tgt_it = read_lines(tgt_in, quiet=True)
        for f in progress(read_lines(src_in, quiet=True), f"clean {os.path.basename(src_in)}"):
            n_in += 1
            e = next(tgt_it, None)
            if e is None:
                raise PrepareError(f"{tgt_in} is shorter than {src_in} (ends before line {n_in})")
            if factored is None:
                factored = "|" in e or "|" in f
            if not factored:
                e, f = e.replace("|", ""), f.replace("|", "")
            e, f = e.split(), f.split()
            if not e or not f:
                continue
            ec, fc = len(e), len(f)
            if ec > max_len or fc > max_len or ec < min_len or fc < min_len:
                continue
            if ec / fc > ratio or fc / ec > ratio:
                continue
            if any(len(w) > max_word_length for w in e) or any(len(w) > max_word_length for w in f):
                continue
            fo.write(" ".join(f) + "\n")
            eo.write(" ".join(e) + "\n")
            n_out += 1
        if next(tgt_it, None) is not None:
            raise PrepareError(f"{tgt_in} is longer than {src_in} ({n_in:,} lines)")
    return n_in, n_out


def learn_joint_bpe(paths, codes_path, merges, workers=1):
    """subword-nmt learn_bpe on the concatenation of ``paths`` (the recipe's ``cat train.de train.en``)."""
    from subword_nmt.learn_bpe import learn_bpe

    buf = io.StringIO()
    for p in paths:
        with open(p, encoding="utf-8") as f:
            shutil.copyfileobj(f, buf)
    if not buf.getvalue().strip():  # subword-nmt would fail in max() of an empty vocabulary
        raise PrepareError(f"no training text to learn BPE from: {' and '.join(paths)} are empty (an empty or "
                           "fully filtered training file upstream?)")
    buf.seek(0)
    log(f"learning {merges} BPE merges on {', '.join(os.path.basename(p) for p in paths)}")
    with atomic_write(codes_path) as out:
        learn_bpe(buf, out, merges, num_workers=1)


_BPE = {}


def _bpe_init(codes_path):
    from subword_nmt.apply_bpe import BPE

    with open(codes_path, encoding="utf-8") as codes:
        _BPE["bpe"] = BPE(codes)


def _bpe_line(line):
    return _BPE["bpe"].process_line(line)


def apply_bpe(codes_path, in_path, out_path, workers=1):
    """subword-nmt apply_bpe -c CODES < in > out ("@@ " continuation markers)."""
    lines = read_lines(in_path, quiet=True)
    desc = f"apply BPE {os.path.basename(out_path)}"
    with atomic_write(out_path) as f:
        if workers > 1:
            with worker_pool(workers, _bpe_init, (codes_path,)) as pool:
                for out in progress(pool.imap(_bpe_line, (l + "\n" for l in lines), chunksize=256), desc):
                    f.write(out)
        else:
            _bpe_init(codes_path)
            for line in progress(lines, desc):
                f.write(_bpe_line(line + "\n"))


# ----------------------------------------------------------------------------- fairseq binarisation

def binarise(dest, splits, workers=1, source_lang=None, target_lang=None, joined=False, only_source=False,
             extra=()):
    """fairseq-preprocess into ``dest`` via a temporary folder renamed when complete.

    ``splits``: {"train": prefix_or_file, "valid": ..., "test": ...}. Afterwards the number of
    sentences of every split is checked against the text's line count."""
    from fairseq import options
    from fairseq_cli import preprocess as fairseq_preprocess

    for split, prefix in splits.items():  # fairseq-preprocess fails on an empty file deep inside its reader
        files = [prefix] if only_source else [f"{prefix}.{source_lang}", f"{prefix}.{target_lang}"]
        empty = [f for f in files if prefix and os.path.exists(f) and not os.path.getsize(f)]
        if empty:
            raise PrepareError(f"{empty[0]}: the {split} text is empty, nothing to binarise (an empty input file, or "
                               "every line filtered out upstream?)")
    with atomic_path(dest) as tmp:
        args = ["--destdir", tmp, "--workers", str(workers)]
        for split in ("train", "valid", "test"):
            if splits.get(split):
                args += [f"--{split}pref", splits[split]]
        if only_source:
            args.append("--only-source")
        else:
            args += ["--source-lang", source_lang, "--target-lang", target_lang]
        if joined:
            args.append("--joined-dictionary")
        args += list(extra)
        log("fairseq-preprocess " + " ".join(args))
        fairseq_preprocess.main(options.get_preprocessing_parser().parse_args(args))
        check_binarised(tmp, splits, source_lang, target_lang, only_source)
    return dest


def binarised_lengths(dest, split, lang=None, src=None, tgt=None):
    """Per-sentence token counts (incl. </s>) of a binarised split, read through fairseq."""
    from fairseq.data import data_utils

    name = f"{split}.{src}-{tgt}.{lang}" if lang else split
    ds = data_utils.load_indexed_dataset(os.path.join(dest, name), None)
    if ds is None:
        raise PrepareError(f"binarised split {name} missing under {dest}")
    import numpy as np

    return np.array(ds.sizes, copy=True)  # a copy: ds.sizes is a view of the mmap closed with ds


def check_binarised(dest, splits, src=None, tgt=None, only_source=False):
    for split, prefix in splits.items():
        if not prefix:
            continue
        langs = [None] if only_source else [src, tgt]
        for lang in langs:
            text = prefix if lang is None else f"{prefix}.{lang}"
            n_text = count_lines(text)
            n_bin = len(binarised_lengths(dest, split, lang, src, tgt))
            if n_text != n_bin:
                raise PrepareError(f"binarised {split} ({lang or 'text'}) has {n_bin:,} sentences, {text} has "
                                   f"{n_text:,} lines")


def dictionary_size(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def binarise_translation(steps, out, bin_dir, codes, final, src, tgt, workers, dataset, **extra):
    """The last step of both translation recipes: fairseq-preprocess with a joined dictionary over
    OUT/{train,valid,test}.{src,tgt}, then OUT/summary.json (pair counts, dictionary size)."""
    prefixes = {s: os.path.join(out, s) for s in ("train", "valid", "test")}
    steps.run("binarise", [codes] + list(final.values()), [os.path.join(bin_dir, f"dict.{src}.txt")],
              lambda: binarise(bin_dir, prefixes, workers, src, tgt, joined=True), {"bin_dir": bin_dir})
    summary = {"dataset": dataset, "bin_dir": bin_dir, "codes": codes, **extra,
               "pairs": {s: count_lines(final[s, src]) for s in ("train", "valid", "test")},
               "dictionary_size": dictionary_size(os.path.join(bin_dir, f"dict.{src}.txt"))}
    write_summary(os.path.join(out, "summary.json"), summary)
    return summary


def write_summary(path, summary):
    with atomic_write(path) as f:
        json.dump(summary, f, indent=1)
    log(json.dumps(summary, indent=1))


def add_common_args(parser, default_workers=1):
    parser.add_argument("--raw-dir", help="folder with the already downloaded (and optionally extracted) release; "
                        "without it the public release is downloaded into OUT_DIR/orig (needs a network)")
    parser.add_argument("--out-dir", required=True, help="output folder (text steps, codes, bin/)")
    parser.add_argument("--bin-dir", help="binarised output (default OUT_DIR/bin)")
    parser.add_argument("--workers", type=int, default=default_workers, help="processes for tokenising/BPE/binarising")
    parser.add_argument("--force", action="store_true", help="redo every step even when finished")
    return parser
