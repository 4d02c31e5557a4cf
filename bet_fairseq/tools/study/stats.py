"""Statistics of the study: Student-t confidence intervals over seeds, differences paired by seed with their
two-sided p-values and Holm's correction across the rows compared with one baseline; sacreBLEU's own paired
tests (``sacrebleu.significance``: paired bootstrap and approximate randomisation, both two-sided) for one
pair of models; a test-set resampling interval of a difference averaged over seeds; the plateau criterion
of a validation curve.

Two intervals answer two questions. The seed interval (Student t over the seed-paired differences) is how
much a difference moves when the models are trained again with other seeds, on the same test set. The
test-resampling interval (paired bootstrap over test sentences, the same draw for every seed's pair) is how
much the seed-averaged difference moves when the test sentences are drawn again, with the models fixed.

Pure Python plus numpy and sacreBLEU, so that the report needs no scipy: the t distribution is computed
in closed form for an integer number of degrees of freedom (Abramowitz & Stegun 26.7.3-4).
"""

import math
from collections import Counter
from typing import Dict, List, Optional, Sequence

LEVEL = 0.95  # every interval's confidence level; a test at 1 - LEVEL agrees with the interval

__all__ = ["t_quantile", "t_two_sided_p", "mean_ci", "paired_difference", "resolved", "holm", "plateau",
           "bleu_statistics", "bleu_from_statistics", "seed_averaged_bootstrap", "sacrebleu_paired_tests"]


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with an integer ``df`` >= 1."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)
        for k in range(1, (df - 3) // 2 + 2):
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + (s * total if df > 1 else 0.0))
    total, term = 0.0, 1.0
    for k in range(1, (df - 2) // 2 + 2):
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return s * total


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t with ``df`` degrees of freedom, by bisection."""
    if not 0.5 < q < 1 or int(df) != df or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < q < 1 and an integer df >= 1, got q={q}, df={df}")
    target, lo, hi = 2 * q - 1, 0.0, 1.0
    while _t_central(hi, int(df)) < target:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_central(mid, int(df)) < target else (lo, mid)
    return (lo + hi) / 2


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with an integer ``df`` >= 1."""
    return max(0.0, 1.0 - _t_central(abs(t), int(df)))


def mean_ci(values: Sequence[float], level: float = LEVEL) -> Dict[str, Optional[float]]:
    """Mean, sample standard deviation and the half-width of the two-sided Student-t interval
    ``mean +- t_{(1+level)/2, n-1} * sd / sqrt(n)`` (None for fewer than two values)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "half_width": None}
    mean = sum(xs) / n
    if n < 2:
        return {"n": 1, "mean": mean, "sd": None, "half_width": None}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return {"n": n, "mean": mean, "sd": sd, "half_width": t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)}


def paired_difference(values: Dict[int, float], baseline: Dict[int, float], level: float = LEVEL) -> Dict:
    """``values[s] - baseline[s]`` over the seeds both have, with its t interval (``mean_ci``)."""
    seeds = sorted(set(values) & set(baseline))
    out = mean_ci([values[s] - baseline[s] for s in seeds], level)
    out["seeds"] = seeds
    out["p"] = None  # two-sided paired t-test of "no difference"
    if out["n"] >= 2:
        if out["sd"] > 0:
            out["p"] = t_two_sided_p(out["mean"] / (out["sd"] / math.sqrt(out["n"])), out["n"] - 1)
        else:
            out["p"] = 1.0 if out["mean"] == 0 else 0.0
    return out


def holm(pvalues: Dict[str, float]) -> Dict[str, float]:
    """Holm's step-down adjusted p-values of a family of tests (each against the same baseline): the i-th
    smallest of m p-values becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``; reject where adjusted < alpha."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for j, key in enumerate(order):
        running = max(running, min(1.0, (m - j) * pvalues[key]))
        out[key] = running
    return out


def plateau(points: Sequence[Sequence[float]], share: float, max_drop: float) -> Optional[Dict]:
    """Whether a validation curve is past its steepest learning: the last ``share`` of the updates lower the
    loss by less than ``max_drop`` of its final value.

    ``points``: (update, validation loss) in update order; the loss at ``(1 - share) * last update`` is the last
    point at or before it. ``largest_step``: the largest change between consecutive validations from there to the
    end, relative to the final value, the measurement's own noise to read a drop near ``max_drop`` against.
    Returns None with fewer than two points before the end."""
    pts = sorted((int(u), float(v)) for u, v in points)
    if len(pts) < 2:
        return None
    end_update, end = pts[-1]
    cut = (1 - share) * end_update
    before = [p for p in pts if p[0] <= cut + 1e-9]
    if not before:
        return None
    start_update, start = before[-1]
    drop = start - end
    relative = drop / end if end else float("inf")
    window = [v for u, v in pts if u >= start_update]
    step = max(abs(b - a) for a, b in zip(window, window[1:]))
    return {"from_update": start_update, "to_update": end_update, "from": start, "to": end, "drop": drop,
            "relative_drop": relative, "met": relative < max_drop, "share": share, "max_drop": max_drop,
            "largest_step": step / end if end else float("inf")}


def resolved(ci: Dict) -> Optional[bool]:
    """True when the interval excludes 0 (the sign is resolved), False when it does not, None without one."""
    if ci.get("half_width") is None or ci.get("mean") is None:
        return None
    return abs(ci["mean"]) > ci["half_width"]


# ----------------------------------------------------------------------------- BLEU, sentence by sentence

MAX_ORDER = 4


def bleu_statistics(hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False) -> List[List[int]]:
    """Per sentence ``[hyp_len, ref_len, correct_1..4, total_1..4]`` on sacreBLEU's 13a tokens (of the
    lowercased text with ``lowercase``, as sacreBLEU's ``-lc``): the sufficient statistics whose column sums
    give corpus BLEU (``bleu_from_statistics``)."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    tok = Tokenizer13a()
    rows = []
    for hyp, ref in zip(hypotheses, references):
        if lowercase:
            hyp, ref = hyp.lower(), ref.lower()
        h, r = tok(hyp.strip()).split(), tok(ref.strip()).split()
        correct, total = [], []
        for n in range(1, MAX_ORDER + 1):
            hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rc = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            correct.append(sum(min(c, rc[g]) for g, c in hc.items()))
            total.append(max(len(h) - n + 1, 0))
        rows.append([len(h), len(r), *correct, *total])
    return rows


def bleu_from_statistics(column_sums: Sequence[float]) -> float:
    """Corpus BLEU (sacreBLEU's formula and default exp smoothing) from summed ``bleu_statistics``."""
    from sacrebleu.metrics.bleu import BLEU

    s = [int(v) for v in column_sums]
    return BLEU.compute_bleu(s[2:2 + MAX_ORDER], s[2 + MAX_ORDER:], s[0], s[1], smooth_method="exp").score


def seed_averaged_bootstrap(pairs, score=bleu_from_statistics, resamples: int = 1000, seed: int = 12345,
                            level: float = LEVEL) -> Dict:
    """The test-resampling interval of a difference averaged over seeds: ``resamples`` times, draw as many test
    sentences as the set has, with replacement, the same draw for every pair, and average ``score(B) - score(A)``
    over the pairs (Koehn 2004's paired bootstrap, over the seeds' pairs at once).

    ``pairs``: per seed, (A's, B's) sufficient statistics, one row per sentence (``bleu_statistics``). Returns the
    observed mean difference and the percentile interval of the resampled ones."""
    import numpy as np

    arrays = [(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)) for a, b in pairs]
    if not arrays or any(a.shape != b.shape or a.ndim != 2 or len(a) == 0 or a.shape != arrays[0][0].shape
                         for a, b in arrays):
        raise ValueError("seed_averaged_bootstrap needs pairs of equal (sentences, statistics) arrays")
    rng = np.random.default_rng(seed)
    n = len(arrays[0][0])
    deltas = np.empty(resamples)
    for i in range(resamples):
        idx = rng.integers(0, n, n)
        deltas[i] = np.mean([score(b[idx].sum(0)) - score(a[idx].sum(0)) for a, b in arrays])
    observed = float(np.mean([score(b.sum(0)) - score(a.sum(0)) for a, b in arrays]))
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(deltas, [tail, 100 - tail])
    return {"delta": observed, "ci": [float(lo), float(hi)], "resamples": resamples, "seed": seed,
            "sentences": n, "pairs": len(arrays)}


def sacrebleu_metric():
    """sacreBLEU's BLEU as the study scores it: lowercased (the models are trained on lowercased text), 13a."""
    from sacrebleu.metrics import BLEU

    return BLEU(lowercase=True)


def sacrebleu_paired_tests(baseline: Sequence[str], systems: Dict[str, Sequence[str]], references: Sequence[str],
                           bootstrap_resamples: int = 1000, ar_trials: int = 10000) -> Dict:
    """sacreBLEU's own paired tests (``sacrebleu.significance.PairedTest``) of each system against ``baseline``
    on one test set: the paired bootstrap (Koehn 2004, as Moses' script) and approximate randomisation
    (Riezler and Maxwell 2005); both p-values are two-sided (sacreBLEU tests the absolute difference).
    Returns {"signatures": {test: signature}, "systems": {name: {score, baseline, bs_p, ar_p, bs_ci}}}."""
    import logging

    from sacrebleu.significance import PairedTest

    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # it logs every step at INFO
    named = [("baseline", list(baseline))] + [(name, list(h)) for name, h in systems.items()]
    out = {"signatures": {}, "systems": {name: {} for name in systems}}
    for test, n in (("bs", bootstrap_resamples), ("ar", ar_trials)):
        signatures, scores = PairedTest(named, {"BLEU": sacrebleu_metric()}, [list(references)], test_type=test,
                                        n_samples=n)()
        (metric,) = [k for k in scores if k != "System"]
        out["signatures"][test] = str(signatures[metric])
        base = scores[metric][0]
        for name, result in zip(scores["System"][1:], scores[metric][1:]):
            entry = out["systems"][name]
            entry.update(score=result.score, baseline=base.score, delta=result.score - base.score)
            entry[f"{test}_p"] = result.p_value
            if test == "bs":
                entry["bs_mean"], entry["bs_ci"] = result.mean, result.ci
    return out
