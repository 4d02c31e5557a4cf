"""The study's statistics against hand-worked examples: Student-t intervals over seeds, differences
paired by seed, corpus BLEU from per-sentence statistics (against sacreBLEU itself) and the paired
bootstrap on tiny constructed cases whose answer is known."""

import math

import pytest

from bet_fairseq.tools.study import plan, stats
from bet_fairseq.tools.study.cli import main


def test_t_quantiles_worked_by_hand():
    # df = 1 is the Cauchy distribution: t = tan(pi (q - 1/2)); df = 2: t = (2q - 1) sqrt(2 / (4 q (1 - q)))
    assert stats.t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)
    assert stats.t_quantile(0.975, 2) == pytest.approx(0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)), rel=1e-9)
    assert stats.t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)  # printed t tables
    assert stats.t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
    assert stats.t_quantile(0.975, 10) == pytest.approx(2.228139, abs=1e-6)


def test_t_quantiles_match_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 5, 7, 12, 30, 99):
        for q in (0.9, 0.95, 0.975, 0.995):
            assert stats.t_quantile(q, df) == pytest.approx(scipy_stats.t.ppf(q, df), rel=1e-8)


def test_mean_ci_of_three_values():
    # 1, 2, 3: mean 2, sample sd 1, half-width t_{0.975,2} / sqrt(3) = 4.302653 / 1.732051 = 2.484138
    ci = stats.mean_ci([1.0, 2.0, 3.0])
    assert ci["n"] == 3 and ci["mean"] == pytest.approx(2.0) and ci["sd"] == pytest.approx(1.0)
    assert ci["half_width"] == pytest.approx(2.484138, abs=1e-6)
    assert stats.mean_ci([5.0])["half_width"] is None and stats.mean_ci([])["mean"] is None


def test_difference_is_paired_by_seed():
    # seed 4 has no partner; the differences 1, 2, 0 have mean 1 and sd 1 (the same interval as above)
    diff = stats.paired_difference({1: 10.0, 2: 12.0, 3: 11.0}, {1: 9.0, 2: 10.0, 3: 11.0, 4: 99.0})
    assert diff["seeds"] == [1, 2, 3]
    assert diff["mean"] == pytest.approx(1.0) and diff["half_width"] == pytest.approx(2.484138, abs=1e-6)
    assert stats.resolved(diff) is False  # 1 < 2.48: not resolved
    assert stats.resolved({"mean": -3.0, "half_width": 2.0}) is True
    assert stats.resolved({"mean": 1.0, "half_width": None}) is None


def test_corpus_bleu_from_sentence_statistics_is_sacrebleus():
    import sacrebleu

    hyps = ["the cat sat on the mat .", "a dog runs", "hello world , again", "zzz"]
    refs = ["the cat is on the mat .", "the dog runs fast", "hello world again", "nothing in common"]
    counts = stats.bleu_statistics(hyps, refs)
    assert counts[1][:2] == [3, 4]  # hypothesis and reference lengths (13a tokens)
    assert counts[1][2:6] == [2, 1, 0, 0]  # "dog", "runs" and "dog runs" match
    sums = [sum(col) for col in zip(*counts)]
    assert stats.bleu_from_statistics(sums) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    two = [sum(col) for col in zip(*counts[:2])]
    assert stats.bleu_from_statistics(two) == pytest.approx(sacrebleu.corpus_bleu(hyps[:2], [refs[:2]]).score, abs=1e-9)


def mean_of_first(column_sums):
    return column_sums[0] / column_sums[1]  # statistic: [score, 1] per sentence -> the mean score


