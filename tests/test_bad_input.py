"""docs/bad_input.md, row by row: each bad input a user can give a command or a Python API, and the one line (or
the right behaviour) they get. Each row of the table has a case here with the same id (checked below), run in
process so that the whole table stays cheap: a command's ``main`` with its real argument parser and ``run_tool``
(what its console script runs), fairseq's ``cli_main`` for its commands (where the plugin's error reaches the
caller as the exception itself; ``errors.excepthook`` makes it the line), the classes for the Python APIs."""

import json
import os
import re
import shutil

import pytest
import torch

from cli_utils import ROOT, USER_DIR, cli_in_process, binarise_multi30k, require_shared, session_corpus, train_in_process

from bet_fairseq import errors
from bet_fairseq.core.modules import BirdEyeCache, BirdEyeSelfAttention
from bet_fairseq.errors import ToolError, run_tool
from bet_fairseq.preprocess import prepare_enwik8, prepare_iwslt14, prepare_wikitext, prepare_wmt17, syntax_hints
from bet_fairseq.tools.analysis import cli as analyze
from bet_fairseq.tools.results import runner, table
from bet_fairseq.tools.study import cli as study

DOC = os.path.join(ROOT, "docs", "bad_input.md")
TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"]


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The inputs the cases share: a fake IWSLT14 release, a WikiText slice, binarised Multi30k, and finished
    preparations of each (as far as the refusal to overwrite them reads: their summary.json and dictionaries)."""
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tests", "preprocess"))
    from test_preprocess import fake_iwslt_release

    root = tmp_path_factory.mktemp("bad_input")
    iwslt, _ = fake_iwslt_release(str(root / "iwslt"))
    wiki = root / "wiki"
    wiki.mkdir()
    lines = open(os.path.join(require_shared("wikitext-2"), "valid.txt"), encoding="utf-8").readlines()
    for split, part in (("train", lines[:120]), ("valid", lines[120:160]), ("test", lines[160:200])):
        (wiki / f"wiki.{split}.tokens").write_text("".join(part), encoding="utf-8")
    mt_bin = session_corpus(tmp_path_factory, binarise_multi30k, n_train=120, n_valid=20, n_test=10)
    finished = {}
    for dataset, dictionary in (("wikitext-2", "dict.txt"), ("iwslt14_de_en", "dict.de.txt")):
        folder = root / f"finished-{dataset}"
        (folder / "bin").mkdir(parents=True)
        (folder / "bin" / dictionary).write_text("a 1\n")
        (folder / "summary.json").write_text(json.dumps({"dataset": dataset, "bin_dir": str(folder / "bin")}))
        finished[dataset] = str(folder)
    enwik8 = root / "enwik8"
    enwik8.write_bytes(open(require_shared("enwik8", "enwik8_small"), "rb").read()[:3000])
    return dict(root=root, iwslt=iwslt, wiki=str(wiki), mt_bin=mt_bin, finished=finished, enwik8=str(enwik8),
                text=os.path.join(os.path.dirname(mt_bin), "raw"))


def command(prog, main, argv, capsys):
    """(exit status, the last line on stderr) of a command run as its console script runs it."""
    capsys.readouterr()
    try:
        status = run_tool(prog, main, [str(a) for a in argv]) if prog else main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return status, err[-1] if err else ""


def tree(folder):
    return {os.path.join(d, n): open(os.path.join(d, n), "rb").read() for d, _, ns in os.walk(folder) for n in ns}


IW = ["--bpe-merges", "50", "--workers", "1"]


def iwslt(w, t, *extra):
    return ("bet-prepare-iwslt14", prepare_iwslt14.main, ["--raw-dir", w["iwslt"], "--out-dir", t / "o", *IW, *extra])


def wikitext(w, t, *extra):
    return ("bet-prepare-wikitext", prepare_wikitext.main,
            ["--raw-dir", w["wiki"], "--out-dir", t / "o", "--no-size-check", "--workers", "1", *extra])


def enwik8(w, t, *extra):
    return ("bet-prepare-enwik8", prepare_enwik8.main, ["--input", w["enwik8"], "--out-dir", t / "o", *extra])


def wmt17(w, t, *extra):
    (t / "e").mkdir(exist_ok=True)
    return ("bet-prepare-wmt17", prepare_wmt17.main, ["--raw-dir", t / "e", "--out-dir", t / "o", *extra])


def hints(w, t, *extra, destdir=None):
    if destdir is None:
        destdir = t / "b"
        shutil.copytree(w["mt_bin"], destdir)
    return (None, syntax_hints.main, ["--no-progress", "--workers", "1", "--lang", "en", "--destdir", destdir, *extra])


def row(w, t, *extra):
    return (None, runner.main, ["--dataset", "iwslt14_de_en", "--data", w["mt_bin"], "--row", "vanilla", "--save-dir",
                                t / "s", *extra])


def touch(path, data=b""):
    path.write_bytes(data)
    return path


def copy_raw_iwslt(w, t, change):
    raw = t / "r"
    shutil.copytree(w["iwslt"], raw)
    change(raw / "de-en")
    return raw


# id -> (the command, given (w, tmp_path)), expected exit status, a regex its last line matches
COMMANDS = {
    # bet-prepare-*
    "iwslt-outdir-holds-wikitext": (lambda w, t: ("bet-prepare-iwslt14", prepare_iwslt14.main, [
        "--raw-dir", w["iwslt"], "--out-dir", w["finished"]["wikitext-2"], *IW]), 2,
        r"--out-dir .* holds a finished wikitext-2 preparation .* --force"),
    "wikitext-outdir-holds-iwslt": (lambda w, t: ("bet-prepare-wikitext", prepare_wikitext.main, [
        "--raw-dir", w["wiki"], "--out-dir", w["finished"]["iwslt14_de_en"], "--no-size-check"]), 2,
        r"holds a finished iwslt14_de_en preparation"),
    "iwslt-bindir-holds-other-data": (lambda w, t: iwslt(w, t, "--bin-dir", os.path.join(w["finished"]["wikitext-2"],
                                                                                           "bin")), 2,
                                      r"--bin-dir .* already holds binarised data"),
    "iwslt-bpe-codes-textfile": (lambda w, t: iwslt(w, t, "--bpe-codes", os.path.join(w["text"], "train.en")), 2,
                                 r"--bpe-codes .*train\.en, line 1: .* not a subword-nmt codes file"),
    "iwslt-bpe-merges-negative": (lambda w, t: iwslt(w, t, "--bpe-merges", "-5"), 2, r"--bpe-merges must be .* >= 1"),
    "iwslt-bpe-merges-zero": (lambda w, t: iwslt(w, t, "--bpe-merges", "0"), 2, r"--bpe-merges must be .* >= 1"),
    "iwslt-bpe-codes-folder": (lambda w, t: iwslt(w, t, "--bpe-codes", t), 2, r"--bpe-codes .* is a folder"),
    "iwslt-bpe-codes-random": (lambda w, t: iwslt(w, t, "--bpe-codes", touch(t / "r", bytes(range(128, 256)) * 8)), 2,
                               r"--bpe-codes .*, line 1: not UTF-8"),
    "iwslt-bpe-codes-missing": (lambda w, t: iwslt(w, t, "--bpe-codes", t / "nope"), 2, r"--bpe-codes .*nope: no such"),
    "iwslt-workers-zero": (lambda w, t: iwslt(w, t, "--workers", "0"), 2, r"--workers must be .* >= 1, got 0"),
    "iwslt-workers-negative": (lambda w, t: iwslt(w, t, "--workers", "-2"), 2, r"--workers must be .* >= 1, got -2"),
    "iwslt-valid-every-zero": (lambda w, t: iwslt(w, t, "--valid-every", "0"), 2, r"--valid-every must be .* >= 2"),
    "iwslt-valid-every-one": (lambda w, t: iwslt(w, t, "--valid-every", "1"), 2, r"--valid-every must be .* >= 2"),
    "iwslt-raw-dir-missing": (lambda w, t: iwslt(w, t, "--raw-dir", t / "nope"), 2, r"--raw-dir .*nope is not a folder"),
    "iwslt-raw-dir-empty": (lambda w, t: iwslt(w, t, "--raw-dir", t), 2, r"no train\.tags\.de-en\.de or de-en\.tgz"),
    "iwslt-empty-train": (lambda w, t: iwslt(w, t, "--raw-dir", copy_raw_iwslt(w, t, lambda d: [
        touch(d / f"train.tags.de-en.{lang}") for lang in ("de", "en")])), 2, r"no training text to learn BPE from"),
    "iwslt-outdir-is-file": (lambda w, t: iwslt(w, t, "--out-dir", touch(t / "f")), 2, r"--out-dir .*: is a file"),
    "iwslt-bindir-is-file": (lambda w, t: iwslt(w, t, "--bin-dir", touch(t / "f")), 2, r"--bin-dir .*: is a file"),
    "iwslt-unequal-train": (lambda w, t: iwslt(w, t, "--raw-dir", copy_raw_iwslt(w, t, lambda d: (d / "train.tags.de-en.de").write_text(
        "".join((d / "train.tags.de-en.de").read_text().splitlines(True)[1:])))), 2, r"parallel files differ in length"),
    "wikitext-empty-train": (lambda w, t: wikitext(w, t, "--raw-dir", empty_train_wikitext(w, t)), 2,
                             r"wiki\.train\.tokens: the train text is empty, nothing to binarise"),
    "wikitext-raw-dir-missing": (lambda w, t: wikitext(w, t, "--raw-dir", t / "nope"), 2, r"--raw-dir .* is not a folder"),
    "wikitext-binary-file": (lambda w, t: wikitext(w, t, "--raw-dir", t), 2, r"no wiki\.train\.tokens"),
    "wikitext-dataset-bogus": (lambda w, t: wikitext(w, t, "--dataset", "wikitext-5"), 2, r"argument --dataset: invalid"),
    "wikitext-full-size-check": (lambda w, t: ("bet-prepare-wikitext", prepare_wikitext.main, [
        "--raw-dir", w["wiki"], "--out-dir", t / "o"]), 2, r"--no-size-check"),
    "wikitext-workers-zero": (lambda w, t: wikitext(w, t, "--workers", "0"), 2, r"--workers must be"),
    "enwik8-input-folder": (lambda w, t: enwik8(w, t, "--input", t), 2, r"--input .* is a folder"),
    "enwik8-input-missing": (lambda w, t: enwik8(w, t, "--input", t / "nope"), 2, r"--input .*nope: no such file"),
    "enwik8-input-empty": (lambda w, t: enwik8(w, t, "--input", touch(t / "e")), 2, r"--input .*e is empty"),
    "enwik8-valid-bytes-negative": (lambda w, t: enwik8(w, t, "--valid-bytes", "-5"), 2, r"--valid-bytes must be"),
    "enwik8-split-too-big": (lambda w, t: enwik8(w, t, "--valid-bytes", "2000", "--test-bytes", "2000"), 2,
                             r"--valid-bytes/--test-bytes: 3,000 bytes cannot hold"),
    "enwik8-fraction-over-one": (lambda w, t: enwik8(w, t, "--valid-fraction", "2"), 2, r"--valid-fraction must be a "
                                                                                          r"fraction between 0 and 1"),
    "enwik8-zip-random": (lambda w, t: enwik8(w, t, "--input", touch(t / "enwik8.zip", b"PK" * 100)), 2,
                          r"enwik8\.zip: corrupt or truncated zip"),
    "wmt17-raw-dir-empty": (lambda w, t: wmt17(w, t), 2, r"no parallel corpus found"),
    "wmt17-max-len-zero": (lambda w, t: wmt17(w, t, "--max-len", "0"), 2, r"--max-len must be"),
    "wmt17-bpe-merges-negative": (lambda w, t: wmt17(w, t, "--bpe-merges", "-1"), 2, r"--bpe-merges must be"),
    "wmt17-workers-zero": (lambda w, t: wmt17(w, t, "--workers", "0"), 2, r"--workers must be"),
    # bet-syntax-hints
    "hints-empty-text": (lambda w, t: hints(w, t, "--trainpref", touch(t / "t.en").with_suffix("")), 2,
                         r"train: .*t\.en is empty"),
    "hints-trainpref-missing": (lambda w, t: hints(w, t, "--trainpref", t / "nope"), 2, r"target text not found: .*nope"),
    "hints-destdir-missing": (lambda w, t: hints(w, t, "--trainpref", os.path.join(w["text"], "train"), destdir=t / "n"),
                              2, r"--destdir .* is not a folder"),
    "hints-workers-zero": (lambda w, t: hints(w, t, "--trainpref", os.path.join(w["text"], "train"), "--workers", "0"),
                           2, r"--workers and --batch-size must be >= 1"),
    "hints-batch-size-zero": (lambda w, t: hints(w, t, "--trainpref", os.path.join(w["text"], "train"),
                                                 "--batch-size", "0"), 2, r"--workers and --batch-size must be >= 1"),
    "hints-lang-missing-file": (lambda w, t: hints(w, t, "--trainpref", os.path.join(w["text"], "train"), "--lang",
                                                   "fr"), 2, r"--lang fr"),
    "hints-line-count-differs": (lambda w, t: hints(w, t, "--trainpref", touch(t / "t.en", b"a b\n").with_suffix("")),
                                 2, r"t\.en has 1 lines but the binarised"),
    "hints-binary-text": (lambda w, t: hints(w, t, "--trainpref", touch(t / "t.en", b"\xff\xfe\n").with_suffix("")), 2,
                          r"t\.en, line 1: not valid UTF-8"),
    "hints-destdir-is-file": (lambda w, t: hints(w, t, "--trainpref", os.path.join(w["text"], "train"),
                                                 destdir=touch(t / "f")), 2, r"--destdir .* is not a folder"),
    # bet-run-row (--dry-run: nothing trains)
    "runrow-updates-negative": (lambda w, t: row(w, t, "--updates", "-3", "--dry-run"), 2, r"--updates must be .* >= 1"),
    "runrow-updates-zero": (lambda w, t: row(w, t, "--updates", "0", "--dry-run"), 2, r"--updates must be .* >= 1"),
    "runrow-row-bogus": (lambda w, t: row(w, t, "--row", "nope", "--dry-run"), 2, r"--row: unknown row 'nope'"),
    "runrow-data-missing": (lambda w, t: row(w, t, "--data", t / "nope", "--dry-run"), 2, r"--data .*nope is not a "),
    "runrow-data-not-binarised": (lambda w, t: row(w, t, "--data", t, "--dry-run"), 2, r"--data .* is not a binarised"),
    "runrow-savedir-is-file": (lambda w, t: row(w, t, "--save-dir", touch(t / "f"), "--dry-run"), 2, r"--save-dir .*"
                                                                                                      r"is a file"),
    "runrow-other-row-savedir": (lambda w, t: row(w, t, "--quick", "--save-dir", other_run(t)), 2,
                                 r"--save-dir .* holds a run of --arch bet_sf_iwslt \(checkpoint_last\.pt"),
    "runrow-other-row-result": (lambda w, t: row(w, t, "--quick", "--save-dir", other_run(t, checkpoint=False)), 2,
                                r"holds the result\.json of --arch bet_sf_iwslt.*--force"),
    "runrow-bet-sg-no-hints": (lambda w, t: row(w, t, "--row", "bet_sg", "--dry-run"), 2, r"needs syntax hints"),
    "runrow-eval-only-no-ckpt": (lambda w, t: row(w, t, "--eval-only", "--quick"), 2, r"--eval-only: no .*checkpoint_"),
    "runrow-arch-bogus": (lambda w, t: row(w, t, "--arch", "nope_arch", "--dry-run"), 2, r"'nope_arch' is not regis"),
    "runrow-positional-junk": (lambda w, t: row(w, t, "junk", "--dry-run"), 2, r"unexpected argument 'junk'"),
    "runrow-dataset-bogus": (lambda w, t: row(w, t, "--dataset", "nope"), 2, r"argument --dataset: invalid choice"),
    "table2-bad-option": (lambda w, t: (None, runner.main, ["--nope"]), 2, r"unrecognized arguments: --nope"),
    "runrow-no-args": (lambda w, t: (None, runner.main, []), 2, r"required: --row, --dataset, --data, --save-dir"),
    # bet-results
    "results-empty-folder": (lambda w, t: (None, table.main, [t]), 2, r"no result\.json under"),
    "results-missing-path": (lambda w, t: (None, table.main, [t / "nope"]), 2, r"nope: no such file or folder"),
    "results-not-json": (lambda w, t: (None, table.main, [touch(t / "result.json", b"{broken")]), 2,
                         r"result\.json is not valid JSON"),
    "results-output-folder": (lambda w, t: (None, table.main, [t, "-o", t]), 2, r"-o .* is a folder"),
    "results-plot-dir-file": (lambda w, t: (None, table.main, [t, "--plot-dir", touch(t / "f")]), 2, r"--plot-dir .*"),
    "results-edited-value": (lambda w, t: (None, table.main, [edited_result(t)]), 2,
                             r"result\.json was changed after bet-run-row wrote it"),
    "results-wrong-schema": (lambda w, t: (None, table.main, [touch(t / "result.json", b"[1, 2]")]), 2,
                             r"holds a JSON list, not a bet-run-row result"),
    # bet-analyze (checked before any checkpoint loads)
    "analyze-missing-ckpt": (lambda w, t: (None, analyze.main, ["stats", t / "nope.pt", "--data", w["mt_bin"], "--out",
                                                               t / "st"]), 2, r"checkpoint not found: .*nope\.pt"),
    "analyze-bars-not-json": (lambda w, t: (None, analyze.main, ["bars", touch(t / "x.json", b"no"), "--out",
                                                                t / "b.png"]), 2, r"x\.json: not a bet-analyze stats"),
    # bet-reproduce (--dry-run or a report of nothing: nothing trains)
    "reproduce-scale-bogus": (lambda w, t: (None, study.main, ["--scale", "huge", "--dry-run"]), 2, r"--scale 'huge'"),
    "reproduce-jobs-zero": (lambda w, t: (None, study.main, ["--jobs", "0", "--dry-run"]), 2, r"--jobs must be >= 1"),
    "reproduce-max-seeds-zero": (lambda w, t: (None, study.main, ["--max-seeds", "0", "--dry-run"]), 2,
                                 r"--max-seeds must be >= 1"),
    "reproduce-part-bogus": (lambda w, t: (None, study.main, ["--part", "nope", "--dry-run"]), 2, r"--part 'nope'"),
    "reproduce-only-bogus": (lambda w, t: (None, study.main, ["--only", "nope", "--dry-run"]), 2, r"--only 'nope'"),
    "reproduce-dataset-bogus": (lambda w, t: (None, study.main, ["--dataset", "nope", "--dry-run"]), 2,
                                r"--dataset 'nope'"),
    "reproduce-hours-negative": (lambda w, t: (None, study.main, ["--hours", "-1", "--dry-run"]), 2, r"--hours must be"),
    "reproduce-out-is-file": (lambda w, t: (None, study.main, ["--scale", "smoke", "--work-dir", t / "w", "--out",
                                                              touch(t / "f"), "--report-only", "--no-plots"]), 2,
                              r"--out .*: is a file"),
    "reproduce-workdir-is-file": (lambda w, t: (None, study.main, ["--scale", "smoke", "--work-dir", touch(t / "f"),
                                                                  "--out", t / "o", "--report-only", "--no-plots"]), 2,
                                  r"--work-dir .*: is a file"),
    "reproduce-data-dir-missing": (lambda w, t: (None, study.main, ["--scale", "smoke", "--data-dir", t / "nope",
                                                                   "--dry-run"]), 2, r"--data-dir .*nope is not a folder"),
    "reproduce-data-dir-empty": (lambda w, t: (None, study.main, ["--scale", "smoke", "--data-dir", t, "--only",
                                                                 "vanilla", "--dataset", "multi30k", "--max-seeds", "1",
                                                                 "--work-dir", t / "w", "--out", t / "o", "--no-plots"]),
                                 2, r"--data-dir .* has no multi30k/ folder"),
    "hints-testpref-missing": (lambda w, t: hints(w, t, "--trainpref", os.path.join(w["text"], "train"), "--testpref",
                                                  t / "nope"), 2, r"test: target text not found: .*nope"),
    # run/demo_side_by_side.py (checked before any data step, training or removal)
    "demo-max-update-zero": (lambda w, t: demo(t, "--max-update", "0"), 2, r"--max-update must be .* > 0, got 0"),
    "demo-max-train-negative": (lambda w, t: demo(t, "--max-train", "-5"), 2, r"--max-train must be .* >= 0, got -5"),
    "demo-max-eval-negative": (lambda w, t: demo(t, "--max-eval", "-1"), 2, r"--max-eval must be"),
    "demo-bpe-merges-zero": (lambda w, t: demo(t, "--bpe-merges", "0"), 2, r"--bpe-merges must be"),
    "demo-max-tokens-zero": (lambda w, t: demo(t, "--max-tokens", "0"), 2, r"--max-tokens must be"),
    "demo-lr-negative": (lambda w, t: demo(t, "--lr", "-1"), 2, r"--lr must be"),
    "demo-warmup-negative": (lambda w, t: demo(t, "--warmup", "-1"), 2, r"--warmup must be"),
    "demo-data-dir-missing": (lambda w, t: demo(t, "--data-dir", t / "nope"), 2, r"--data-dir .*nope is not a folder"),
    "demo-work-dir-file": (lambda w, t: demo(t, "--work-dir", touch(t / "f")), 2, r"--work-dir .*: is a file"),
    "demo-bad-option-keeps-ckpts": (lambda w, t: demo(t, "--max-update", "0", "--work-dir", demo_run(t)), 2,
                                    r"--max-update must be"),
}


def empty_train_wikitext(w, t):
    raw = t / "raw"
    shutil.copytree(w["wiki"], raw)
    (raw / "wiki.train.tokens").write_text("")
    return raw


def demo(t, *extra):
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_side_by_side", os.path.join(ROOT, "run", "demo_side_by_side.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--data-dir", t, "--work-dir", t / "w", *extra]
    return (None, module.main, argv)


def demo_run(t):
    """A demo work folder with a trained model's checkpoint (which a bad option must leave in place)."""
    save = t / "w" / "checkpoints" / "bet_sf"
    save.mkdir(parents=True)
    (save / "checkpoint_last.pt").write_bytes(b"weights")
    return t / "w"


