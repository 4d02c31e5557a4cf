"""The Table 2 run driver (bet-run-row), its row table, the recipes, the run/<dataset>.sh scripts and the
results collector (bet-results): two real quick runs (an IWSLT14 slice through the console script, a
WikiText-2 slice in process), then the Markdown table and loss curves built from what those runs wrote."""

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from cli_utils import ROOT, require_shared, cli

from bet_fairseq import catalog, recipes
from bet_fairseq.tools.results import runner, table
from bet_fairseq.tools.results.curves import parse_log
from bet_fairseq.preprocess import prepare_wikitext
from bet_fairseq.preprocess.common import binarise

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
    mt_dir, lm_dir = os.path.join(runs, "iwslt", "vanilla"), os.path.join(runs, "wt2", "bet_sf")
    # the console script (fairseq in its process, to spare a start-up on the shared CPUs), then in process;
    # "transformer" is the row's key of version 0.2, kept as an alias of "vanilla"
    cli("bet-run-row", "--row", "transformer", "--dataset", "iwslt14_de_en", "--data", iwslt_bin,
        "--save-dir", mt_dir, "--quick", "--updates", "4", "--quiet", "--in-process")
    runner.main(["--row", "bet_sf", "--dataset", "wikitext2", "--data", wikitext_bin, "--save-dir", lm_dir,
                 "--quick", "--updates", "4", "--quiet", "--in-process"])
    return runs, mt_dir, lm_dir


def test_quick_runs_write_results(quick_runs, capsys):
    runs, mt_dir, lm_dir = quick_runs
    mt = json.load(open(os.path.join(mt_dir, "result.json")))
    lm = json.load(open(os.path.join(lm_dir, "result.json")))
    assert (mt["row"], mt["dataset"], mt["arch"], mt["metric"]) == ("vanilla", "iwslt14_de_en", "vanilla_iwslt",
                                                                    "bleu")
    assert (lm["row"], lm["dataset"], lm["arch"], lm["metric"]) == ("bet_sf", "wikitext2", "bet_sf_lm", "ppl")
    assert mt["quick"] and lm["quick"] and mt["num_updates"] == lm["num_updates"] == 4
    assert mt["setting"] == lm["setting"] == "quick"
    assert 0 <= mt["value"] <= 100 and mt["hypotheses"] == N_TEST_MT
    assert abs(lm["value"] - 2 ** lm["loss_base2"]) / lm["value"] < 0.01 and lm["value"] > 1
    for r in (mt, lm):
        assert r["wall_time_s"]["total"] > 0 and "fairseq-train" in r["command"]["train"]
        assert r["paper_value"] == {"vanilla": 35.26, "bet_sf": 52.97}[r["row"]]
    # the checkpoints are what the rows asked for: the row's arch, the tiny quick sizes, the recipe's optimiser
    ckpt = torch.load(os.path.join(mt_dir, "checkpoint_best.pt"), weights_only=False)["cfg"]
    assert field(ckpt["model"], "arch") == "vanilla_iwslt" and field(ckpt["model"], "encoder_embed_dim") == 32
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
    runner.main(["--row", "vanilla", "--dataset", "iwslt14_de_en", "--data", mt["data"], "--save-dir", mt_dir,
                 "--quick", "--updates", "4", "--in-process"])
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
    assert rows["Transformer-XL"][:2] == ["-", "-"] and len(rows) >= len(catalog.table2_rows()) + 1
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
    assert parse_log(str(log)) == {"train": [(10, 9.512)], "valid": [(57, 9.201)],
                                   "train_nll": [(10, 9.4)], "valid_nll": [(57, 9.1)]}


def test_row_table_matches_the_paper():
    """Every row of the paper's Table 2 (tests/fixtures/paper_table2.md, copied from the paper) is a row here,
    with the paper's numbers and an architecture for each dataset it reports. Rows beyond the paper's are
    allowed (a new variant needs no paper number)."""
    with open(os.path.join(ROOT, "tests", "fixtures", "paper_table2.md"), encoding="utf-8") as f:
        text = f.read()
    block = text[text.index("| system | De-En"):].split("\n\n")[0].splitlines()[2:]
    paper = {}
    for line in block:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        paper[cells[0]] = [None if c == "-" else float(c) for c in cells[1:]]
    assert len(paper) == 12
    rows = {r.label: r for r in catalog.table2_rows()}
    assert [label for label in paper if label not in rows] == []
    columns = [d.key for d in catalog.table2_datasets()]
    for label, numbers in paper.items():
        r = rows[label]
        assert [r.paper.get(d) for d in columns] == numbers, r.key
        assert {d for d in columns if r.covers(d)} == {d for d, v in zip(columns, numbers) if v is not None}


