"""The study's numbers in words: values, p-values, intervals, which way a difference points and whether its seed
interval resolves it. Shared by the report and its sections, so that every section says a result the same way."""

from . import stats

METRIC_NAME = {"sacrebleu_raw": "sacreBLEU", "bleu": "BLEU", "ppl": "perplexity"}
HIGHER_BETTER = {"sacrebleu_raw": True, "bleu": True, "ppl": False}


def number(x, digits=2, sign=False):
    if x is None:
        return "-"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def p_value(p):
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def interval(c, digits=2, sign=False):
    if c.get("mean") is None:
        return "-"
    if c.get("half_width") is None:
        return f"{number(c['mean'], digits, sign)} (1 seed)"
    return f"{number(c['mean'], digits, sign)} ± {c['half_width']:.{digits}f}"


def seeds_note(diff):
    """How many seeds a difference is over, where its interval has not said it ("(1 seed)")."""
    return f" ({len(diff['seeds'])} seeds)" if diff.get("half_width") is not None else ""


def direction(delta, metric):
    if delta is None or delta == 0:
        return "no change"
    return "better" if (delta > 0) == HIGHER_BETTER[metric] else "worse"


def verdict(diff, metric):
    """A paired difference in words: resolved or not, and which way its mean points."""
    if diff.get("mean") is None:
        return "no paired seeds"
    way = direction(diff["mean"], metric)
    if diff.get("half_width") is None:
        return f"{way} on one seed (no interval)"
    lo, hi = diff["mean"] - diff["half_width"], diff["mean"] + diff["half_width"]
    if stats.resolved(diff):
        return f"{way}, resolved (95% seed interval [{lo:+.2f}, {hi:+.2f}] excludes 0)"
    gain, loss = (hi, -lo) if HIGHER_BETTER[metric] else (-lo, hi)
    return (f"not resolved (95% seed interval [{lo:+.2f}, {hi:+.2f}] includes 0; the mean points to {way}); "
            f"what the seeds rule out: a gain above {gain:.2f} or a loss above {loss:.2f}")


def t_test_words(diff, alpha=1 - stats.LEVEL, family="the systems compared"):
    """The paired t-test in words, saying when an effect resolved by its own seed interval does not hold once
    corrected for its Holm ``family`` (by default the several systems compared with the Transformer)."""
    if diff.get("p") is None:
        return ""
    words = f"; paired t-test p = {p_value(diff['p'])} (two-sided), Holm-adjusted {p_value(diff.get('p_holm'))}"
    if stats.resolved(diff) and diff.get("p_holm") is not None and diff["p_holm"] >= alpha:
        words += f" (resolved by its own interval, not once corrected for {family})"
    return words