def other_run(t, checkpoint=True):
    """A save folder holding a finished BET(SF) run (its train.log header, result.json and checkpoint_last.pt)."""
    save = t / "d"
    save.mkdir()
    (save / "train.log").write_text("# 2026-01-01T00:00:00 fairseq-train DATA --arch bet_sf_iwslt --save-dir d\n")
    (save / "result.json").write_text(json.dumps({"row": "bet_sf", "arch": "bet_sf_iwslt", "value": 30.0}))
    if checkpoint:
        (save / "checkpoint_last.pt").write_bytes(b"weights")
    return save


def edited_result(t):
    """A result.json as bet-run-row writes it (with its digest), then its value edited by hand."""
    from bet_fairseq.tools import markers

    path = t / "r" / "result.json"
    path.parent.mkdir()
    markers.write(str(path), {"row": "vanilla", "dataset": "iwslt14_de_en", "metric": "bleu", "value": 1.0},
                  {"train": "fairseq-train ..."})
    path.write_text(path.read_text().replace('"value": 1.0', '"value": 99.0'))
    return path


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_a_command_given_bad_input_says_so_in_one_line(case, w, tmp_path, capsys):
    make, status, line = COMMANDS[case]
    prog, main, argv = make(w, tmp_path)
    before = tree(w["finished"]["wikitext-2"]), tree(w["finished"]["iwslt14_de_en"])
    got, last = command(prog, main, argv, capsys)
    assert (got, bool(re.search(line, last))) == (status, True), last
    assert "Traceback" not in last
    if case == "demo-bad-option-keeps-ckpts":
        assert (tmp_path / "w" / "checkpoints" / "bet_sf" / "checkpoint_last.pt").read_bytes() == b"weights"
    assert (tree(w["finished"]["wikitext-2"]), tree(w["finished"]["iwslt14_de_en"])) == before  # nothing replaced