# The rows of each dataset and their --arch, as docs/plugin.md's architecture table and Table 2 name them.
MT_ROWS = {"vanilla": "vanilla_iwslt", "reduced_diag": "reduced_diag_iwslt", "magnified_diag": "magnified_diag_iwslt",
           "diagfree": "diagfree_iwslt",
           "hopfield": "hopfield_iwslt", "localness": "localness_iwslt", "sparse_topk": "sparse_topk_iwslt",
           "bet_sg": "bet_sg_iwslt", "bet_sf": "bet_sf_iwslt", "bet_sf_nodiagmask": "bet_sf_nodiagmask_iwslt"}
LM_ROWS = set(MT_ROWS) | {"transformer_xl", "routing"}  # Transformer-XL and Routing: language modelling only
SCRIPTS = {"iwslt14_de_en.sh", "wmt17_en_de.sh", "wikitext2.sh", "wikitext103.sh", "enwik8.sh", "train_bet_sf_iwslt.sh"}


def script(*args, **env):
    return subprocess.run(["bash", *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=dict(os.environ, PYTHON=sys.executable, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1",
                                   **env))


def listed_rows(stderr):
    """{row: arch} from a dataset script's usage (lines "  ROW  --arch ARCH  Label")."""
    found = {}
    for line in stderr.splitlines():
        m = re.match(r"^  (\S+)\s+--arch (\S+)\s", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_one_script_per_dataset():
    run_dir = os.path.join(ROOT, "run")
    # the shell scripts beside them measure or check (bench_*.sh, check_*.sh); they run no Table 2 row
    assert {f for f in os.listdir(run_dir) if f.endswith(".sh") and not f.startswith(("bench_", "check_"))} == SCRIPTS
    assert all(os.access(os.path.join(run_dir, f), os.X_OK) for f in SCRIPTS)
    assert not [d for d in os.listdir(run_dir) if os.path.isdir(os.path.join(run_dir, d)) and d != "__pycache__"]
    assert not os.path.exists(os.path.join(run_dir, "make_scripts.py"))


def test_dataset_scripts_print_usage_and_their_rows():
    proc = script("run/iwslt14_de_en.sh")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("usage: run/iwslt14_de_en.sh ROW DATA_BIN SAVE_DIR [--quick]")
    assert listed_rows(proc.stderr) == MT_ROWS and "bet-prepare-iwslt14" in proc.stderr
    proc = script("run/wmt17_en_de.sh", "transformer_xl", "DATA", "SAVE")  # an LM-only row
    assert proc.returncode == 2 and "wmt17_en_de has no row 'transformer_xl'" in proc.stderr
    assert listed_rows(proc.stderr)["bet_sf"] == "bet_sf_wmt_en_de" and set(listed_rows(proc.stderr)) == set(MT_ROWS)
    for dataset, arch in (("wikitext2", "bet_sf_lm"), ("wikitext103", "bet_sf_lm_wikitext103"),
                          ("enwik8", "bet_sf_lm_enwik8")):
        proc = script(f"run/{dataset}.sh", "no_such_row", "DATA", "SAVE")
        assert proc.returncode == 2 and f"{dataset} has no row 'no_such_row'" in proc.stderr
        rows = listed_rows(proc.stderr)
        assert set(rows) == LM_ROWS and rows["bet_sf"] == arch, dataset
    proc = script("run/enwik8.sh", "bet_sf", "DATA")
    assert proc.returncode == 2 and "ROW, DATA_BIN and SAVE_DIR are all needed" in proc.stderr


def test_dataset_script_runs_the_row_driver(iwslt_bin, tmp_path):
    save = str(tmp_path / "save")
    proc = script("run/iwslt14_de_en.sh", "bet_sf", iwslt_bin, save, "--quick", "--updates", "6", "--dry-run",
                  "--", "--fp16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    train, ev = proc.stdout.strip().splitlines()
    assert re.search(r"fairseq-train\S* " + re.escape(iwslt_bin) + " ", train)
    for piece in ("--arch bet_sf_iwslt", f"--save-dir {save}", "--max-update 6", "--encoder-embed-dim 32"):
        assert piece in train, piece
    assert train.endswith(" --fp16") and "fairseq-generate" in ev and f"--path {save}/checkpoint_best.pt" in ev
    assert not os.path.exists(save)  # a dry run writes nothing


def test_full_mode_commands_follow_the_recipes(tmp_path):
    train, ev = runner.build_commands(catalog.row("bet_sf"), "iwslt14_de_en", "DATA", str(tmp_path), cpu=False)
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
    train, ev = runner.build_commands(catalog.row("transformer_xl"), "enwik8", "DATA", str(tmp_path), cpu=True)
    assert "--task bet_truncated_bptt_lm" in " ".join(train) and "--sample-break-mode" not in train
    assert "--context-window" not in ev and "--cpu" in ev
    train, _ = runner.build_commands(catalog.row("transformer"), "wikitext2", "DATA", str(tmp_path), quick=True)
    assert train[train.index("--max-update") + 1] == "20"  # docs/data_and_runs.md: quick mode, 20 updates
    assert "--max-epoch" not in train and train[train.index("--decoder-embed-dim") + 1] == "32"
    train, _ = runner.build_commands(catalog.row("bet_sf"), "iwslt14_de_en", "DATA", str(tmp_path), cpu=False,
                                     arch="transformer_iwslt_de_en")
    assert train[train.index("--arch") + 1] == "transformer_iwslt_de_en" and train.count("--arch") == 1


def test_recipes():
    """bet_fairseq/recipes.py against the settings the docs state (docs/data_and_runs.md, the README's main job)."""
    assert recipes.to_argv({"--a": 1, "--flag": True, "--gone": None, "--off": False, "--s": "(0.9, 0.98)"}) == [
        "--a", "1", "--flag", "--s", "(0.9, 0.98)"]
    assert recipes.merge({"--a": 1, "--b": 2}, {"--a": None, "--c": 3}) == {"--b": 2, "--a": None, "--c": 3}
    # the shell form the main job reads: its test-set evaluation
    out = subprocess.run([sys.executable, "-m", "bet_fairseq.recipes", "eval", "iwslt14_de_en"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    assert out == ("--task translation --gen-subset test --beam 5 --batch-size 128 --remove-bpe "
                   "--required-batch-size-multiple 1\n")
    out = subprocess.run([sys.executable, "-m", "bet_fairseq.recipes", "train", "iwslt14_de_en"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    assert "--adam-betas '(0.9, 0.98)'" in out  # quoted for the shell
    assert "--best-checkpoint-metric bleu --maximize-best-checkpoint-metric" in out
    lm = recipes.train_recipe("wikitext2")
    assert (lm["--dropout"], lm["--warmup-updates"], lm["--max-epoch"], lm["--patience"]) == (0.3, 1000, 200, 10)
    assert recipes.train_recipe("enwik8")["--max-update"] == 200000 and recipes.train_recipe("wmt17_en_de")[
        "--max-update"] == 100000
    # the demo: tiny 3+3-layer, 128-dimension models, 500 updates, same recipe otherwise; no validation BLEU
    demo = recipes.DEMO_TRAIN
    assert (demo["--encoder-layers"], demo["--decoder-layers"], demo["--decoder-embed-dim"], demo["--max-update"]) == (
        3, 3, 128, 500)
    assert demo["--criterion"] == "label_smoothed_cross_entropy" and demo["--label-smoothing"] == 0.1
    assert "--eval-bleu" not in recipes.to_argv(demo) and "--max-epoch" not in recipes.to_argv(demo)
    assert recipes.to_argv(recipes.DEMO_EVAL)[:6] == ["--task", "translation", "--gen-subset", "test", "--beam", "5"]
    # the benchmark: the IWSLT recipe's optimiser, schedule and regularisation
    bench = recipes.BENCH_TRAIN
    assert (bench["--lr"], bench["--warmup-updates"], bench["--dropout"], bench["--weight-decay"]) == (
        5e-4, 4000, 0.3, 0.0001)
    assert [m for _, m in recipes.SIDE_BY_SIDE] == ["vanilla_iwslt", "bet_sf_iwslt"]


def test_clear_errors(tmp_path, iwslt_bin, monkeypatch, capsys):
    fake = dataclasses.replace(catalog.row("hopfield"), key="no_such_arch")  # named no_such_arch_iwslt, unregistered
    monkeypatch.setitem(catalog.ROWS, "no_such_arch", fake)
    args = ["--dataset", "iwslt14_de_en", "--data", iwslt_bin, "--save-dir", str(tmp_path / "s")]
    assert runner.main(["--row", "no_such_arch", *args]) == 2
    assert "not available: architecture 'no_such_arch_iwslt' is not registered" in capsys.readouterr().err
    assert runner.main(["--row", "transformer_xl", *args]) == 2
    assert "has no iwslt14_de_en entry" in capsys.readouterr().err
    assert runner.main(["--row", "bet_sg", *args]) == 2
    assert re.search(r"needs syntax hints: .*train\.hints\.en\.bin is missing; make them with bet-syntax-hints",
                     capsys.readouterr().err)
    # the architecture of the BET(SG) row runs that row, which needs hints
    assert runner.main(["--row", "bet_sf", "--arch", "bet_sg_iwslt", *args, "--dry-run"]) == 2
    assert "row bet_sg needs syntax hints" in capsys.readouterr().err
    assert runner.main(["--row", "bet_sf", "--dataset", "iwslt14_de_en", "--data", str(tmp_path), "--save-dir", "x"]) == 2
    assert "not a binarised iwslt14_de_en folder" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("")
    assert runner.main(["--row", "bet_sf", "--dataset", "iwslt14_de_en", "--data", iwslt_bin, "--save-dir",
                        str(tmp_path / "a_file" / "save")]) == 2  # found before any training
    assert "--save-dir" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "s")


def test_a_damaged_or_stale_result_is_redone_and_a_modified_run_is_not_a_paper_run(quick_runs, capsys):
    """A result.json whose bytes changed, or that was made with other commands, is not taken as done; a run
    with --updates (or fairseq-train arguments) is recorded as "modified", not as the paper's setting."""
    _, mt_dir, _ = quick_runs
    path = os.path.join(mt_dir, "result.json")
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text.replace('"value": ', '"value": 1', 1))  # one changed byte of the number
    common = ["--row", "vanilla", "--dataset", "iwslt14_de_en", "--data", json.loads(text)["data"], "--save-dir",
              mt_dir, "--quick", "--updates", "4", "--in-process", "--quiet", "--eval-only"]
    capsys.readouterr()
    runner.main(common[:-1])  # not --eval-only: the damaged marker alone must make it run again
    out = capsys.readouterr()
    assert f"{path} is damaged" in out.err and "exists: skipping" not in out.out
    redone = json.load(open(path))
    assert redone["value"] == json.loads(text)["value"] and redone["setting"] == "quick"
    runner.main(common[:-2] + ["--", "--seed", "3"])  # other fairseq-train arguments: other settings
    out = capsys.readouterr()
    assert f"{path} was made with other settings (train changed)" in out.err
    assert json.load(open(path))["setting"] == "quick"  # --quick wins over "modified"
    args = runner.parse_args(["--row", "bet_sf", "--dataset", "iwslt14_de_en", "--data", "D", "--save-dir", "S"])
    assert runner.setting(args) == "paper"
    for extra in (["--updates", "20"], ["--", "--max-update", "20"], ["--arch", "vanilla_iwslt"]):
        assert runner.setting(runner.parse_args(["--row", "bet_sf", "--dataset", "iwslt14_de_en", "--data", "D",
                                                 "--save-dir", "S", *extra])) == "modified", extra


def test_bet_sg_lm_selects_on_the_language_model_loss_and_txl_memory_covers_a_segment(tmp_path):
    """BET(SG)'s validation loss includes lambda_p * L_p: checkpoint_best and --patience must use the LM loss
    alone (nll_loss). Transformer-XL's memory is at least one segment long and its evaluation uses same_length
    and clamp_len, as in its reference code."""
    for dataset in [d.key for d in catalog.table2_datasets() if d.kind == "lm"]:
        train, _ = runner.build_commands(catalog.row("bet_sg"), dataset, str(tmp_path), str(tmp_path / "s"), cpu=True)
        assert train[train.index("--best-checkpoint-metric") + 1] == "nll_loss"
        assert "--maximize-best-checkpoint-metric" not in train
        train, ev = runner.build_commands(catalog.row("transformer_xl"), dataset, str(tmp_path), str(tmp_path / "s"), cpu=True)
        assert int(train[train.index("--mem-len") + 1]) >= int(train[train.index("--tokens-per-sample") + 1])
        # and it is evaluated as the reference code evaluates: same_length, clamp_len
        overrides = ast.literal_eval(ev[ev.index("--model-overrides") + 1])
        assert overrides == {"same_length": True, "clamp_len": 400}
