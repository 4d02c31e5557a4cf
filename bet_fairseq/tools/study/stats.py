"""Statistics of the study: Student-t confidence intervals over seeds, differences paired by seed,
sentence-level BLEU sufficient statistics and a paired bootstrap resampling test (Koehn 2004).

Pure Python plus numpy (the bootstrap) and sacreBLEU (its 13a tokeniser and its score formula), so
that the report needs no scipy: the t quantile is computed from the closed-form t distribution of an
integer number of degrees of freedom (Abramowitz & Stegun 26.7.3-4).
"""

import math
from collections import Counter
from typing import Dict, List, Optional, Sequence

__all__ = ["t_quantile", "mean_ci", "paired_difference", "resolved", "bleu_statistics", "bleu_from_statistics",
           "paired_bootstrap"]


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


def mean_ci(values: Sequence[float], level: float = 0.95) -> Dict[str, Optional[float]]:
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


def paired_difference(values: Dict[int, float], baseline: Dict[int, float], level: float = 0.95) -> Dict:
    """``values[s] - baseline[s]`` over the seeds both have, with its t interval (``mean_ci``)."""
    seeds = sorted(set(values) & set(baseline))
    out = mean_ci([values[s] - baseline[s] for s in seeds], level)
    out["seeds"] = seeds
    return out


def resolved(ci: Dict) -> Optional[bool]:
    """True when the interval excludes 0 (the sign is resolved), False when it does not, None without one."""
    if ci.get("half_width") is None or ci.get("mean") is None:
        return None
    return abs(ci["mean"]) > ci["half_width"]


# ----------------------------------------------------------------------------- BLEU, sentence by sentence

MAX_ORDER = 4


def bleu_statistics(hypotheses: Sequence[str], references: Sequence[str]) -> List[List[int]]:
    """Per sentence ``[hyp_len, ref_len, correct_1..4, total_1..4]`` on sacreBLEU's 13a tokens: the
    sufficient statistics whose column sums give corpus BLEU (``bleu_from_statistics``)."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    tok = Tokenizer13a()
    rows = []
    for hyp, ref in zip(hypotheses, references):
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


def paired_bootstrap(stats_a, stats_b, score=bleu_from_statistics, resamples: int = 1000, seed: int = 12345,
                     level: float = 0.95) -> Dict:
    """Paired bootstrap resampling of a test set (Koehn 2004): ``resamples`` times, draw as many sentences
    as the set has, with replacement, the same draw for both systems, and score both on it.

    ``stats_a``/``stats_b``: one row of sufficient statistics per sentence (``bleu_statistics``); ``score``
    maps a column sum to the metric. Returns the observed ``delta`` (B - A on the whole set), the
    percentile interval of the resampled deltas and ``p``: the share of resamples whose delta does not
    have the observed sign (1.0 when the observed delta is 0), the one-sided p-value of "B differs from
    A in the observed direction"."""
    import numpy as np

    a, b = np.asarray(stats_a, dtype=np.float64), np.asarray(stats_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2 or len(a) == 0:
        raise ValueError(f"paired_bootstrap needs two equal (sentences, statistics) arrays, got {a.shape}, {b.shape}")
    rng = np.random.default_rng(seed)
    n = len(a)
    deltas = np.empty(resamples)
    for i in range(resamples):
        idx = rng.integers(0, n, n)
        deltas[i] = score(b[idx].sum(0)) - score(a[idx].sum(0))
    observed = score(b.sum(0)) - score(a.sum(0))
    if observed > 0:
        p = float(np.mean(deltas <= 0))
    elif observed < 0:
        p = float(np.mean(deltas >= 0))
    else:
        p = 1.0
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(deltas, [tail, 100 - tail])
    return {"a": score(a.sum(0)), "b": score(b.sum(0)), "delta": observed, "ci": [float(lo), float(hi)], "p": p,
            "resamples": resamples, "seed": seed, "sentences": n}
