"""``bet-prepare-wmt17``: WMT17 English-German in the way of fairseq's
examples/translation/prepare-wmt14en2de.sh, with WMT17 data.

train: the parallel corpora found (or named with --corpora), each side punctuation-normalised,
non-printing characters removed, Moses-tokenised with aggressive hyphen splitting (-a); cased.
valid: newstest2016 (2,999 pairs) by default, or every N-th train pair with --valid-every N (the
fairseq WMT14 script's choice, N = 100). test: newstest2017 (3,004 pairs). dev/test sets are read
from the .sgm files of dev.tgz / test.tgz (<seg> lines, ’ -> ') or from plain NAME.{en,de} files.
Joint BPE (default 25,000 merges: a joined dictionary of about 25-26k types, the paper's 25,860)
learnt on train.en + train.de; train and valid cleaned after BPE (ratio 1.5, 1-250 tokens); then
fairseq-preprocess with a joined dictionary. The paper's "1.9M training pairs" matches Europarl v7
alone (1.92M): ``--corpora europarl-v7.de-en`` reproduces that size.
"""

import argparse
import os

from bet_fairseq.errors import check_at_least

from . import common
from .common import PrepareError, log
from .prepare_iwslt14 import xml_segments

SRC, TGT = "en", "de"
PAIR = "en-de"
CORPORA = ("europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v12.de-en", "rapid2016.de-en")
URLS = (
    "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
    "http://data.statmt.org/wmt17/translation-task/rapid2016.tgz",
    "http://data.statmt.org/wmt17/translation-task/dev.tgz",
    "http://data.statmt.org/wmt17/translation-task/test.tgz",
)
EXPECTED = {"newstest2016": 2999, "newstest2017": 3004}


def find_corpus(roots, name, lang):
    for candidate in (f"{name}.{lang}", f"{name}.{lang}.gz"):
        found = common.find_file(roots, candidate)
        if found:
            return found
    return None