def test_two_sided_t_p_values_worked_by_hand():
    # df = 1 (Cauchy): P(|T| >= 1) = 1/2; df = 2: P(|T| >= t) = 1 - t / sqrt(2 + t^2)
    assert stats.t_two_sided_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)
    assert stats.t_two_sided_p(-1.0, 1) == pytest.approx(0.5, abs=1e-12)
    assert stats.t_two_sided_p(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6), abs=1e-12)
    # the 97.5% quantile is where the two-sided p is 0.05
    assert stats.t_two_sided_p(stats.t_quantile(0.975, 7), 7) == pytest.approx(0.05, abs=1e-9)
    # differences 1, 2, 0 over 3 seeds: t = 1 / (1 / sqrt 3) = sqrt 3 on 2 df
    diff = stats.paired_difference({1: 10.0, 2: 12.0, 3: 11.0}, {1: 9.0, 2: 10.0, 3: 11.0})
    assert diff["p"] == pytest.approx(1 - math.sqrt(3) / math.sqrt(5), abs=1e-12)
    assert stats.paired_difference({1: 2.0, 2: 2.0}, {1: 1.0, 2: 1.0})["p"] == 0.0  # a constant non-zero difference
    assert stats.paired_difference({1: 2.0}, {1: 1.0})["p"] is None


def test_holm_on_a_worked_example():
    # p = 0.01, 0.04, 0.03, 0.005 (m = 4). Sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06;
    # 0.04 x 1 = 0.04, raised to 0.06 by the step-down (an adjusted p never falls below an earlier one).
    adjusted = stats.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    assert adjusted == pytest.approx({"d": 0.02, "a": 0.03, "c": 0.06, "b": 0.06})
    assert stats.holm({"x": 0.7, "y": 0.6}) == pytest.approx({"y": 1.0, "x": 1.0})  # capped at 1
    assert stats.holm({}) == {}


def test_plateau_on_a_hand_worked_curve():
    # 10 validation points every 100 updates; the last 20% are updates 800 -> 1000: loss 2.10 -> 2.05, a drop
    # of 0.05 = 2.44% of 2.05: not met at 2%, met at 3%
    curve = [(100 * k, v) for k, v in enumerate([9.0, 5.0, 3.5, 2.8, 2.5, 2.3, 2.2, 2.15, 2.10, 2.07, 2.05])]
    result = stats.plateau(curve, share=0.2, max_drop=0.02)
    assert (result["from_update"], result["to_update"]) == (800, 1000)
    assert result["drop"] == pytest.approx(0.05) and result["relative_drop"] == pytest.approx(0.05 / 2.05)
    assert result["met"] is False and stats.plateau(curve, 0.2, 0.03)["met"] is True
    # a curve that rises at the end (overfitting) is past its steepest learning: a negative drop
    assert stats.plateau([(0, 3.0), (80, 2.0), (100, 2.2)], 0.2, 0.02)["met"] is True
    # the cut falls between points: the last point at or before 0.8 x 90 = 72 (update 60)
    assert stats.plateau([(30, 4.0), (60, 3.0), (90, 2.97)], 0.2, 0.02)["from_update"] == 60
    assert stats.plateau([(100, 2.0)], 0.2, 0.02) is None


def test_lowercased_sentence_statistics_are_sacrebleus():
    import sacrebleu

    hyps = ["the cat sat on the mat .", "a dog runs", "hello world , again"]
    refs = ["The cat is on the mat.", "The Dog runs fast", "Hello world again"]
    sums = [sum(col) for col in zip(*stats.bleu_statistics(hyps, refs, lowercase=True))]
    assert stats.bleu_from_statistics(sums) == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score, abs=1e-9)
    assert stats.sacrebleu_metric().corpus_score(hyps, [refs]).score == pytest.approx(stats.bleu_from_statistics(sums))


def test_seed_averaged_bootstrap_on_a_two_sentence_set():
    # per pair, B beats A on sentence 0 by 1 and ties on sentence 1: a resample of 2 sentences has delta 0, 0.5 or 1
    # with probabilities 1/4, 1/2, 1/4 (2.5 / 97.5 percentiles 0 and 1); two identical pairs average to the same; a
    # third pair with B = A everywhere shrinks every delta by a third.
    a, b = [[0.0, 1.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 1.0]]
    result = stats.seed_averaged_bootstrap([(a, b), (a, b)], score=mean_of_first, resamples=1000, seed=7)
    assert result["delta"] == pytest.approx(0.5) and result["ci"] == [0.0, 1.0] and result["pairs"] == 2
    third = stats.seed_averaged_bootstrap([(a, b), (a, b), (a, a)], score=mean_of_first, resamples=1000, seed=7)
    assert third["delta"] == pytest.approx(1 / 3) and third["ci"] == pytest.approx([0.0, 2 / 3])
    with pytest.raises(ValueError):
        stats.seed_averaged_bootstrap([(a, b[:1])], score=mean_of_first)


