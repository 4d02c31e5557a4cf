"""``bet-prepare-wikitext``: WikiText-2 / WikiText-103 (word level, already tokenised with <unk>)
for fairseq's language_modeling task, as fairseq's examples/language_model recipe does:
``fairseq-preprocess --only-source`` on the release's train/valid/test files.

The raw folder may hold the release's ``wiki.{train,valid,test}.tokens``, the PyTorch-examples copy's
``{train,valid,test}.txt``, or the release zip (wikitext-2-v1.zip / wikitext-103-v1.zip). Files are
checked (UTF-8, complete last line, and for the named releases their known line counts) before
binarising.
"""

import argparse
import os

from . import common
from .common import PrepareError, Steps, log

RELEASES = {
    "wikitext-2": {"url": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip",
                   "lines": {"train": 36718, "valid": 3760, "test": 4358}},
    "wikitext-103": {"url": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",
                     "lines": {"train": 1801350, "valid": 3760, "test": 4358}},
}
SPLITS = ("train", "valid", "test")


def locate(roots, split):
    for name in (f"wiki.{split}.tokens", f"{split}.txt"):
        found = common.find_file(roots, name)
        if found:
            return found
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(p)
    p.add_argument("--dataset", choices=sorted(RELEASES), default="wikitext-2",
                   help="which release (sets the download and the expected line counts)")
    p.add_argument("--no-size-check", action="store_true",
                   help="accept files of any length (custom slices); UTF-8 and truncation checks stay")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    out = os.path.abspath(args.out_dir)
    orig = os.path.join(out, "orig")
    bin_dir = os.path.abspath(args.bin_dir or os.path.join(out, "bin"))
    steps = Steps(out, force=args.force)
    release = RELEASES[args.dataset]
    if args.raw_dir and not os.path.isdir(args.raw_dir):
        raise PrepareError(f"--raw-dir {args.raw_dir} is not a folder")
    roots = [args.raw_dir, orig] if args.raw_dir else [orig]
    files = {s: locate(roots, s) for s in SPLITS}
    if None in files.values():
        zip_name = os.path.basename(release["url"])
        archive = common.find_file(roots, zip_name)
        if archive is None and not args.raw_dir:
            archive = common.download(release["url"], os.path.join(orig, zip_name))
        if archive is None:
            missing = [s for s in SPLITS if files[s] is None]
            raise PrepareError(f"{args.raw_dir}: no wiki.{missing[0]}.tokens / {missing[0]}.txt and no {zip_name}")
        common.extract(archive, orig)
        files = {s: locate([orig], s) for s in SPLITS}
        if None in files.values():
            raise PrepareError(f"{archive} holds no wiki.{{train,valid,test}}.tokens")
    log(f"{args.dataset} files: " + ", ".join(files.values()))

    def check():
        stats = {}
        for s in SPLITS:
            lines = tokens = 0
            for line in common.read_lines(files[s], desc=f"check {os.path.basename(files[s])}"):
                lines += 1
                tokens += len(line.split())
            if not args.no_size_check and lines != release["lines"][s]:
                raise PrepareError(f"{files[s]} has {lines:,} lines, the {args.dataset} {s} file has "
                                   f"{release['lines'][s]:,}: truncated or wrong file? (--no-size-check for a slice)")
            stats[s] = {"lines": lines, "tokens": tokens}
        common.write_summary(os.path.join(out, "text_stats.json"), stats)

    os.makedirs(out, exist_ok=True)
    steps.run("check", list(files.values()), [os.path.join(out, "text_stats.json")], check,
              {"no_size_check": args.no_size_check, "dataset": args.dataset})
    steps.run("binarise", list(files.values()), [os.path.join(bin_dir, "dict.txt")],
              lambda: common.binarise(bin_dir, files, args.workers, only_source=True), {"bin_dir": bin_dir})
    import json

    with open(os.path.join(out, "text_stats.json"), encoding="utf-8") as f:
        stats = json.load(f)
    summary = {"dataset": args.dataset, "bin_dir": bin_dir, "files": files, "text": stats,
               "dictionary_size": common.dictionary_size(os.path.join(bin_dir, "dict.txt"))}
    common.write_summary(os.path.join(out, "summary.json"), summary)
    return summary


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
