"""The Table 2 run driver (bet-run-row), its row table and the results collector (bet-results):
two real quick runs (an IWSLT14 slice through the console script, a WikiText-2 slice in process),
then the Markdown table and loss curves built from what those runs wrote."""

import ast
import dataclasses
import json
import os
import re

import pytest
import torch

from cli_utils import ROOT, require_shared, cli

from bet_fairseq.results import rows as R
from bet_fairseq.results import runner, table
from bet_fairseq.results.curves import parse_log
from preprocess import prepare_wikitext
from preprocess.common import binarise

N_TEST_MT = 13  # not a multiple of 8: fairseq's batch_by_size would drop 5 without --required-batch-size-multiple 1


def lines_of(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def field(cfg, name):
    """A saved fairseq config section: an argparse Namespace (legacy models) or a dict (dataclass ones)."""
    if isinstance(cfg, dict):
        return cfg["_name"] if name == "arch" else cfg[name]  # a dataclass model's arch is its _name
    return getattr(cfg, name)


def write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(l + "\n" for l in lines))


@pytest.fixture(scope="module")
def iwslt_bin(tmp_path_factory):
    """The real IWSLT14 valid pairs (the recipe's BPE), split 300 / 30 / 16 and binarised."""
    folder = require_shared("iwslt14-de-en")
    work = str(tmp_path_factory.mktemp("iwslt"))
    for lang in ("de", "en"):
        lines = lines_of(os.path.join(folder, f"valid.{lang}"))
        for split, part in (("train", lines[:300]), ("valid", lines[300:330]), ("test", lines[330:330 + N_TEST_MT])):
            write(os.path.join(work, "text", f"{split}.{lang}"), part)
    prefixes = {s: os.path.join(work, "text", s) for s in ("train", "valid", "test")}
    return binarise(os.path.join(work, "bin"), prefixes, 1, "de", "en", joined=True)


@pytest.fixture(scope="module")
def wikitext_bin(tmp_path_factory):
    folder = require_shared("wikitext-2")
    work = str(tmp_path_factory.mktemp("wt2"))
    valid, test = lines_of(os.path.join(folder, "valid.txt")), lines_of(os.path.join(folder, "test.txt"))
    write(os.path.join(work, "raw", "train.txt"), valid[:300])
    write(os.path.join(work, "raw", "valid.txt"), valid[300:340])
    write(os.path.join(work, "raw", "test.txt"), test[:60])
    return prepare_wikitext.main(["--raw-dir", os.path.join(work, "raw"), "--out-dir", work, "--no-size-check"])["bin_dir"]


@pytest.fixture(scope="module")
def quick_runs(iwslt_bin, wikitext_bin, tmp_path_factory):
    runs = str(tmp_path_factory.mktemp("runs"))
    mt_dir, lm_dir = os.path.join(runs, "iwslt", "transformer"), os.path.join(runs, "wt2", "bet_sf")
    # the console script (fairseq in its process, to spare a start-up on the shared CPUs), then in process
    cli("bet-run-row", "--row", "transformer", "--dataset", "iwslt14_de_en", "--data", iwslt_bin,
        "--save-dir", mt_dir, "--quick", "--updates", "4", "--quiet", "--in-process")
    runner.main(["--row", "bet_sf", "--dataset", "wikitext2", "--data", wikitext_bin, "--save-dir", lm_dir,
                 "--quick", "--updates", "4", "--quiet", "--in-process"])
    return runs, mt_dir, lm_dir