# id -> (fairseq-train arguments after the data folder), the message of the error the plugin raises
TRAIN = {
    "train-bet-sg-default-task": (["--arch", "bet_sg_iwslt", *TINY], r"--arch bet_sg_iwslt is BET\(SG\): it trains "
                                                                     r"with --task translation_syntax_hints"),
    "train-savedir-under-file": (["--arch", "vanilla_iwslt", *TINY, "--save-dir", "{file}/s"],
                                 r"--save-dir .*: would be under the file"),
    "train-finetune-vanilla-into-bet": (["--arch", "bet_sf_iwslt", *TINY, "--finetune-from-model", "{vanilla}"],
                                        r"checkpoint has no .*bet_w.*trained with another --self-attn-mode"),
    "train-diag-scale-negative": (["--arch", "diag_scale_iwslt", *TINY, "--diag-scale", "-1"],
                                  r"--diag-scale must be a finite number >= 0"),
    "train-resume-other-arch": (["--arch", "bet_sf_iwslt", *TINY, "--save-dir", "{resume}"],
                                r"checkpoint has no .*bet_w.*trained with another --self-attn-mode"),
    "train-pointer-criterion-vanilla": (["--arch", "vanilla_iwslt", *TINY, "--criterion",
                                         "label_smoothed_cross_entropy_with_pointer"],
                                        r"pointer loss needs the syntax hints .* --task translation has none"),
    "train-sg-task-no-hints": (["--arch", "bet_sg_iwslt", *TINY, "--task", "translation_syntax_hints", "--criterion",
                                "label_smoothed_cross_entropy_with_pointer"],
                               r"syntax-hint file not found: .*\.hints\.en\.bin"),
    "train-self-attn-mode-bogus": (["--arch", "vanilla_iwslt", *TINY, "--self-attn-mode", "nope"],
                                   r"--self-attn-mode: unknown variant 'nope'"),
    "train-self-attn-layers-bad": (["--arch", "bet_sf_iwslt", *TINY, "--self-attn-layers", "7"],
                                   r"--self-attn-layers: '7' is outside"),
}


