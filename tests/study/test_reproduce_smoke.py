"""``bet-reproduce --scale smoke`` end to end on the real corpora (Multi30k and WikiText-2 slices of
../shared/data), every part (the headline pair, BET(SG)'s lambda_p sweep, the other rows with Figure 3's
diagonal sweep, the language models with their control): data preparation with the project's steps,
fairseq-train / fairseq-generate / fairseq-eval-lm through their real entry points (in process), Table 1,
the statistics, the report, its JSON and its figures; a second invocation, which must redo nothing; a
report from a partly finished study (``--report-only``)."""

import json
import os
import shutil

import pytest

from cli_utils import require_shared

from bet_fairseq import catalog
from bet_fairseq.tools.study import plan
from bet_fairseq.tools.results.curves import parse_log
from bet_fairseq.tools.study.cli import main

FIGURES = ("curves_multi30k.png", "curves_wikitext2.png", "figure45_multi30k.png", "figure45_wikitext2.png",
           "differences.png", "figure3_diag_scale.png", "pointer_sweep.png", "attention_heatmap.png",
           "decomposition_multi30k.png", "decomposition_wikitext2.png")


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
    for name in ("REPORT.md", "results.json") + FIGURES:
        assert (out / name).stat().st_size > 0, name
    data = json.loads((out / "results.json").read_text())
    got = sorted((r["dataset"], r["system"], r["seed"]) for r in data["runs"])
    assert got == sorted((r.dataset, r.system, r.seed) for r in plan.plan("smoke"))
    assert all(not names for names in data["missing"].values())
    for r in data["runs"]:
        assert r["num_updates"] == 8 and r["value"] is not None
        assert r["machine"].endswith(f", {os.cpu_count()} CPUs")  # each run says where it ran (no GPU here)
        assert r["plateau"]["to_update"] == 8 and r["plateau"]["from_update"] == 6
        if r["dataset"] == "multi30k":
            assert r["sentences"] == 20 and r["sacrebleu_raw"] is not None
    # statistics: the main rows on both datasets, paired with the Transformer on both seeds, Holm over the family
    for d, metrics in (("multi30k", ("sacrebleu_raw", "bleu")), ("wikitext2", ("ppl",))):
        for metric in metrics:
            rows = data["summary"][d][metric]
            assert set(plan.MAIN_ROWS) <= set(rows)
            for system, entry in rows.items():
                if system in plan.MAIN_ROWS:
                    assert entry["ci"]["n"] == 2
                    assert system == plan.BASELINE or entry["diff"]["seeds"] == [1, 2]
                if system != plan.BASELINE and entry["diff"].get("p") is not None:
                    assert entry["diff"]["p_holm"] >= entry["diff"]["p"]
    assert "vanilla+sentences" in data["summary"]["wikitext2"]["ppl"]
    assert data["summary"]["wikitext2"]["ppl"]["bet_sg"]["vs_control"]["diff"]["seeds"] == [1, 2]
    assert not any(s.startswith("bet_sg+") for s in data["summary"]["multi30k"]["bleu"])  # sweep points: apart
    pairs = data["significance"]["pairs"]
    assert {(p["system"], p["seed"]) for p in pairs if p["system"] == "bet_sf"} == {("bet_sf", 1), ("bet_sf", 2)}
    assert all(0 < p["bs_p"] <= 1 and 0 < p["ar_p"] <= 1 for p in pairs)
    assert "case:lc" in data["significance"]["signature_bleu"]
    assert data["test_resampling"]["multi30k"]["bet_sf"]["seeds"] == [1, 2]
    sweep = data["pointer_sweep"]
    assert sweep["complete"] and len(sweep["points"]) == 6 and "chosen" in sweep
    # BET(SG)'s seed 1 at the default setting is trained once: the row's run is a copy of the default's point
    default = "bet_sg+" + plan.pointer_setting(*catalog.POINTER_DEFAULT.values())
    copies = {(r["dataset"], r["system"], r["seed"]): r.get("copied_from") for r in data["runs"] if r.get("copied_from")}
    assert copies == {("multi30k", "bet_sg", 1): f"multi30k/{default}/seed1"}
    assert [p["scale"] for p in data["diag_sweep"]["points"]] == list(plan.DIAG_SCALES)
    for d in plan.DATASETS:  # BET(SF) taken apart: both contrasts over both seeds; sacreBLEU's resampling
        contrasts = data["decomposition"][d]["contrasts"]
        assert [(c["system"], c["against"]) for c in contrasts] == list(plan.DECOMPOSITION_CONTRASTS)
        assert all(c["diff"]["seeds"] == [1, 2] and c["diff"]["p_holm"] >= c["diff"]["p"] for c in contrasts)
        assert all((c["test_resampling"] or {}).get("seeds") == ([1, 2] if d == "multi30k" else None)
                   for c in contrasts)
    for d in plan.DATASETS:
        assert set(data["table1"][d]) == set(plan.ANALYSED)
        assert len(data["table1"][d]["bet_sf"]["matrices"]["first_pass"]) == 2  # two decoder layers
    report = (out / "REPORT.md").read_text()
    for text in ("smoke test", "not resolved", "Multi30k is not in the paper", "| BET(SG) | 2 (1, 2) |",
                 "approximate randomisation", "test-resampling", "Holm", "Plateau criterion", "paper's Transformer",
                 "commit:", "torch 2.", "where they depart from the paper", "trained on sentences (control)",
                 "chosen on Multi30k validation nll", "what the re-weighting adds to the mask"):
        assert text in report, text
    for name in FIGURES:
        assert f"({name})" in report, name
    assert f"- runs made on: {data['runs'][0]['machine']}: {len(data['runs'])} run(s)\n" in report


