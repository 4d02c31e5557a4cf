"""``bet-prepare-enwik8``: enwik8 at the character (byte) level, as Transformer-XL's prep_enwik8.py
does it: the first 90M bytes train, the next 5M valid, the last 5M test; every byte is written as its
decimal value separated by spaces, a newline byte ends the line (fairseq's end-of-sentence token
then stands for it), so each byte is exactly one token. Binarised with ``fairseq-preprocess
--only-source``; evaluated in bits per character (fairseq-eval-lm's "Loss (base 2)").

Input: ``enwik8`` or ``enwik8.zip`` in --raw-dir (or --input FILE). The full file must be
100,000,000 bytes; for a small file (tests) give --valid-bytes/--test-bytes or
--valid-fraction/--test-fraction.
"""

import argparse
import os
import zipfile

from bet_fairseq.errors import check_at_least

from . import common
from .common import PrepareError, log

# No published SHA-256 found (the unzipped enwik8 is checked for its 100,000,000 bytes): see docs/data_and_runs.md.
URL = common.Source("http://mattmahoney.net/dc/enwik8.zip")
FULL_SIZE = 100_000_000
STANDARD_HELD_OUT = 5_000_000
SPLITS = ("train", "valid", "test")


def read_input(args, orig):
    path = args.input
    if path is None:
        roots = [args.raw_dir] if args.raw_dir else [orig]
        path = common.find_file(roots, "enwik8") or common.find_file(roots, "enwik8.zip")
        if path is None and not args.raw_dir:
            path = common.download(URL, os.path.join(orig, "enwik8.zip"))
        if path is None:
            raise PrepareError(f"no enwik8 or enwik8.zip under {args.raw_dir} (or give --input FILE)")
    option = "--input" if args.input else "--raw-dir"
    if not os.path.exists(path):
        raise PrepareError(f"{option} {path}: no such file")
    if os.path.isdir(path):
        raise PrepareError(f"{option} {path} is a folder; give the enwik8 file (or enwik8.zip) itself")
    if path.endswith(".zip"):
        try:
            with zipfile.ZipFile(path) as z:
                data = z.read("enwik8")
        except (zipfile.BadZipFile, KeyError, EOFError, OSError) as exc:
            raise PrepareError(f"{path}: corrupt or truncated zip, or no member 'enwik8' ({exc})")
    else:
        with open(path, "rb") as f:
            data = f.read()
    if not data:
        raise PrepareError(f"{option} {path} is empty: give the enwik8 file (or enwik8.zip)")
    return path, data


def split_sizes(args, total):
    if args.valid_bytes is not None or args.test_bytes is not None:
        valid = args.valid_bytes if args.valid_bytes is not None else STANDARD_HELD_OUT
        test = args.test_bytes if args.test_bytes is not None else STANDARD_HELD_OUT
    elif args.valid_fraction is not None or args.test_fraction is not None:
        valid = int(total * (args.valid_fraction or 0.05))
        test = int(total * (args.test_fraction or 0.05))
    else:
        if total != FULL_SIZE:
            raise PrepareError(f"the input has {total:,} bytes, enwik8 has {FULL_SIZE:,}: truncated or wrong file? "
                               "(give --valid-bytes/--test-bytes or --valid-fraction/--test-fraction for a slice)")
        valid = test = STANDARD_HELD_OUT
    if valid <= 0 or test <= 0 or valid + test >= total:
        raise PrepareError(f"--valid-bytes/--test-bytes: {total:,} bytes cannot hold valid {valid:,} + test {test:,} "
                           "and a train part: give smaller held-out parts")
    return total - valid - test, valid, test


def byte_tokens(part: bytes) -> str:
    """Transformer-XL's format: ' '.join(str(c) if c != newline else '\\n')."""
    return " ".join(str(c) if c != 10 else "\n" for c in part)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(p)
    p.add_argument("--input", help="the enwik8 file (or enwik8.zip) itself")
    p.add_argument("--valid-bytes", type=int, help="valid size in bytes (standard: 5,000,000)")
    p.add_argument("--test-bytes", type=int, help="test size in bytes (standard: 5,000,000)")
    p.add_argument("--valid-fraction", type=float, help="valid size as a fraction of the input")
    p.add_argument("--test-fraction", type=float, help="test size as a fraction of the input")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    common.check_options(args, "enwik8")
    for option in ("valid_bytes", "test_bytes"):
        check_at_least(getattr(args, option), "--" + option.replace("_", "-"), 1, "number of bytes")
    for option in ("valid_fraction", "test_fraction"):
        value = getattr(args, option)
        if value is not None and not 0 < value < 1:
            raise PrepareError(f"--{option.replace('_', '-')} must be a fraction between 0 and 1, got {value}")
    (out, orig, _, bin_dir), steps = common.folders(args)
    if args.raw_dir and not os.path.isdir(args.raw_dir):
        raise PrepareError(f"--raw-dir {args.raw_dir} is not a folder")
    path, data = read_input(args, orig)
    sizes = split_sizes(args, len(data))
    log(f"{path}: {len(data):,} bytes -> train {sizes[0]:,}, valid {sizes[1]:,}, test {sizes[2]:,}")
    text = {s: os.path.join(out, f"{s}.txt") for s in SPLITS}

    def do_split():
        start = 0
        for s, n in zip(SPLITS, sizes):
            part = data[start:start + n]
            start += n
            with common.atomic_write(text[s]) as f:
                f.write(byte_tokens(part))
            log(f"wrote {text[s]} ({n:,} bytes, {part.count(10):,} newlines)")

    steps.run("split", [path], list(text.values()), do_split, {"sizes": sizes})
    steps.run("binarise", list(text.values()), [os.path.join(bin_dir, "dict.txt")],
              lambda: common.binarise(bin_dir, text, args.workers, only_source=True), {"bin_dir": bin_dir})
    tokens = {s: int(common.binarised_lengths(bin_dir, s).sum()) for s in SPLITS}
    expected = {}
    start = 0
    for s, n in zip(SPLITS, sizes):
        part = data[start:start + n]
        start += n
        expected[s] = n + (0 if part.endswith(b"\n") else 1)  # the last line gets an end-of-sentence too
    if tokens != expected:
        raise PrepareError(f"binarised token counts {tokens} differ from the byte counts {expected} "
                           f"(stale {bin_dir}? run again with --force)")
    summary = {"dataset": "enwik8", "bin_dir": bin_dir, "input": path, "bytes": dict(zip(SPLITS, sizes)),
               "tokens": tokens, "unique_bytes": len(set(data)),
               "dictionary_size": common.dictionary_size(os.path.join(bin_dir, "dict.txt"))}
    common.write_summary(os.path.join(out, "summary.json"), summary)
    return summary


def cli_main():
    common.cli("bet-prepare-enwik8", main)


if __name__ == "__main__":
    cli_main()