def test_quick_runs_write_results(quick_runs, capsys):
    runs, mt_dir, lm_dir = quick_runs
    mt = json.load(open(os.path.join(mt_dir, "result.json")))
    lm = json.load(open(os.path.join(lm_dir, "result.json")))
    assert (mt["row"], mt["dataset"], mt["arch"], mt["metric"]) == ("transformer", "iwslt14_de_en",
                                                                    "transformer_iwslt_de_en", "bleu")
    assert (lm["row"], lm["dataset"], lm["arch"], lm["metric"]) == ("bet_sf", "wikitext2", "bet_sf_lm", "ppl")
    assert mt["quick"] and lm["quick"] and mt["num_updates"] == lm["num_updates"] == 4
    assert 0 <= mt["value"] <= 100 and mt["hypotheses"] == N_TEST_MT
    assert abs(lm["value"] - 2 ** lm["loss_base2"]) / lm["value"] < 0.01 and lm["value"] > 1
    for r in (mt, lm):
        assert r["wall_time_s"]["total"] > 0 and "fairseq-train" in r["command"]["train"]
        assert r["paper_value"] == {"transformer": 35.26, "bet_sf": 52.97}[r["row"]]
    # the checkpoints are what the rows asked for: the row's arch, the tiny quick sizes, the recipe's optimiser
    ckpt = torch.load(os.path.join(mt_dir, "checkpoint_best.pt"), weights_only=False)["cfg"]
    assert field(ckpt["model"], "arch") == "transformer_iwslt_de_en" and field(ckpt["model"], "encoder_embed_dim") == 32
    assert ast.literal_eval(str(ckpt["optimizer"]["adam_betas"])) == (0.9, 0.98)
    assert ckpt["criterion"]["label_smoothing"] == 0.1
    ckpt = torch.load(os.path.join(lm_dir, "checkpoint_best.pt"), weights_only=False)["cfg"]
    assert field(ckpt["model"], "arch") == "bet_sf_lm" and field(ckpt["model"], "self_attn_mode") == "bet_sf"
    assert ckpt["optimizer"]["adam_eps"] == 1e-3
    # the BLEU is the one fairseq-generate printed for the test split
    log = open(os.path.join(mt_dir, "eval.log")).read()
    assert f"BLEU4 = {mt['value']:.2f}" in log and "--remove-bpe" in mt["command"]["eval"]
    # a second run is a no-op
    capsys.readouterr()
    runner.main(["--row", "transformer", "--dataset", "iwslt14_de_en", "--data", mt["data"], "--save-dir", mt_dir,
                 "--quick"])
    assert "exists: skipping" in capsys.readouterr().out