def test_second_invocation_redoes_nothing(study, capsys):
    root, argv, _ = study
    runs = root / "work" / "runs"
    markers = sorted(runs.glob("*/*/seed*/run.json"))
    n = len(plan.plan("smoke"))
    assert len(markers) == n
    files = markers + sorted(runs.glob("*/*/seed*/*.log")) + sorted(runs.glob("*/*/seed*/*.pt"))
    before = {p: p.stat().st_mtime_ns for p in files}
    capsys.readouterr()
    assert main(argv + ["--no-plots"]) == 0
    assert f"{n} runs, {n} finished" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in files} == before

    # a run stopped after its training (no run.json yet) is evaluated again, not trained again
    stopped = runs / "wikitext2" / "bet_sf" / "seed2"
    (stopped / "run.json").unlink()
    (root / "out" / "runs" / "wikitext2" / "bet_sf" / "seed2" / "run.json").unlink()  # not kept yet either
    assert main(argv + ["--part", "lm", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "wikitext2/bet_sf/seed2: ppl" in out and out.count("already done") == len(plan.plan("smoke", parts=["lm"])) - 1
    after = {p: p.stat().st_mtime_ns for p in files}
    assert after[stopped / "train.log"] == before[stopped / "train.log"]
    assert after[stopped / "eval.log"] != before[stopped / "eval.log"]
    assert all(after[p] == before[p] for p in files if stopped not in p.parents)


def test_report_only_on_a_partly_finished_study(study, tmp_path):
    root, argv, _ = study
    work = tmp_path / "work"
    shutil.copytree(root / "work", work, ignore=shutil.ignore_patterns("*.pt"))
    (work / "runs" / "multi30k" / "vanilla" / "seed1" / "attention.json").unlink()  # the heatmap's, kept by the run
    for run in plan.plan("smoke", parts=["lm", "decomp_lm"]) + plan.plan("smoke", parts=["pointer"])[:2]:
        shutil.rmtree(work / "runs" / run.dataset / run.system / f"seed{run.seed}", ignore_errors=True)
    out = tmp_path / "out"
    assert main(["--scale", "smoke", "--work-dir", str(work), "--out", str(out), "--report-only"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert set(data["summary"]) == {"multi30k"} and len(data["missing"]["lm"]) == len(plan.plan("smoke", parts=["lm"]))
    assert not data["pointer_sweep"]["complete"] and "chosen" not in data["pointer_sweep"]
    report = (out / "REPORT.md").read_text()
    assert "Part `lm`:" in report and "sweep is not complete" in report
    assert "attention_heatmap.png" not in report  # neither its attention.json nor checkpoints: no heatmap, no failure


def test_hours_leaves_what_does_not_fit_for_the_next_invocation(study, tmp_path, capsys):
    """``--hours`` through the real CLI, on a study whose headline pair finished in another work folder (its
    commands name that folder, so it does not count here): a budget shorter than any run starts none of them,
    names them and still writes the report."""
    root, argv, _ = study
    work = tmp_path / "work"
    shutil.copytree(root / "work", work, ignore=shutil.ignore_patterns("*.pt"))
    headline = plan.plan("smoke", parts=["headline"])
    out = tmp_path / "out"
    capsys.readouterr()
    rc = main(argv[:4] + ["--work-dir", str(work), "--out", str(out), "--in-process", "--no-plots",
                          "--part", "headline", "--hours", "0.0001"])
    printed = capsys.readouterr().out
    assert rc == 0 and f"{len(headline)} run(s) left for the next invocation" in printed
    assert printed.count("would end past --hours 0.0001") == len(headline)
    for r in headline:  # not trained again: the other folder's record and log are as they were
        folder = work / "runs" / r.dataset / r.system / f"seed{r.seed}"
        assert (folder / "train.log").read_bytes() == (root / "work" / folder.relative_to(work) / "train.log").read_bytes()
    assert (out / "REPORT.md").exists()


def test_archive_carries_the_study_to_a_new_work_folder(study, tmp_path, capsys):
    """The finished runs kept in OUT/runs (committed with a report) are put back into a new work folder: nothing
    is trained again, the report is the same, the heatmap comes without checkpoints; a damaged record is named
    and its run done again."""
    root, argv, _ = study
    kept = root / "out" / "runs"
    files = [p for p in kept.rglob("*") if p.is_file()]
    n = len(plan.plan("smoke"))
    assert len([p for p in files if p.name == "run.json"]) == n
    assert not any(p.suffix == ".pt" or p.name == "ref.detok.txt" for p in files)  # no checkpoints, no corpus text
    assert not any(str(root) in p.read_text() for p in files)  # this machine's folders are placeholders
    out, work = tmp_path / "out", tmp_path / "work"
    shutil.copytree(kept, out / "runs")
    damaged = out / "runs" / "multi30k" / "diagfree" / "seed2" / "run.json"
    damaged.write_text(damaged.read_text().replace('"seed": 2', '"seed": 3'))
    data_dir = argv[argv.index("--data-dir") + 1]
    capsys.readouterr()
    assert main(["--scale", "smoke", "--data-dir", data_dir, "--work-dir", str(work), "--out", str(out),
                 "--in-process"]) == 0
    printed = capsys.readouterr().out
    assert f"{damaged} is damaged" in printed
    assert f"[archive] {n - 1} finished runs put back" in printed
    assert "multi30k/diagfree/seed2: BLEU" in printed and printed.count("already done") == n - 1
    trained = {p.parent.name + "/" + p.parent.parent.name for p in work.glob("runs/*/*/seed*/checkpoint_best.pt")}
    assert trained == {"seed2/diagfree"}
    before = json.loads((root / "out" / "results.json").read_text())
    after = json.loads((out / "results.json").read_text())
    values = lambda d: {(r["dataset"], r["system"], r["seed"]): (r["value"], r.get("sacrebleu_raw"))
                        for r in d["runs"] if (r["system"], r["seed"]) != ("diagfree", 2)}
    assert values(after) == values(before)
    kept_attention = json.loads((kept / "multi30k" / "vanilla" / "seed1" / "attention.json").read_text())
    assert after["heatmap"] == {"split": "valid", "index": kept_attention["index"], "tokens": kept_attention["tokens"]}
    assert "attention_heatmap.png" in after["figures"]  # drawn from the kept attention: no checkpoint here
    assert json.loads(damaged.read_text())["seed"] == 2  # the run done again is kept again


def test_a_larger_max_update_goes_on_from_the_checkpoint(study, tmp_path, monkeypatch, capsys):
    """A finished run asked for more updates goes on from its checkpoint_last.pt (not from scratch) and ends
    where a run trained to that number from the start ends: the same weights, the same validation loss. (The
    module's last test: it trains the study's own run further.)"""
    import torch

    root, argv, _ = study
    on, fresh = root / "work", tmp_path / "fresh"
    folder = on / "runs" / "multi30k" / "vanilla" / "seed1"
    first = json.loads((folder / "run.json").read_text())
    table1_before = (folder / "table1.json").stat().st_mtime_ns
    shutil.copytree(on, fresh, ignore=shutil.ignore_patterns("runs"))
    monkeypatch.setitem(plan.SCALE_TABLE["smoke"].train["mt"], "--max-update", 12)
    data_dir = argv[argv.index("--data-dir") + 1]
    base = ["--scale", "smoke", "--data-dir", data_dir, "--in-process", "--part", "headline", "--only", "vanilla",
            "--max-seeds", "1", "--no-plots"]
    capsys.readouterr()
    assert main(base + ["--work-dir", str(on), "--out", str(tmp_path / "out-on")]) == 0
    assert "multi30k/vanilla/seed1: going on from checkpoint_last.pt" in capsys.readouterr().out
    assert main(base + ["--work-dir", str(fresh), "--out", str(tmp_path / "out-fresh")]) == 0
    assert "going on" not in capsys.readouterr().out
    folders = [folder, fresh / "runs" / "multi30k" / "vanilla" / "seed1"]
    records = [json.loads((f / "run.json").read_text()) for f in folders]
    assert [r["num_updates"] for r in records] == [12, 12] and [r["resumed"] for r in records] == [True, False]
    assert records[0]["value"] == records[1]["value"]
    assert records[0]["wall_time_s"]["train"] > first["wall_time_s"]["train"]  # both trainings counted
    weights = [torch.load(f / "checkpoint_last.pt", weights_only=True)["model"] for f in folders]
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.allclose(weights[0][key], weights[1][key], atol=1e-6), key
    curves = [parse_log(str(f / "train.log"))["valid_nll"] for f in folders]
    assert curves[0][-1] == curves[1][-1] and curves[0][-1][0] == 12
    assert (folder / "table1.json").stat().st_mtime_ns > table1_before  # made again, from the new checkpoint