def _bleu(hyps, refs):
    return stats.sacrebleu_metric().corpus_score(hyps, [refs]).score


def test_sacrebleus_approximate_randomisation_against_exhaustive_enumeration():
    """Five sentences: every one of the 2^5 swaps of the two systems' sentences enumerated; the exact p of
    approximate randomisation (as sacreBLEU counts it, strictly greater absolute differences) is the share of
    swaps whose |BLEU difference| exceeds the observed one. sacreBLEU's 10,000 random swaps must be close."""
    import itertools

    refs = ["a man rides a red bike down the street .", "two dogs play in the snow .", "a woman reads a book .",
            "children are playing soccer in a park .", "a chef cooks food in a kitchen ."]
    base = ["a man rides a bike on the street .", "two dog play in snow .", "a woman is reading .",
            "kids play football in a park .", "a cook makes food in the kitchen ."]
    system = ["a man rides a red bike down the road .", "two dogs play in the snow .", "a woman reads a book .",
              "children play soccer in a park .", "a chef cooks in a kitchen ."]
    observed = abs(_bleu(system, refs) - _bleu(base, refs))
    greater = 0
    for swap in itertools.product((False, True), repeat=5):
        x = [s if w else b for b, s, w in zip(base, system, swap)]
        y = [b if w else s for b, s, w in zip(base, system, swap)]
        greater += abs(_bleu(x, refs) - _bleu(y, refs)) > observed + 1e-9
    exact = greater / 32
    tests = stats.sacrebleu_paired_tests(base, {"sys": system}, refs, bootstrap_resamples=1000, ar_trials=10000)
    got = tests["systems"]["sys"]
    assert got["delta"] == pytest.approx(_bleu(system, refs) - _bleu(base, refs))
    assert got["ar_p"] == pytest.approx(exact, abs=0.02)
    assert 0 < got["bs_p"] <= 1
    assert "case:lc" in tests["signatures"]["ar"] and "ar:10000" in tests["signatures"]["ar"]
    assert "bs:1000" in tests["signatures"]["bs"]
    # two-sided: the same p with the systems' roles swapped
    swapped = stats.sacrebleu_paired_tests(system, {"sys": base}, refs, bootstrap_resamples=1000, ar_trials=10000)
    assert swapped["systems"]["sys"]["ar_p"] == pytest.approx(got["ar_p"], abs=0.02)
    assert swapped["systems"]["sys"]["delta"] == pytest.approx(-got["delta"])