def test_results_table_and_curves(quick_runs, tmp_path):
    runs, mt_dir, lm_dir = quick_runs
    md_path, plots = str(tmp_path / "table.md"), str(tmp_path / "plots")
    table.main([runs, "-o", md_path, "--plot-dir", plots])
    md = open(md_path).read()
    mt = json.load(open(os.path.join(mt_dir, "result.json")))
    lm = json.load(open(os.path.join(lm_dir, "result.json")))
    assert "NOT comparable" in md  # quick results are flagged
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines() if line.startswith("| "))}
    columns = rows["system"]
    assert columns == ["De-En", "En-De", "WikiText-2", "WikiText-103", "enwik8"]
    assert rows["Transformer"][0] == f"{mt['value']:.2f} (35.26)" and rows["Transformer"][2] == "- (54.53)"
    assert rows["BET(SF)"][2] == f"{lm['value']:.2f} (52.97)" and rows["BET(SF)"][0] == "- (35.85)"
    assert rows["Transformer-XL"][:2] == ["-", "-"] and len(rows) >= len(R.ROWS) + 1
    for name in ("loss_iwslt14_de_en.png", "loss_wikitext2.png"):
        with open(os.path.join(plots, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    curves = parse_log(os.path.join(lm_dir, "train.log"))
    assert [u for u, _ in curves["train"]] == [2, 4]  # --log-interval 2 of the quick mode, 4 updates
    assert curves["valid"] and curves["valid"][-1][0] == 4


def test_curves_parse_simple_format(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "2026-01-01 10:00:00 | INFO | train_inner | epoch 001:     10 / 57 loss=9.512, nll_loss=9.4, ppl=675.2, "
        "wps=1200, ups=3.1, wpb=400, bsz=16, num_updates=10, lr=0.0001, gnorm=2.1, train_wall=3, wall=5\n"
        "2026-01-01 10:00:02 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.201 | nll_loss 9.1 | "
        "ppl 588.3 | wps 5000 | wpb 420 | bsz 16 | num_updates 57\n")
    assert parse_log(str(log)) == {"train": [(10, 9.512)], "valid": [(57, 9.201)]}


def test_row_table_matches_the_paper():
    """Every row's paper numbers against Table 2 of BET_SPEC.md (parsed here, independently)."""
    spec = os.path.join(os.path.dirname(ROOT), "shared", "BET_SPEC.md")
    if not os.path.exists(spec):
        pytest.skip(f"{spec} not found")
    text = open(spec, encoding="utf-8").read()
    block = text[text.index("| system | De-En"):].split("\n\n")[0].splitlines()[2:]
    paper = {}
    for line in block:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        paper[cells[0]] = [None if c == "-" else float(c) for c in cells[1:]]
    assert set(paper) == {r.label for r in R.ROWS}
    for r in R.ROWS:
        assert [r.paper.get(d) for d in R.MT_DATASETS + R.LM_DATASETS] == paper[r.label], r.key
        assert set(r.archs) == {d for d, v in zip(R.MT_DATASETS + R.LM_DATASETS, paper[r.label]) if v is not None}


def test_every_row_has_its_script():
    expected = set()
    for r in R.ROWS:
        for d in r.archs:
            path = os.path.join(ROOT, "run", d, f"{r.key}.sh")
            expected.add(os.path.relpath(path, ROOT))
            text = open(path).read()
            assert f"--row {r.key} --dataset {d} " in text and os.access(path, os.X_OK)
    present = {os.path.relpath(os.path.join(dp, f), ROOT) for dp, _, fs in os.walk(os.path.join(ROOT, "run"))
               for f in fs if f.endswith(".sh") and os.path.dirname(os.path.join(dp, f)) != os.path.join(ROOT, "run")}
    assert present == expected


def test_full_mode_commands_follow_the_recipes(tmp_path):
    train, ev = runner.build_commands(R.row("bet_sf"), "iwslt14_de_en", "DATA", str(tmp_path), cpu=False)
    text = " ".join(train)
    # fairseq examples/translation/README.md, IWSLT'14 German to English (Transformer)
    for piece in ("--arch bet_sf_iwslt", "--share-decoder-input-output-embed", "--optimizer adam",
                  "--adam-betas (0.9, 0.98)", "--clip-norm 0.0", "--lr 0.0005", "--lr-scheduler inverse_sqrt",
                  "--warmup-updates 4000", "--dropout 0.3", "--weight-decay 0.0001",
                  "--criterion label_smoothed_cross_entropy", "--label-smoothing 0.1", "--max-tokens 4096",
                  "--eval-bleu-remove-bpe", "--best-checkpoint-metric bleu", "--maximize-best-checkpoint-metric",
                  "--log-format json"):
        assert piece in text, piece
    assert "--cpu" not in text and "--encoder-embed-dim" not in text
    assert " ".join(ev).endswith("--task translation --gen-subset test --beam 5 --batch-size 128 --remove-bpe "
                                 "--required-batch-size-multiple 1")
    train, ev = runner.build_commands(R.row("transformer_xl"), "enwik8", "DATA", str(tmp_path), cpu=True)
    assert "--task bet_truncated_bptt_lm" in " ".join(train) and "--sample-break-mode" not in train
    assert "--context-window" not in ev and "--cpu" in ev
    train, _ = runner.build_commands(R.row("transformer"), "wikitext2", "DATA", str(tmp_path), quick=True)
    assert train[train.index("--max-update") + 1] == str(R.QUICK_UPDATES)
    assert "--max-epoch" not in train and train[train.index("--decoder-embed-dim") + 1] == "32"


def test_clear_errors(tmp_path, iwslt_bin, monkeypatch, capsys):
    fake = dataclasses.replace(R.row("hopfield"), key="fake", archs={"iwslt14_de_en": "no_such_arch_iwslt"})
    monkeypatch.setattr(R, "ROWS", R.ROWS + [fake])
    args = ["--dataset", "iwslt14_de_en", "--data", iwslt_bin, "--save-dir", str(tmp_path / "s")]
    with pytest.raises(SystemExit):
        runner.main(["--row", "fake", *args])
    assert "not available: architecture 'no_such_arch_iwslt' is not registered" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runner.main(["--row", "transformer_xl", *args])
    assert "has no iwslt14_de_en entry" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runner.main(["--row", "bet_sg", *args])
    assert re.search(r"needs syntax hints: .*train\.hints\.en\.bin is missing; make them with bet-syntax-hints",
                     capsys.readouterr().err)
    with pytest.raises(SystemExit):
        runner.main(["--row", "bet_sf", "--dataset", "iwslt14_de_en", "--data", str(tmp_path), "--save-dir", "x"])
    assert "not a binarised iwslt14_de_en folder" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "s")
