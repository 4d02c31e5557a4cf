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
from .common import PrepareError, log

# The author's own mirror first; the original S3 bucket (403 since 2024) second, in case it returns. The
# SHA-256 and sizes are those of the S3 release as recorded by huggingface/datasets
# (datasets/wikitext/dataset_infos.json); the mirror serves the same zip.
MIRROR, S3 = "https://wikitext.smerity.com", "https://s3.amazonaws.com/research.metamind.io/wikitext"
RELEASES = {
    "wikitext-2": {"zip": "wikitext-2-v1.zip", "lines": {"train": 36718, "valid": 3760, "test": 4358},
                   "sha256": "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c", "size": 4475746},
    "wikitext-103": {"zip": "wikitext-103-v1.zip", "lines": {"train": 1801350, "valid": 3760, "test": 4358},
                     "sha256": "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590", "size": 190229076},
}


def sources(release):
    """The places to download a release's zip from, each with its recorded SHA-256 and size."""
    return [common.Source(f"{base}/{release['zip']}", release["sha256"], release["size"]) for base in (MIRROR, S3)]
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
    common.check_options(args, args.dataset)
    (out, orig, _, bin_dir), steps = common.folders(args)
    release = RELEASES[args.dataset]
    if args.raw_dir and not os.path.isdir(args.raw_dir):
        raise PrepareError(f"--raw-dir {args.raw_dir} is not a folder")
    roots = [args.raw_dir, orig] if args.raw_dir else [orig]
    files = {s: locate(roots, s) for s in SPLITS}
    if None in files.values():
        zip_name = release["zip"]
        archive = common.find_file(roots, zip_name)
        if archive is None and not args.raw_dir:
            archive = common.download(sources(release), os.path.join(orig, zip_name))
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
    common.cli("bet-prepare-wikitext", main)


if __name__ == "__main__":
    cli_main()
