"""BET(SF) taken apart in the report (``tools/study/decomposition.py``): the two contrasts paired by seed over the
seeds both systems have, their seed intervals, t-test p-values and Holm's correction recomputed with scipy, their
test-resampling intervals recomputed with sacreBLEU on the same resampled sentences, and the paper's differences
from its Table 2. Synthetic records, no fairseq."""

import math
import random

import pytest

from bet_fairseq import catalog
from bet_fairseq.tools.study import decomposition, plan, report, stats, words

np = pytest.importorskip("numpy")
scipy_stats = pytest.importorskip("scipy.stats")
sacrebleu = pytest.importorskip("sacrebleu")

# seeds each cell has: the pairing must use only the seeds both systems of a contrast have
SEEDS = {"vanilla": [1, 2, 3, 4, 5], "diagfree": [1, 2, 3, 4], "bet_sf": [1, 2, 4, 5, 6],
         "bet_sf_nodiagmask": [2, 3, 4, 5, 6]}
COMMON = {("bet_sf", "diagfree"): [1, 2, 4], ("bet_sf_nodiagmask", "vanilla"): [2, 3, 4, 5]}
WORDS = "a dog cat runs sits on the mat in park man woman red blue ball".split()


def _sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _noisy(rng, sentence, rate):
    return " ".join(w if rng.random() > rate else rng.choice(WORDS) for w in sentence.split())


@pytest.fixture(scope="module")
def study():
    rng = random.Random(7)
    refs = [_sentence(rng, rng.randint(4, 9)) for _ in range(30)]
    noise = {"vanilla": 0.45, "diagfree": 0.4, "bet_sf": 0.35, "bet_sf_nodiagmask": 0.42}
    hyps, records = {}, []
    for system, seeds in SEEDS.items():
        for seed in seeds:
            h = [_noisy(rng, r, noise[system]) for r in refs]
            hyps[("multi30k", system, seed)] = h
            score = sacrebleu.corpus_bleu(h, [refs], lowercase=True).score
            records.append({"dataset": "multi30k", "row": system, "setting": "", "seed": seed, "system": system,
                            "sacrebleu_raw": score, "bleu": score + 1.0})
            records.append({"dataset": "wikitext2", "row": system, "setting": "", "seed": seed, "system": system,
                            "ppl": 200.0 - 10 * noise[system] + rng.gauss(0, 1.5)})
    counts = {k: stats.bleu_statistics(h, refs, lowercase=True) for k, h in hyps.items()}
    summary = report.summarise(records)
    parts = report.decomposition_contrasts(summary, counts, resamples=60)
    return records, hyps, refs, summary, parts


def _values(records, dataset, system, metric):
    return {r["seed"]: r[metric] for r in records if r["dataset"] == dataset and r["system"] == system}


@pytest.mark.parametrize("dataset, metric", [("multi30k", "sacrebleu_raw"), ("wikitext2", "ppl")])
def test_each_contrast_is_paired_over_the_common_seeds_with_scipys_interval_p_and_holm(study, dataset, metric):
    records, _, _, _, parts = study
    part = parts[dataset]
    assert part["metric"] == metric
    assert [(c["system"], c["against"]) for c in part["contrasts"]] == list(plan.DECOMPOSITION_CONTRASTS)
    ps = []
    for c in part["contrasts"]:
        a, b = _values(records, dataset, c["system"], metric), _values(records, dataset, c["against"], metric)
        seeds = sorted(set(a) & set(b))
        assert c["diff"]["seeds"] == seeds == COMMON[(c["system"], c["against"])]
        d = np.array([a[s] - b[s] for s in seeds])
        half = scipy_stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        p = scipy_stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).pvalue
        assert c["diff"]["mean"] == pytest.approx(d.mean(), abs=1e-12)
        assert c["diff"]["half_width"] == pytest.approx(half, rel=1e-6)
        assert c["diff"]["p"] == pytest.approx(p, rel=1e-5)
        ps.append(p)
    low, high = sorted(ps)
    holm = {low: min(1.0, 2 * low), high: max(min(1.0, 2 * low), min(1.0, high))}
    for c in part["contrasts"]:
        assert c["diff"]["p_holm"] == pytest.approx(holm[min(ps, key=lambda q: abs(q - c["diff"]["p"]))], rel=1e-5)