@pytest.fixture(scope="module")
def vanilla(w, tmp_path_factory):
    """A one-update vanilla_iwslt checkpoint of the tiny sizes."""
    return train_in_process(w["mt_bin"], tmp_path_factory.mktemp("vanilla"), "--arch", "vanilla_iwslt", *TRAIN_COMMON,
                            *TINY, updates=1)


TRAIN_COMMON = ["--optimizer", "adam", "--lr", "0.002", "--cpu", "--no-epoch-checkpoints", "--no-progress-bar",
                "--num-workers", "0", "--max-tokens", "500", "--disable-validation"]


@pytest.mark.parametrize("case", sorted(TRAIN))
def test_fairseq_train_given_bad_input_gets_the_plugins_error(case, w, tmp_path, request):
    """In process the caller gets the error (or fairseq's bare Exception raised while handling it, which
    ``errors.excepthook`` reports as the plugin's line): a ToolError naming the option."""
    argv, message = TRAIN[case]
    (tmp_path / "file").write_text("")
    fill = {"{file}": str(tmp_path / "file"),
            "{vanilla}": request.getfixturevalue("vanilla") if "{vanilla}" in argv else ""}
    if "{resume}" in argv:  # a save folder holding another architecture's checkpoint_last.pt
        (tmp_path / "resume").mkdir()
        shutil.copy(request.getfixturevalue("vanilla"), tmp_path / "resume" / "checkpoint_last.pt")
        fill["{resume}"] = str(tmp_path / "resume")
    argv = [fill.get(a, a.replace("{file}", fill["{file}"])) for a in argv]
    if "--save-dir" not in argv:
        argv += ["--save-dir", str(tmp_path / "s")]
    from fairseq_cli import train

    with pytest.raises(Exception) as caught:
        cli_in_process(train, [w["mt_bin"], "--user-dir", USER_DIR, *TRAIN_COMMON, "--max-update", "1", *argv])
    found = errors.reported_error(caught.value)
    assert isinstance(found, ToolError), caught.value
    assert re.search(message, str(found)), found


