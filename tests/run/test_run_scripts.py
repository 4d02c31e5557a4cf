"""The user-facing scripts: the IWSLT BET(SF) run script (the Table 2 row bet_sf) and the
side-by-side demo."""

import json
import os
import subprocess
import sys

from cli_utils import ROOT, TINY_TRANSLATION, binarise_multi30k, require_shared


def run(cmd, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], **kw.pop("env", {}))
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900, **kw)


def test_train_script_trains_and_reports_bleu(tmp_path):
    """One test run (the driver's: fairseq-generate runs on test once) and no hypothesis lines on the terminal
    (fairseq's S-/H-/D-/P- lines belong in the logs)."""
    data = binarise_multi30k(str(tmp_path / "mt"), n_train=300, n_valid=40, n_test=20)
    save = tmp_path / "ckpt"
    proc = run(["bash", "run/train_bet_sf_iwslt.sh", data, str(save), *TINY_TRANSLATION, "--max-update", "3",
                "--cpu", "--num-workers", "0"], env={"MAX_EPOCH": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line for line in (proc.stdout + proc.stderr).splitlines() if line[:2] in ("S-", "H-", "D-", "P-")] == []
    assert not (save / "generate.test.txt").exists()
    assert (save / "checkpoint_best.pt").exists()
    bleu = (save / "bleu.txt").read_text()
    assert bleu.startswith("Generate test with beam=5: BLEU4 = "), bleu
    # the main job is the Table 2 row: fairseq's IWSLT14 recipe, checkpoint_best.pt chosen by validation BLEU
    result = json.loads((save / "result.json").read_text())
    assert (result["row"], result["dataset"], result["arch"]) == ("bet_sf", "iwslt14_de_en", "bet_sf_iwslt")
    train = result["command"]["train"]
    for piece in ("--arch bet_sf_iwslt", "--eval-bleu ", "--best-checkpoint-metric bleu",
                  "--maximize-best-checkpoint-metric", "--lr 0.0005", "--warmup-updates 4000", "--max-epoch 1"):
        assert piece in train, piece
    assert "valid_bleu" in (save / "train.log").read_text()
    generated = (save / "eval.log").read_text()
    assert generated.count("\nH-") == 20, "every test sentence is translated"


def test_train_script_takes_the_arch_from_the_environment(tmp_path):
    data = binarise_multi30k(str(tmp_path / "mt"), n_train=50, n_valid=10, n_test=10)
    proc = run(["bash", "run/train_bet_sf_iwslt.sh", data, str(tmp_path / "ckpt")], env={"ARCH": "no_such_arch"})
    assert proc.returncode == 2
    assert "architecture 'no_such_arch' is not registered" in proc.stderr
    proc = run(["bash", "run/train_bet_sf_iwslt.sh"])
    assert proc.returncode == 2 and "run/train_bet_sf_iwslt.sh DATA_BIN [SAVE_DIR]" in proc.stderr


def test_train_script_explains_missing_data(tmp_path):
    proc = run(["bash", "run/train_bet_sf_iwslt.sh", str(tmp_path / "nowhere")])
    assert proc.returncode == 1
    assert "dict.de.txt not found" in proc.stderr and "bet-prepare-iwslt14" in proc.stderr


def test_demo_prints_both_bleu_scores(tmp_path):
    data = require_shared("multi30k")
    work = tmp_path / "demo"
    proc = run([sys.executable, "run/demo_side_by_side.py", "--data-dir", data, "--work-dir", str(work),
                "--max-train", "800", "--max-eval", "30", "--max-update", "3", "--bpe-merges", "200",
                "--max-tokens", "2000"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((work / "results.json").read_text())["results"]
    assert [r["arch"] for r in results] == ["vanilla_iwslt", "bet_sf_iwslt"]
    for r in results:
        assert f"| {r['model']} | {r['arch']} | {r['bleu']:.2f} |" in proc.stdout
    with open(work / "tok" / "train.en") as f:
        assert sum(1 for _ in f) == 800
    generated = (work / "checkpoints" / "bet_sf" / "eval.log").read_text()
    assert generated.count("\nH-") == 30, "every test sentence is translated"
    # A second run with the same settings reuses everything it already made.
    assert "fairseq-preprocess" in proc.stderr and "fairseq-train" in proc.stdout
    args = [sys.executable, "run/demo_side_by_side.py", "--data-dir", data, "--work-dir", str(work), "--max-train",
            "800", "--max-eval", "30", "--max-update", "3", "--bpe-merges", "200"]
    again = run(args + ["--max-tokens", "2000"])
    assert again.returncode == 0
    for tool in ("running", "fairseq-preprocess", "fairseq-train", "fairseq-generate"):
        assert tool not in again.stdout + again.stderr, tool
    assert json.loads((work / "results.json").read_text())["results"][1]["bleu"] == results[1]["bleu"]
    # Another --max-tokens (or --lr, --seed, --max-update) retrains, says so, and records what it trained with.
    other = run(args + ["--max-tokens", "1500"])
    assert other.returncode == 0, other.stderr[-3000:]
    assert other.stdout.count("made with other settings (train changed)") == 2
    assert other.stdout.count("training again from scratch") == 2
    for r in json.loads((work / "results.json").read_text())["results"]:
        assert "--max-tokens 1500" in r["settings"]["train"]


def test_demo_rejects_misaligned_data(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("train", "val", "test_2016_flickr"):
        (raw / f"{name}.de").write_text("ein hund .\nzwei hunde .\n")
        (raw / f"{name}.en").write_text("a dog .\n")
    proc = run([sys.executable, "run/demo_side_by_side.py", "--data-dir", str(raw), "--work-dir", str(tmp_path / "w")])
    assert proc.returncode != 0
    assert "train.de has 2 lines" in proc.stderr and "train.en has 1" in proc.stderr