def test_the_test_resampling_interval_is_sacrebleus_on_the_same_resampled_sentences(study):
    records, hyps, refs, _, parts = study
    for c in parts["multi30k"]["contrasts"]:
        seeds = c["diff"]["seeds"]
        r = c["test_resampling"]
        assert r["seeds"] == seeds and r["resamples"] == 60
        rng = np.random.default_rng(2022)  # the report's draw: the same sentences for every seed's pair
        n, deltas = len(refs), []
        for _ in range(60):
            idx = rng.integers(0, n, n)
            ref = [[refs[i] for i in idx]]
            deltas.append(np.mean([sacrebleu.corpus_bleu([hyps[("multi30k", c["system"], s)][i] for i in idx], ref,
                                                         lowercase=True).score
                                   - sacrebleu.corpus_bleu([hyps[("multi30k", c["against"], s)][i] for i in idx],
                                                           ref, lowercase=True).score for s in seeds]))
        assert r["ci"] == pytest.approx(list(np.percentile(deltas, [2.5, 97.5])), abs=1e-6)
        assert r["delta"] == pytest.approx(c["diff"]["mean"], abs=1e-6)  # the observed scores are the records'
    assert all(c["test_resampling"] is None for c in parts["wikitext2"]["contrasts"])  # perplexity: none


def test_the_cells_are_the_summarys_and_the_papers_differences_its_table_2(study):
    _, _, _, summary, parts = study
    for dataset, metric in (("multi30k", "sacrebleu_raw"), ("wikitext2", "ppl")):
        ds = catalog.dataset(dataset)
        cells = {c["system"]: c for c in parts[dataset]["cells"]}
        assert {(c["mask"], c["reweighting"]): s for s, c in cells.items()} == plan.DECOMPOSITION
        for system, c in cells.items():
            assert c["values"] == summary[dataset][metric][system]["values"]
            assert c["diff"] == summary[dataset][metric][system].get("diff")
        paper = {row: catalog.row(row).paper[ds.paper] for row in plan.DECOMPOSITION.values()}
        for c in parts[dataset]["contrasts"]:
            assert c["paper_diff"] == pytest.approx(paper[c["system"]] - paper[c["against"]], abs=0.005)
    # Multi30k is not in the paper: its differences are IWSLT14 De-En's, and say so
    lines = "\n".join(decomposition.markdown(parts, set()))
    assert "### Multi30k De-En: sacreBLEU" in lines and "(IWSLT14 De-En)" in lines
    c = parts["wikitext2"]["contrasts"][0]
    assert f"| {words.interval(c['diff'], sign=True)} | n/a | {words.p_value(c['diff']['p'])} |" in lines


def test_the_figure_is_written_per_corpus(study, tmp_path):
    pytest.importorskip("matplotlib")
    _, _, _, _, parts = study
    for dataset, part in parts.items():
        path = decomposition.plot(dataset, part, str(tmp_path), "metric", True)
        assert path.endswith(f"decomposition_{dataset}.png") and (tmp_path / f"decomposition_{dataset}.png").stat().st_size > 10000


def test_a_dataset_with_one_cell_has_no_decomposition():
    records = [{"dataset": "multi30k", "row": "vanilla", "setting": "", "seed": s, "system": "vanilla",
                "sacrebleu_raw": 30.0 + s, "bleu": 31.0} for s in (1, 2)]
    assert report.decomposition_contrasts(report.summarise(records), {}, 10) == {}