def test_set(roots, name, lang):
    """Lines of a WMT test set: NAME-{ende,deen}-{src,ref}.LANG.sgm, or a plain NAME.LANG file."""
    role = "src" if lang == SRC else "ref"
    for sgm in (f"{name}-ende-{role}.{lang}.sgm", f"{name}-deen-{'ref' if role == 'src' else 'src'}.{lang}.sgm"):
        found = common.find_file(roots, sgm)
        if found:
            return found, xml_segments(found)
    found = common.find_file(roots, f"{name}.{lang}")
    if found:
        return found, [l.replace("\u2019", "'") for l in common.read_lines(found, quiet=True)]
    raise PrepareError(f"test set {name} ({lang}) not found under {roots}: expected {name}-ende-{role}.{lang}.sgm "
                       f"(WMT dev.tgz / test.tgz) or {name}.{lang}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_args(p)
    p.add_argument("--corpora", nargs="+", help=f"parallel corpus prefixes (NAME.en / NAME.de); default: those of "
                   f"{', '.join(CORPORA)} that are found")
    p.add_argument("--valid", default="newstest2016", help="valid test set name (default newstest2016)")
    p.add_argument("--valid-every", type=int, help="instead hold out every N-th train pair as valid")
    p.add_argument("--test", default="newstest2017", help="test set name (default newstest2017)")
    common.add_bpe_args(p, 25000, "default")
    p.add_argument("--max-len", type=int, default=250, help="clean-corpus maximum length after BPE (250)")
    p.add_argument("--no-size-check", action="store_true", help="accept test sets of any size (custom slices)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    common.check_options(args, "wmt17_en_de")
    common.check_bpe_options(args)
    check_at_least(args.valid_every, "--valid-every", 2, "number of pairs (every N-th train pair becomes valid)")
    check_at_least(args.max_len, "--max-len", 1, "number of tokens")
    (out, orig, tmp, bin_dir), steps = common.folders(args, text_steps=True)
    if args.raw_dir:
        if not os.path.isdir(args.raw_dir):
            raise PrepareError(f"--raw-dir {args.raw_dir} is not a folder")
        roots = [args.raw_dir, orig]
        for name in sorted(os.listdir(args.raw_dir)):
            if name.endswith((".tgz", ".tar.gz", ".tar")):
                common.extract(os.path.join(args.raw_dir, name), orig)
    else:
        roots = [orig]
        for url in URLS:
            common.extract(common.download(url, os.path.join(orig, os.path.basename(url))), orig)

    names = args.corpora or [c for c in CORPORA if find_corpus(roots, c, SRC)]
    if not names:
        raise PrepareError(f"no parallel corpus found under {roots} (looked for {', '.join(CORPORA)}.{{en,de}})")
    corpora = []
    for name in names:
        pair = {l: find_corpus(roots, name, l) for l in (SRC, TGT)}
        if None in pair.values():
            raise PrepareError(f"corpus {name}: missing {name}.{[l for l in pair if pair[l] is None][0]} under {roots}")
        common.check_parallel(pair[SRC], pair[TGT])
        corpora.append(pair)
    log("training corpora: " + ", ".join(p[SRC] for p in corpora))

    tok = {l: os.path.join(tmp, f"train.tags.{PAIR}.tok.{l}") for l in (SRC, TGT)}
    for l in (SRC, TGT):
        def lines(l=l):
            for pair in corpora:
                yield from common.read_lines(pair[l], require_final_newline=False)

        steps.run(f"tokenise-train-{l}", [p[l] for p in corpora], [tok[l]],
                  lambda l=l, lines=lines: common.moses_tokenize(lines(), l, tok[l], aggressive=True, normalise=True,
                                                                 workers=args.workers))

    split = {(s, l): os.path.join(tmp, f"{s}.{l}") for s in ("train", "valid", "test") for l in (SRC, TGT)}

    def do_split():
        common.check_parallel(tok[SRC], tok[TGT])
        for l in (SRC, TGT):
            lines = common.read_lines(tok[l], quiet=True)
            if args.valid_every:
                kept = list(lines)
                common.write_lines(split["valid", l], (x for i, x in enumerate(kept, 1) if i % args.valid_every == 0))
                common.write_lines(split["train", l], (x for i, x in enumerate(kept, 1) if i % args.valid_every != 0))
            else:
                common.write_lines(split["train", l], lines)
        sets = [("test", args.test)] + ([] if args.valid_every else [("valid", args.valid)])
        for s, name in sets:
            found = {l: test_set(roots, name, l) for l in (SRC, TGT)}
            n = {l: len(found[l][1]) for l in (SRC, TGT)}
            if n[SRC] != n[TGT]:
                raise PrepareError(f"{found[SRC][0]} has {n[SRC]:,} segments, {found[TGT][0]} has {n[TGT]:,}")
            if not args.no_size_check and name in EXPECTED and n[SRC] != EXPECTED[name]:
                raise PrepareError(f"{found[SRC][0]} has {n[SRC]:,} segments, {name} has {EXPECTED[name]:,}: "
                                   "truncated or wrong file? (--no-size-check for a custom slice)")
            for l in (SRC, TGT):
                common.moses_tokenize(found[l][1], l, split[s, l], aggressive=True, desc=f"tokenise {name}.{l}")

    steps.run("split", list(tok.values()), list(split.values()), do_split,
              {"valid": args.valid, "valid_every": args.valid_every, "test": args.test})

    codes = os.path.join(out, "code")
    if args.bpe_codes:
        import shutil

        steps.run("bpe-codes", [args.bpe_codes], [codes], lambda: shutil.copyfile(args.bpe_codes, codes))
    else:
        trains = [split["train", SRC], split["train", TGT]]
        steps.run("learn-bpe", trains, [codes], lambda: common.learn_joint_bpe(trains, codes, args.bpe_merges),
                  {"merges": args.bpe_merges})
    bpe = {}
    for (s, l), path in split.items():
        bpe[s, l] = os.path.join(tmp, f"bpe.{s}.{l}")
        steps.run(f"apply-bpe-{s}-{l}", [codes, path], [bpe[s, l]],
                  lambda path=path, dst=bpe[s, l]: common.apply_bpe(codes, path, dst, args.workers))
    final = {(s, l): os.path.join(out, f"{s}.{l}") for s in ("train", "valid", "test") for l in (SRC, TGT)}
    for s in ("train", "valid"):
        def do_clean(s=s):
            n_in, n_out = common.moses_clean(bpe[s, SRC], bpe[s, TGT], final[s, SRC], final[s, TGT], 1,
                                             args.max_len, 1.5)
            log(f"clean-corpus {s}: {n_in:,} pairs in, {n_out:,} kept")

        steps.run(f"clean-{s}", [bpe[s, SRC], bpe[s, TGT]], [final[s, SRC], final[s, TGT]], do_clean,
                  {"max_len": args.max_len})
    for l in (SRC, TGT):
        steps.run(f"copy-test-{l}", [bpe["test", l]], [final["test", l]],
                  lambda l=l: common.write_lines(final["test", l], common.read_lines(bpe["test", l], quiet=True)))

    return common.binarise_translation(steps, out, bin_dir, codes, final, SRC, TGT, args.workers, "wmt17_en_de",
                                       corpora=[p[SRC] for p in corpora])


def cli_main():
    common.cli("bet-prepare-wmt17", main)


if __name__ == "__main__":
    cli_main()
