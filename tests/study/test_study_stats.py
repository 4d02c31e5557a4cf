"""The study's statistics against hand-worked examples: Student-t intervals over seeds, differences
paired by seed, corpus BLEU from per-sentence statistics (against sacreBLEU itself) and the paired
bootstrap on tiny constructed cases whose answer is known."""

import math

import pytest

from bet_fairseq.tools.study import plan as P
from bet_fairseq.tools.study import stats as S
from bet_fairseq.tools.study.cli import main


def test_t_quantiles_worked_by_hand():
    # df = 1 is the Cauchy distribution: t = tan(pi (q - 1/2)); df = 2: t = (2q - 1) sqrt(2 / (4 q (1 - q)))
    assert S.t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)
    assert S.t_quantile(0.975, 2) == pytest.approx(0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)), rel=1e-9)
    assert S.t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)  # printed t tables
    assert S.t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
    assert S.t_quantile(0.975, 10) == pytest.approx(2.228139, abs=1e-6)


def test_t_quantiles_match_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 5, 7, 12, 30, 99):
        for q in (0.9, 0.95, 0.975, 0.995):
            assert S.t_quantile(q, df) == pytest.approx(scipy_stats.t.ppf(q, df), rel=1e-8)


def test_mean_ci_of_three_values():
    # 1, 2, 3: mean 2, sample sd 1, half-width t_{0.975,2} / sqrt(3) = 4.302653 / 1.732051 = 2.484138
    ci = S.mean_ci([1.0, 2.0, 3.0])
    assert ci["n"] == 3 and ci["mean"] == pytest.approx(2.0) and ci["sd"] == pytest.approx(1.0)
    assert ci["half_width"] == pytest.approx(2.484138, abs=1e-6)
    assert S.mean_ci([5.0])["half_width"] is None and S.mean_ci([])["mean"] is None


def test_difference_is_paired_by_seed():
    # seed 4 has no partner; the differences 1, 2, 0 have mean 1 and sd 1 (the same interval as above)
    diff = S.paired_difference({1: 10.0, 2: 12.0, 3: 11.0}, {1: 9.0, 2: 10.0, 3: 11.0, 4: 99.0})
    assert diff["seeds"] == [1, 2, 3]
    assert diff["mean"] == pytest.approx(1.0) and diff["half_width"] == pytest.approx(2.484138, abs=1e-6)
    assert S.resolved(diff) is False  # 1 < 2.48: not resolved
    assert S.resolved({"mean": -3.0, "half_width": 2.0}) is True
    assert S.resolved({"mean": 1.0, "half_width": None}) is None


def test_corpus_bleu_from_sentence_statistics_is_sacrebleus():
    import sacrebleu

    hyps = ["the cat sat on the mat .", "a dog runs", "hello world , again", "zzz"]
    refs = ["the cat is on the mat .", "the dog runs fast", "hello world again", "nothing in common"]
    stats = S.bleu_statistics(hyps, refs)
    assert stats[1][:2] == [3, 4]  # hypothesis and reference lengths (13a tokens)
    assert stats[1][2:6] == [2, 1, 0, 0]  # "dog", "runs" and "dog runs" match
    sums = [sum(col) for col in zip(*stats)]
    assert S.bleu_from_statistics(sums) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    two = [sum(col) for col in zip(*stats[:2])]
    assert S.bleu_from_statistics(two) == pytest.approx(sacrebleu.corpus_bleu(hyps[:2], [refs[:2]]).score, abs=1e-9)


def mean_of_first(column_sums):
    return column_sums[0] / column_sums[1]  # statistic: [score, 1] per sentence -> the mean score


def test_bootstrap_on_a_two_sentence_set():
    # B beats A on sentence 0 by 1 and ties on sentence 1. A resample of 2 sentences has B - A <= 0 only
    # when it draws sentence 1 twice: probability 1/4, so p = 0.25 (sd 0.014 over 1000 resamples);
    # the resampled delta is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4: 2.5 / 97.5 percentiles 0 and 1.
    a, b = [[0.0, 1.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 1.0]]
    result = S.paired_bootstrap(a, b, score=mean_of_first, resamples=1000, seed=7)
    assert result["delta"] == pytest.approx(0.5)
    assert result["p"] == pytest.approx(0.25, abs=0.05)
    assert result["ci"] == [0.0, 1.0]
    assert S.paired_bootstrap(a, b, score=mean_of_first, resamples=1000, seed=7) == result  # seeded


def test_bootstrap_extremes():
    hyps = ["a b c d", "e f g h", "i j k l"]
    perfect = S.bleu_statistics(hyps, hyps)
    wrong = S.bleu_statistics(["x y z w"] * 3, hyps)
    same = S.paired_bootstrap(perfect, perfect, resamples=200, seed=1)
    assert same["delta"] == 0 and same["p"] == 1.0 and same["ci"] == [0.0, 0.0]
    better = S.paired_bootstrap(wrong, perfect, resamples=200, seed=1)
    assert better["delta"] == pytest.approx(100.0) and better["p"] == 0.0  # B wins every resample
    worse = S.paired_bootstrap(perfect, wrong, resamples=200, seed=1)
    assert worse["delta"] == pytest.approx(-100.0) and worse["p"] == 0.0


def test_the_table_and_its_plan():
    runs = P.plan("cpu")
    for dataset in P.DATASETS:
        for row, seeds in P.STUDY.items():
            got = sorted(r.seed for r in runs if r.dataset == dataset and r.row == row)
            assert got == list(range(1, seeds["cpu"] + 1))
    assert runs[: len(P.DATASETS) * len(P.STUDY)] == [P.Run(d, r, 1) for d in P.DATASETS for r in P.STUDY]
    assert P.plan("smoke", rows=["bet_sf"], datasets=["wikitext2"], max_seeds=1) == [P.Run("wikitext2", "bet_sf", 1)]
    # the cpu scale's budget on 2 cores: about 3 hours of runs; data preparation (~27 min) is done once
    assert P.expected_seconds("cpu", runs, jobs=2, prepare=False) < 3.2 * 3600


@pytest.mark.parametrize("argv, flag", [
    (["--scale", "huge"], "--scale"), (["--jobs", "0"], "--jobs"), (["--only", "bet_xx"], "--only"),
    (["--dataset", "wmt"], "--dataset"), (["--max-seeds", "0"], "--max-seeds"),
    (["--in-process", "--jobs", "2"], "--in-process"), (["--run"], "--run"),
])
def test_bad_options_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--dry-run"])
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_paper_scale_prints_gpu_hours_and_does_not_run(tmp_path, capsys):
    assert main(["--scale", "paper", "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours" in out and "not running" in out and "fairseq-train" in out
    assert not (tmp_path / "o").exists() and not (tmp_path / "w" / "runs").exists()