def layer():
    return BirdEyeSelfAttention(8, 2)


def _cached(batch=2):
    """A layer and the cache of its first 3 positions of a batch of ``batch``."""
    attention, cache = layer(), BirdEyeCache()
    attention(torch.randn(batch, 3, 8), cache=cache)
    return attention, cache


def _step(cached, x):
    attention, cache = cached
    return attention(x, cache=cache)


def other_dictionary(w, tmp_path):
    """A copy of the data folder whose dictionaries lost their last 40 words."""
    data = tmp_path / "other"
    shutil.copytree(w["mt_bin"], data)
    for name in ("dict.de.txt", "dict.en.txt"):
        lines = (data / name).read_text(encoding="utf-8").splitlines(True)
        (data / name).write_text("".join(lines[:-40]), encoding="utf-8")
    return str(data)


def test_a_checkpoint_with_another_data_folders_dictionary_is_named(w, vanilla, tmp_path, capsys):
    """``generate-other-dict``, ``analyze-other-dict``: torch's "size mismatch" over a screen of parameter names
    becomes the number of dictionary entries on each side."""
    from cli_utils import generate_in_process

    data = other_dictionary(w, tmp_path)
    with pytest.raises(ToolError, match=r"trained with a dictionary of [\d,]+ entries .* the data folder's dict"):
        generate_in_process([data, "--path", vanilla, "--user-dir", USER_DIR, "--cpu", "--beam", "1"])
    status, last = command(None, analyze.main, ["stats", vanilla, "--data", data, "--out", tmp_path / "st", "--cpu"],
                           capsys)
    assert status == 2 and "trained with a dictionary of" in last, last