def test_the_table_and_its_plan():
    runs = plan.plan("cpu")
    assert len(set(runs)) == len(runs)
    seeds = {}
    for r in runs:
        seeds.setdefault((r.dataset, r.system), []).append(r.seed)
    # the headline: 8 seeds of the Transformer and BET(SF) on Multi30k, paired (the same seeds)
    assert seeds[("multi30k", "vanilla")] == seeds[("multi30k", "bet_sf")] == list(range(1, 9))
    for (dataset, system), got in seeds.items():
        assert got == list(range(1, len(got) + 1))
        if not system.startswith("bet_sg+"):  # the lambda_p sweep's points only choose a setting
            assert len(got) >= 3, (dataset, system)
    # the headline part runs first, seed by seed, the pair of each seed together
    head = plan.plan("cpu", parts=["headline", "headline2", "headline3"])
    assert head == [plan.Run("multi30k", row, s) for s in range(1, 9) for row in ("vanilla", "bet_sf")]
    assert runs[:16] == head
    # every part fits 3-4 hours on 2 cores (data preparation apart), after the parts before it
    counted = []
    for part in plan.PARTS:
        mine = [r for r in plan.plan("cpu", parts=[part]) if r not in counted]
        counted += mine
        assert plan.expected_seconds("cpu", mine, jobs=2, prepare=False) <= 4.3 * 3600, part
    assert sorted(counted, key=runs.index) == runs
    # the sweeps: Figure 3's scales (1 = the Transformer) and the lambda_p x heads grid (every point named, the
    # default's too: the row's runs at the default are its twins)
    assert {r.setting for r in runs if r.row == "diag_scale"} == {"x0", "x0.2", "x0.5", "x2"}
    grid = {(r.flags.get("--pointer-lambda"), r.flags.get("--pointer-heads")) for r in runs if r.row == "bet_sg"}
    assert grid == {(lam, heads) for lam in (0.002, 0.01, 0.05) for heads in ("mean", "first")} | {(None, None)}
    assert plan.plan("smoke", rows=["bet_sf"], datasets=["wikitext2"], max_seeds=1) == [plan.Run("wikitext2", "bet_sf", 1)]
    assert plan.plan("smoke", rows=["hopfield"], datasets=["multi30k"]) == [plan.Run("multi30k", "hopfield", s) for s in (1, 2)]


def test_a_runs_flags_are_the_setting_on_the_row():
    from bet_fairseq.tools.study import commands

    train, _ = commands.commands(plan.Run("multi30k", "diag_scale", 1, "x0.5"), "cpu", "BIN", "SAVE")
    assert train[train.index("--arch") + 1] == "diag_scale_iwslt" and train[train.index("--diag-scale") + 1] == "0.5"
    train, _ = commands.commands(plan.Run("wikitext2", "bet_sg", 2), "cpu", "BIN", "SAVE")
    assert train[train.index("--criterion") + 1] == "adaptive_loss_with_pointer" and "--label-smoothing" not in train
    assert train[train.index("--best-checkpoint-metric") + 1] == "nll_loss" and "--adam-eps" in train
    train, _ = commands.commands(plan.Run("multi30k", "bet_sg", 1, "lambda0.05-first"), "cpu", "BIN", "SAVE")
    assert train[train.index("--pointer-lambda") + 1] == "0.05" and train[train.index("--pointer-heads") + 1] == "first"
    assert train[train.index("--best-checkpoint-metric") + 1] == "nll_loss"
    assert "--maximize-best-checkpoint-metric" not in train


@pytest.mark.parametrize("argv, flag", [
    (["--scale", "huge"], "--scale"), (["--jobs", "0"], "--jobs"), (["--only", "bet_xx"], "--only"),
    (["--dataset", "wmt"], "--dataset"), (["--max-seeds", "0"], "--max-seeds"), (["--part", "all"], "--part"),
    (["--in-process", "--jobs", "2"], "--in-process"), (["--run"], "--run"),
])
def test_bad_options_name_the_flag(argv, flag, capsys):
    assert main(argv + ["--dry-run"]) == 2
    assert flag in capsys.readouterr().err


