"""``bet-reproduce --scale smoke`` end to end on the real corpora (Multi30k and WikiText-2 slices of
../shared/data): data preparation with the project's steps, fairseq-train / fairseq-generate /
fairseq-eval-lm through their real entry points (in process), Table 1, the report, its JSON and PNGs;
then a second invocation, which must redo nothing."""

import json
import os

import pytest

from cli_utils import require_shared

from bet_fairseq.tools.study import plan as P
from bet_fairseq.tools.study.cli import main


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    data = os.path.dirname(require_shared("multi30k"))
    require_shared("wikitext-2")
    root = tmp_path_factory.mktemp("study")
    argv = ["--scale", "smoke", "--data-dir", data, "--work-dir", str(root / "work"), "--out", str(root / "out"),
            "--in-process"]
    return root, argv, main(argv)


def test_smoke_study_writes_the_report(study):
    root, _, rc = study
    assert rc == 0
    out = root / "out"
    for name in ("REPORT.md", "results.json", "bars.png", "curves_multi30k.png", "curves_wikitext2.png"):
        assert (out / name).stat().st_size > 0, name
    data = json.loads((out / "results.json").read_text())
    got = sorted((r["dataset"], r["row"], r["seed"]) for r in data["runs"])
    assert got == sorted((d, r, s) for d in P.DATASETS for r in P.STUDY for s in (1, 2))
    assert data["missing"] == []
    for r in data["runs"]:
        assert r["num_updates"] == 6 and r["value"] is not None
        if r["dataset"] == "multi30k":
            assert r["sentences"] == 20 and r["sacrebleu"] is not None
    # statistics: every row on both datasets, paired with the Transformer on both seeds
    for d, metrics in (("multi30k", ("bleu", "sacrebleu")), ("wikitext2", ("ppl",))):
        for metric in metrics:
            rows = data["summary"][d][metric]
            assert set(rows) == set(P.STUDY)
            for row, entry in rows.items():
                assert entry["ci"]["n"] == 2
                assert row == P.BASELINE or entry["diff"]["seeds"] == [1, 2]
    assert [b["seed"] for b in data["bootstrap"]] == [1, 2]
    assert all(b["resamples"] == 1000 and 0 <= b["p"] <= 1 for b in data["bootstrap"])
    for d in P.DATASETS:
        assert set(data["table1"][d]) == set(P.ANALYSED)
        assert len(data["table1"][d]["bet_sf"]["matrices"]["first_pass"]) == 2  # two decoder layers
    report = (out / "REPORT.md").read_text()
    for text in ("smoke test", "not resolved", "Multi30k is not in the paper", "| BET(SG) | 2 (1, 2) |",
                 "Paired bootstrap", "paper's Transformer", "commit:", "torch 2."):
        assert text in report, text


def test_second_invocation_redoes_nothing(study, capsys):
    root, argv, _ = study
    runs = root / "work" / "runs"
    markers = sorted(runs.glob("*/*/seed*/run.json"))
    assert len(markers) == 16
    files = markers + sorted(runs.glob("*/*/seed*/*.log")) + sorted(runs.glob("*/*/seed*/*.pt"))
    before = {p: p.stat().st_mtime_ns for p in files}
    capsys.readouterr()
    assert main(argv) == 0
    assert "16 runs, 16 finished" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in files} == before

    # a run stopped after its training (no run.json yet) is evaluated again, not trained again
    stopped = runs / "wikitext2" / "bet_sf" / "seed2"
    (stopped / "run.json").unlink()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "15 finished" in out and out.count("already done") == 15 and "wikitext2/bet_sf/seed2: ppl" in out
    after = {p: p.stat().st_mtime_ns for p in files}
    assert after[stopped / "train.log"] == before[stopped / "train.log"]
    assert after[stopped / "eval.log"] != before[stopped / "eval.log"]
    assert all(after[p] == before[p] for p in files if stopped not in p.parents)