# id -> (what a Python caller does), the ValueError's message

API = {
    "module-2d-input": (lambda: layer()(torch.randn(5, 8)), r"x must be \(B, T, 8\) .*got \(5, 8\)"),
    "module-wrong-embed": (lambda: layer()(torch.randn(2, 5, 6)), r"x must be \(B, T, 8\) .*got \(2, 5, 6\)"),
    "module-int-input": (lambda: layer()(torch.ones(2, 5, 8, dtype=torch.long)), r"x is torch\.int64, the layer"),
    "module-float64-input": (lambda: layer()(torch.randn(2, 5, 8, dtype=torch.float64)), r"x is torch\.float64"),
    "module-mask-wrong-length": (lambda: layer()(torch.randn(2, 5, 8), torch.zeros(2, 4, dtype=torch.bool)),
                                 r"padding_mask must be \(B, T\) = \(2, 5\) .*got \(2, 4\)"),
    "module-mask-wrong-batch": (lambda: layer()(torch.randn(2, 5, 8), torch.zeros(3, 5, dtype=torch.bool)),
                                r"padding_mask must be \(B, T\) = \(2, 5\) .*got \(3, 5\)"),
    "module-num-heads-zero": (lambda: BirdEyeSelfAttention(8, 0), r"num_heads must be integers >= 1"),
    "module-embed-not-divisible": (lambda: BirdEyeSelfAttention(8, 3), r"not divisible by num_heads 3"),
    "cache-other-batch": (lambda: _step(_cached(), torch.randn(3, 1, 8)), r"the cache holds a batch of 2, x a batch of 3"),
    "cache-reorder-out-of-range": (lambda: _cached()[1].reorder(torch.tensor([0, 5])),
                                   r"order holds rows 0\.\.5, the cache holds a batch of 2"),
    "cache-reorder-float": (lambda: _cached()[1].reorder(torch.tensor([0.0, 1.0])), r"1-D integer tensor"),
}