def test_paper_scale_prints_gpu_hours_and_does_not_run(tmp_path, capsys):
    assert main(["--scale", "paper", "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours" in out and "not running" in out and "fairseq-train" in out
    assert not (tmp_path / "o").exists() and not (tmp_path / "w" / "runs").exists()


def test_verdict_says_what_an_unresolved_interval_rules_out():
    from bet_fairseq.tools.study.words import verdict
    # mean -0.04, half-width 0.53: the interval [-0.57, +0.49]; for BLEU (higher is better) a gain above 0.49
    # or a loss above 0.57 is ruled out
    words = verdict({"mean": -0.04, "half_width": 0.53}, "sacrebleu_raw")
    assert "[-0.57, +0.49] includes 0" in words and "worse" in words
    assert "a gain above 0.49 or a loss above 0.57" in words
    # perplexity (lower is better): mean +3, half-width 5 gives [-2, +8]: a gain (a drop) above 2, a loss above 8
    words = verdict({"mean": 3.0, "half_width": 5.0}, "ppl")
    assert "a gain above 2.00 or a loss above 8.00" in words and "worse" in words
    # a resolved difference says so and nothing about bounds
    words = verdict({"mean": 1.0, "half_width": 0.5}, "bleu")
    assert words.startswith("better, resolved") and "rule out" not in words


def test_t_test_words_say_when_holm_undoes_a_resolved_interval():
    from bet_fairseq.tools.study.words import t_test_words
    # WikiText-2's DiagFreeMask: -1.69 +- 1.63 excludes 0, t p 0.046, Holm (4 systems, 2nd smallest p) 0.093
    words = t_test_words({"mean": -1.69, "half_width": 1.63, "p": 0.046, "p_holm": 0.093})
    assert "p = 0.046" in words and "Holm-adjusted 0.093" in words and "not once corrected" in words
    # resolved and still below 0.05 after the correction: no such clause
    assert "corrected" not in t_test_words({"mean": 62.5, "half_width": 9.9, "p": 0.001, "p_holm": 0.005})
    # not resolved by its interval: nothing to undo
    assert "corrected" not in t_test_words({"mean": -0.85, "half_width": 3.62, "p": 0.417, "p_holm": 0.417})
    assert t_test_words({"mean": 0.1, "half_width": None, "p": None}) == ""


def test_figure3_words_compare_scales_through_paired_differences_not_means():
    """Means over different seeds mislead: a point's seed-1 score (40.96) set against the Transformer's 8-seed
    mean (40.20) would read as "the best", while on seed 1 that point is 0.02 below the Transformer."""
    from bet_fairseq.tools.study.report import diag_sweep_words

    def point(c, values, diff):
        n = len(values)
        return {"scale": c, "values": dict(enumerate(values, 1)), "ci": {"n": n, "mean": sum(values) / n},
                "diff": diff}

    transformer = point(1.0, [41.0, 40.0, 39.6], None)
    c0 = point(0.0, [40.96], {"mean": -0.02, "half_width": None})
    words = diag_sweep_words([c0, transformer])
    assert "best" not in words and "c = 0: 1, c = 1: 3" in words
    assert "c = 0 -0.02 (1 seed)" in words and "none is resolved" in words
    c2 = point(2.0, [39.0, 38.5], {"mean": -1.3, "half_width": 0.4})  # -1.3 +- 0.4 excludes 0
    words = diag_sweep_words([c0, transformer, c2])
    assert "c = 2 -1.30 ± 0.40" in words and words.endswith("resolved (interval excluding 0): c = 2.")
    assert diag_sweep_words([transformer]) == "No point has a seed in common with the Transformer yet."


def test_plateau_reports_the_curves_own_step_between_validations():
    # the last 20% are updates 800 -> 1000: 7.30, 7.41, 7.23, 7.26 (a noisy curve); steps 0.11, 0.18, 0.03;
    # the largest, 0.18, is 2.48% of the final 7.26; the drop 7.30 -> 7.26 is 0.55%
    curve = [(0, 9.0), (400, 7.9), (800, 7.30), (850, 7.41), (900, 7.23), (1000, 7.26)]
    result = stats.plateau(curve, share=0.2, max_drop=0.02)
    assert result["from_update"] == 800
    assert result["largest_step"] == pytest.approx(0.18 / 7.26)
    assert result["relative_drop"] == pytest.approx(0.04 / 7.26)


def test_a_plateau_miss_is_named_with_its_drop_and_its_noise():
    from bet_fairseq.tools.study.report import _plateau_miss

    record = {"dataset": "wikitext2", "row": "bet_sg", "setting": "", "system": "bet_sg", "seed": 2,
              "plateau": {"relative_drop": 0.0211, "largest_step": 0.0254, "from_update": 2400}}
    assert _plateau_miss(record) == ("wikitext2/bet_sg/seed2 (2.11%; its consecutive validations from update 2400 "
                                     "on differ by up to 2.54%)")