@pytest.mark.parametrize("case", sorted(API))
def test_the_python_api_names_the_expected_shape(case):
    call, message = API[case]
    with pytest.raises(ValueError, match=message):
        call()


# id -> (run/ script and its arguments), the regex of its output's error line; the scripts run as a user runs them
SCRIPTS = {
    "script-no-args": (["run/iwslt14_de_en.sh"], r"^usage: run/iwslt14_de_en\.sh ROW DATA_BIN SAVE_DIR"),
    "script-row-bogus": (["run/iwslt14_de_en.sh", "nope", "d", "s"], r"error: iwslt14_de_en has no row 'nope'"),
    "script-data-missing": (["run/wikitext2.sh", "vanilla", "{tmp}/nope", "{tmp}/s", "--dry-run"],
                            r"bet-run-row: error: --data .*nope is not a folder"),
}


@pytest.mark.parametrize("case", sorted(SCRIPTS))
def test_a_run_script_given_bad_input_says_so(case, tmp_path):
    import subprocess
    import sys

    argv, message = SCRIPTS[case]
    proc = subprocess.run(["bash", *[a.replace("{tmp}", str(tmp_path)) for a in argv]], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env=dict(os.environ, PYTHON=sys.executable, PYTHONPATH=ROOT))
    assert proc.returncode == 2 and re.search(message, proc.stderr, re.M), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_every_row_of_the_table_has_its_case():
    """docs/bad_input.md's rows with a test in this file are the cases here, and the other way round."""
    text = open(DOC, encoding="utf-8").read()
    tested = set(re.findall(r"^\| `([a-z0-9-]+)` \|[^\n]*\| test_bad_input \|", text, re.M))
    assert tested == set(COMMANDS) | set(TRAIN) | set(API) | set(SCRIPTS)


def test_kill_stops_a_command_as_ctrl_c_does(tmp_path):
    """``sigterm-is-ctrl-c``: ``kill PID`` of one of our commands unwinds as Ctrl-C (its fairseq child stopped, its
    pools terminated, one line, status 130) instead of ending the process alone and leaving its children running."""
    import subprocess
    import sys

    code = ("import os, signal, sys, time\nfrom bet_fairseq.errors import run_tool\n"
            "def main(argv):\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(30)\n"
            "sys.exit(run_tool('tool', main, [], interrupted='interrupted; run it again'))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert (proc.returncode, proc.stderr.strip()) == (130, "tool: interrupted; run it again")
