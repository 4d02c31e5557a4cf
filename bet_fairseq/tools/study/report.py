"""The study's report: ``REPORT.md``, ``results.json`` (every run and every statistic) and PNG figures, from
whatever runs of the scale have finished (the missing ones are listed, by part).

Statistics (``stats.py``): per system, the mean over seeds with a Student-t 95% interval; its difference to the
Transformer paired by seed, with its seed interval, a two-sided paired t-test and Holm's correction across
the systems compared with the Transformer on that dataset and metric; on Multi30k also the test-resampling
interval of the seed-averaged difference and sacreBLEU's own paired bootstrap and approximate randomisation
for every seed's pair, against the raw test references. An effect whose interval includes 0 is called "not
resolved", whichever way its mean points. Each run's validation curve is checked against the plateau
criterion (``plan.PLATEAU``).
"""

import datetime
import json
import os
import platform
import sys
from collections import Counter

from bet_fairseq import catalog
from bet_fairseq.files import atomic_write
from . import decomposition, machine, plan, stats, store
from .words import (HIGHER_BETTER, METRIC_NAME, direction, interval, number, p_value, seeds_note, t_test_words,
                    verdict)

# The paper's Table 1: converged 6-layer Transformers (MT: IWSLT14 De-En decoder; LM: WikiText-2).
PAPER_TABLE1 = {
    "mt": {"CA": [0.2964, 0.0592, 0.0762, 0.0544, 0.0629, 0.0754],
           "HA_mean": [0.0435, 0.0475, 0.0466, 0.0479, 0.0473, 0.0464],
           "Ratio": [6.81, 1.25, 1.64, 1.14, 1.33, 1.63]},
    "lm": {"CA": [0.0628, 0.0584, 0.0541, 0.0546, 0.0939, 0.0664],
           "HA_mean": [0.0192, 0.0193, 0.0194, 0.0194, 0.0186, 0.0192],
           "Ratio": [3.27, 3.02, 2.79, 2.81, 5.05, 3.46]},
}
METRICS = {"mt": ("sacrebleu_raw", "bleu"), "lm": ("ppl",)}  # per kind; the first is the one verdicts use
METRIC_TEXT = {
    "sacrebleu_raw": "sacreBLEU of the Moses-detokenised output against the raw test references "
                     "(`test_2016_flickr.en` as released), lowercased since the models are trained on lowercased "
                     "text; higher is better",
    "bleu": "fairseq-generate's tokenised BLEU4 (beam 5, BPE removed, against the lowercased Moses-tokenised "
            "references), higher is better",
    "ppl": "test perplexity (fairseq-eval-lm, blocks of 512 tokens), lower is better",
}
COLOURS = {"vanilla": "#444444", "diagfree": "#1f77b4", "bet_sf": "#d62728", "bet_sg": "#2ca02c",
           "vanilla+sentences": "#9467bd"}
FIGURE45 = ("vanilla", "diagfree", "bet_sf")  # the paper's Figures 4 and 5: validation curves of these


def run_of(record):
    """The plan's Run a record was made by (its name and folder follow from it)."""
    return plan.Run(record["dataset"], record["row"], record["seed"], record.get("setting") or "")


def system_of(record):
    return run_of(record).system


def label_of(system):
    row, _, setting = system.partition("+")
    return plan.system_label(row, setting)


def is_selection_run(system):
    """A point of BET(SG)'s lambda_p sweep other than the default: it chooses a setting, it is not tested."""
    return system.startswith("bet_sg+")


def dataset_order():
    return list(plan.DATASETS) + [k for k in catalog.DATASETS if k not in plan.DATASETS]


def system_order(system):
    row, _, setting = system.partition("+")
    settings = [""] + list(plan.SETTINGS)
    return (plan.ALL_ROWS.index(row) if row in plan.ALL_ROWS else len(plan.ALL_ROWS), settings.index(setting)
            if setting in settings else len(settings))


# ----------------------------------------------------------------------------- per-run figures


def enrich(records, work):
    """Copies of the run records with what the report derives from their files: the token-loss curves, the
    plateau check, the best validation nll, and (translation) sacreBLEU against the raw test references."""
    from ..results.curves import parse_log
    from .data import raw_references

    refs_path = raw_references(work)
    refs = None
    if os.path.exists(refs_path):
        with open(refs_path, encoding="utf-8") as f:
            refs = f.read().splitlines()
    out = []
    for r in records:
        # the run's folder under this work folder (the record's own "dir" is where it was made, maybe moved since)
        r = dict(r, system=system_of(r),
                 dir=store.run_dir(work, run_of(r)))
        if r.get("table1"):
            r["table1"] = os.path.join(r["dir"], os.path.basename(r["table1"]))
        log = os.path.join(r["dir"], "train.log")
        curves = parse_log(log) if os.path.exists(log) else {"train_nll": [], "valid_nll": []}
        r["curves"] = {"train_nll": curves["train_nll"], "valid_nll": curves["valid_nll"]}
        r["plateau"] = stats.plateau(curves["valid_nll"], plan.PLATEAU["share"], plan.PLATEAU["max_drop"])
        r["best_valid_nll"] = min((v for _, v in curves["valid_nll"]), default=None)
        if catalog.dataset(r["dataset"]).kind == "mt":
            hyps = _lines(os.path.join(r["dir"], "hyp.detok.txt"))
            r["sacrebleu_raw"] = None
            if refs is not None and hyps is not None and len(hyps) == len(refs):
                r["sacrebleu_raw"] = stats.sacrebleu_metric().corpus_score(hyps, [refs]).score
        out.append(r)
    return out, refs


def _lines(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


# ----------------------------------------------------------------------------- the numbers


def summarise(records):
    """Per dataset and metric: per system the values by seed, their interval, the paired difference to the
    Transformer (seed interval, two-sided p, Holm-adjusted p across the dataset's systems)."""
    out = {}
    for dkey in dataset_order():
        ds = catalog.dataset(dkey)
        recs = [r for r in records if r["dataset"] == dkey and not is_selection_run(r["system"])]
        if not recs:
            continue
        per_metric = {}
        for metric in METRICS[ds.kind]:
            by_system = {}
            for system in sorted({r["system"] for r in recs}, key=system_order):
                values = {r["seed"]: r[metric] for r in recs if r["system"] == system and r.get(metric) is not None}
                if values:
                    by_system[system] = {"label": label_of(system),
                                         "values": {str(s): v for s, v in sorted(values.items())},
                                         "ci": stats.mean_ci(list(values.values()))}
            base = {int(s): v for s, v in by_system.get(plan.BASELINE, {}).get("values", {}).items()}
            for system, entry in by_system.items():
                row = system.partition("+")[0]
                if system != plan.BASELINE and base:
                    mine = {int(s): v for s, v in entry["values"].items()}
                    entry["diff"] = stats.paired_difference(mine, base)
                    entry["verdict"] = verdict(entry["diff"], metric)
                paper = catalog.row(row).paper.get(ds.paper) if system == row else None
                paper_base = catalog.row(plan.BASELINE).paper.get(ds.paper)
                entry["paper"] = paper if ds.paper_comparable else None
                entry["paper_diff"] = None if paper is None or paper_base is None else round(paper - paper_base, 2)
            for system, control in plan.CONTROLS.items():
                if system in by_system and control in by_system:
                    theirs = {int(k): v for k, v in by_system[control]["values"].items()}
                    mine = {int(k): v for k, v in by_system[system]["values"].items()}
                    diff = stats.paired_difference(mine, theirs)
                    by_system[system]["vs_control"] = {"control": control, "diff": diff,
                                                       "verdict": verdict(diff, metric)}
            family = {s: e["diff"]["p"] for s, e in by_system.items() if e.get("diff", {}).get("p") is not None}
            for system, p in stats.holm(family).items():
                by_system[system]["diff"]["p_holm"] = p
            per_metric[metric] = by_system
        out[dkey] = per_metric
    return out


def bleu_counts(records, refs):
    """Translation: each run's sentence-level BLEU statistics against the raw references, by (dataset, system,
    seed)."""
    if refs is None:
        return {}
    mt = [r for r in records if catalog.dataset(r["dataset"]).kind == "mt" and r.get("sacrebleu_raw") is not None
          and not is_selection_run(r["system"])]
    return {(r["dataset"], r["system"], r["seed"]): stats.bleu_statistics(
        _lines(os.path.join(r["dir"], "hyp.detok.txt")), refs, lowercase=True) for r in mt}


def resampled_difference(counts, dkey, system, against, resamples):
    """The test-resampling interval of ``system - against``'s seed-averaged sacreBLEU difference over the seeds
    both have (the same resampled test sentences for every seed's pair); None without such a seed."""
    seeds = sorted(seed for d, s, seed in counts if (d, s) == (dkey, system) and (dkey, against, seed) in counts)
    if not seeds:
        return None
    pairs = [(counts[(dkey, against, s)], counts[(dkey, system, s)]) for s in seeds]
    return {**stats.seed_averaged_bootstrap(pairs, resamples=resamples, seed=2022), "seeds": seeds}


def test_resampling(counts, resamples):
    """Multi30k: per system, the test-resampling interval of its seed-averaged sacreBLEU difference to the
    Transformer."""
    out = {}
    for (dkey, system, _) in sorted({(d, s, 0) for d, s, _ in counts}, key=lambda k: system_order(k[1])):
        if system != plan.BASELINE:
            r = resampled_difference(counts, dkey, system, plan.BASELINE, resamples)
            if r is not None:
                out.setdefault(dkey, {})[system] = r
    return out


def significance(records, refs, sc):
    """sacreBLEU's paired bootstrap and approximate randomisation, every system against the Transformer of the
    same seed, on the raw references; ``signatures`` name the tests' settings."""
    out = {"signatures": {}, "pairs": []}
    if refs is None:
        return out
    mt = [r for r in records if catalog.dataset(r["dataset"]).kind == "mt" and r.get("sacrebleu_raw") is not None
          and not is_selection_run(r["system"])]
    for dkey in sorted({r["dataset"] for r in mt}):
        for seed in sorted({r["seed"] for r in mt if r["dataset"] == dkey}):
            here = {r["system"]: r for r in mt if r["dataset"] == dkey and r["seed"] == seed}
            if plan.BASELINE not in here or len(here) < 2:
                continue
            systems = {s: _lines(os.path.join(r["dir"], "hyp.detok.txt")) for s, r in here.items() if s != plan.BASELINE}
            base_hyps = _lines(os.path.join(here[plan.BASELINE]["dir"], "hyp.detok.txt"))
            tests = stats.sacrebleu_paired_tests(base_hyps, systems, refs, sc.bootstrap_resamples, sc.ar_trials)
            out["signatures"] = tests["signatures"]
            for system in sorted(systems, key=system_order):
                t = dict(tests["systems"][system])
                if systems[system] == base_hyps:  # sacreBLEU counts strictly larger differences: 1/(n+1) here
                    t.update(bs_p=1.0, ar_p=1.0)
                out["pairs"].append({"dataset": dkey, "seed": seed, "system": system, "baseline": t["baseline"],
                                     "score": t["score"], "delta": t["delta"], "bs_p": float(t["bs_p"]),
                                     "ar_p": float(t["ar_p"])})
    if mt:
        metric = stats.sacrebleu_metric()
        metric.corpus_score(_lines(os.path.join(mt[0]["dir"], "hyp.detok.txt")), [refs])  # the signature needs a use
        out["signature_bleu"] = metric.get_signature().format()
    return out


def pointer_sweep(records, scale):
    """BET(SG)'s lambda_p x --pointer-heads points on Multi30k: best validation nll per point, averaged over the
    seeds every point has; the chosen point is the lowest (validation only, never test)."""
    seeds_kept = set(range(1, plan.SEEDS[scale]["sweep"] + 1))
    points = []
    for lam in plan.POINTER_LAMBDAS:
        for heads in plan.POINTER_HEADS:
            system = plan.system_name(*plan.pointer_point(lam, heads))
            values = {r["seed"]: r["best_valid_nll"] for r in records if r["dataset"] == "multi30k"
                      and r["system"] == system and r["seed"] in seeds_kept and r.get("best_valid_nll") is not None}
            points.append({"pointer_lambda": lam, "pointer_heads": heads, "system": system,
                           "values": {str(s): v for s, v in sorted(values.items())}, "ci": stats.mean_ci(list(values.values()))})
    complete = [p for p in points if len(p["values"]) == len(seeds_kept)]
    base = {r["seed"]: r["best_valid_nll"] for r in records if r["dataset"] == "multi30k" and r["system"] == plan.BASELINE
            and r["seed"] in seeds_kept and r.get("best_valid_nll") is not None}
    out = {"points": points, "seeds": sorted(seeds_kept), "transformer": stats.mean_ci(list(base.values())),
           "default": dict(catalog.POINTER_DEFAULT), "complete": len(complete) == len(points)}
    if out["complete"]:  # a choice among some of the points could change when the others finish
        best = min(complete, key=lambda p: p["ci"]["mean"])
        out["chosen"] = {"pointer_lambda": best["pointer_lambda"], "pointer_heads": best["pointer_heads"]}
        out["matches_default"] = out["chosen"] == out["default"]
    return out


def decomposition_contrasts(summary, counts, resamples):
    """BET(SF) taken apart (``decomposition.py``) on each dataset's main metric."""
    def resample(dkey, system, against):
        if METRICS[catalog.dataset(dkey).kind][0] != "sacrebleu_raw":
            return None
        return resampled_difference(counts, dkey, system, against, resamples)

    return decomposition.compute(summary, lambda d: METRICS[catalog.dataset(d).kind][0], resample)


def diag_sweep(summary, metric="sacrebleu_raw"):
    """Figure 3's points on Multi30k: the diagonal scale -> the metric's mean and interval, and the difference to
    the Transformer paired by seed (None for c = 1, the Transformer); DiagFreeMask apart."""
    by_system = summary.get("multi30k", {}).get(metric, {})
    points = []
    for c in plan.DIAG_SCALES:
        system = plan.system_name(*plan.diag_point(c))
        if system in by_system:
            points.append({"scale": c, "system": system, "ci": by_system[system]["ci"],
                           "values": by_system[system]["values"], "diff": by_system[system].get("diff")})
    free = by_system.get("diagfree")
    return {"metric": metric, "points": points, "diagfree": None if free is None else
            {"ci": free["ci"], "values": free["values"], "diff": free.get("diff")}}


def _plateau_miss(record):
    """A run that misses the plateau criterion, with its drop and the largest change between two consecutive
    validations of the same stretch (a drop within that is within the curve's own noise)."""
    pl = record["plateau"]
    words = f"{run_of(record).name} ({pl['relative_drop']:.2%}"
    if pl.get("largest_step") is not None:
        words += (f"; its consecutive validations from update {pl['from_update']} on differ by up to "
                  f"{pl['largest_step']:.2%}")
    return words + ")"


def diag_sweep_words(points):
    """The sweep read through each scale's difference to the Transformer on the same seeds: the points' means are
    over different seeds (the Transformer has more), and seed 1 alone can sit far from an 8-seed mean."""
    paired = [p for p in points if p.get("diff") and p["diff"].get("mean") is not None]
    if not paired:
        return "No point has a seed in common with the Transformer yet."
    seeds = ", ".join(f"c = {p['scale']:g}: {p['ci']['n']}" for p in points)
    diffs = ", ".join(f"c = {p['scale']:g} {interval(p['diff'], sign=True)}" for p in paired)
    resolved = [f"c = {p['scale']:g}" for p in paired if stats.resolved(p["diff"])]
    verdict = (f"resolved (interval excluding 0): {', '.join(resolved)}." if resolved else
               "none is resolved: these seeds do not tell the scales from the Transformer.")
    return (f"Seeds per point: {seeds}. The means are over different seeds; against the Transformer on the same "
            f"seeds (the Multi30k table): {diffs}; {verdict}")


def table1(records):
    out = {}
    for r in records:
        if r.get("table1") and os.path.exists(r["table1"]):
            with open(r["table1"], encoding="utf-8") as f:
                out.setdefault(r["dataset"], {})[r["row"]] = json.load(f)
    return out


def machine_info():
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
            "processor": machine.processor(), "gpu": machine.gpu_name()}
    for name in ("torch", "fairseq", "sacrebleu", "numpy"):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # pragma: no cover
            info[name] = None
    info["commit"] = machine.code_commit()
    return info


# ----------------------------------------------------------------------------- figures


def _colour(system, k):
    from ..figures import pyplot

    return COLOURS.get(system) or pyplot().get_cmap("tab10").colors[k % 10]


def plot_loss_figures(records, out, systems_of_dataset, name, title, splits=("train_nll", "valid_nll")):
    """Per dataset, ``name``_DATASET.png: the token-loss curves of its systems, mean over seeds with a band."""
    from ..results.curves import plot_curves as plot

    paths = []
    for dkey, systems in systems_of_dataset.items():
        if systems:
            groups = [(label_of(system), [r["curves"] for r in records if r["dataset"] == dkey
                                          and r["system"] == system], _colour(system, k))
                      for k, system in enumerate(systems)]
            paths.append(plot(groups, os.path.join(out, f"{name}_{dkey}.png"), f"{catalog.dataset(dkey).label}: "
                              f"{title}", splits=splits, quantity="token loss (nll, bits)", count_seeds=True))
    return paths


def plot_differences(summary, resampled, out):
    """Each system minus the Transformer, per dataset: the mean, its seed interval (thick), the test-resampling
    interval (thin, Multi30k), the seeds' own differences (dots) and a line at 0."""
    from ..figures import pyplot, save_png

    plt = pyplot()
    panels = [(d, METRICS[catalog.dataset(d).kind][0]) for d in summary]
    panels = [(d, m) for d, m in panels if any("diff" in e for e in summary[d].get(m, {}).values())]
    if not panels:
        return None
    heights = [sum(1 for e in summary[d][m].values() if "diff" in e) for d, m in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.5, sum(0.45 * h + 1.3 for h in heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (dkey, metric) in zip(axes[:, 0], panels):
        entries = [(s, e) for s, e in summary[dkey][metric].items() if "diff" in e]
        for y, (system, e) in enumerate(entries):
            d = e["diff"]
            colour = _colour(system, y)
            if d.get("half_width") is not None:
                ax.errorbar(d["mean"], y, xerr=d["half_width"], fmt="o", color=colour, capsize=4, linewidth=2.2)
            else:
                ax.plot(d["mean"], y, "o", color=colour)
            base = summary[dkey][metric][plan.BASELINE]["values"]
            seeds = [e["values"][s] - base[s] for s in e["values"] if s in base]
            ax.plot(seeds, [y + 0.18] * len(seeds), ".", color=colour, alpha=0.5, markersize=4)
            r = resampled.get(dkey, {}).get(system)
            if r is not None and metric == "sacrebleu_raw":
                ax.plot(r["ci"], [y - 0.18] * 2, color=colour, linewidth=1, alpha=0.8)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(entries)))
        ax.set_yticklabels([e["label"] for _, e in entries], fontsize=7)
        ax.invert_yaxis()
        better = "higher is better" if HIGHER_BETTER[metric] else "lower is better"
        ax.set_xlabel(f"{METRIC_NAME[metric]} minus the Transformer's, paired by seed ({better})")
        ax.set_title(f"{catalog.dataset(dkey).label}: mean with 95% seed interval (thick), seeds (dots)"
                     + ("\ntest-resampling 95% interval of the seed mean (thin, above)" if dkey in resampled else ""),
                     fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, os.path.join(out, "differences.png"))


def plot_diag_sweep(sweep, out):
    """Left, the paper's Figure 3 (each point's mean over its own seeds); right, each point minus the Transformer
    on the same seeds, the comparison the left cannot make when the points have different seeds."""
    from ..figures import pyplot, save_png

    if not any(p["scale"] != 1.0 for p in sweep["points"]):  # the Transformer alone is no sweep
        return None
    plt = pyplot()
    fig, (ax, dax) = plt.subplots(1, 2, figsize=(10, 3.8), sharex=True)
    free, x_free = sweep["diagfree"], -0.25
    ax.errorbar([p["scale"] for p in sweep["points"]], [p["ci"]["mean"] for p in sweep["points"]],
                yerr=[p["ci"]["half_width"] or 0.0 for p in sweep["points"]], fmt="o-", color="#444444", capsize=4,
                label="diagonal logits x c (c = 1: the Transformer)")
    for p in sweep["points"]:
        vals = list(p["values"].values())
        ax.plot([p["scale"]] * len(vals), vals, ".", color="#444444", alpha=0.4, markersize=4)
        ax.annotate(f"n={len(vals)}", (p["scale"], p["ci"]["mean"]), textcoords="offset points", xytext=(6, -12),
                    fontsize=7, color="#444444")
    if free:
        ax.errorbar([x_free], [free["ci"]["mean"]], yerr=[free["ci"]["half_width"] or 0.0], fmt="s",
                    color=COLOURS["diagfree"], capsize=4, label="DiagFreeMask (diagonal -inf)")
        ax.plot([x_free] * len(free["values"]), list(free["values"].values()), ".", color=COLOURS["diagfree"],
                alpha=0.4)
    ax.set_ylabel(f"{METRIC_NAME[sweep['metric']]} (test), mean ± 95% seed interval")
    ax.set_title("Figure 3 at this scale: Multi30k De-En, each point over its seeds", fontsize=9)
    ax.legend(fontsize=7)
    paired = [(p["scale"], p["diff"], "#444444", "o") for p in sweep["points"] if p.get("diff")]
    if free and free.get("diff"):
        paired.append((x_free, free["diff"], COLOURS["diagfree"], "s"))
    for x, diff, colour, marker in paired:
        dax.errorbar([x], [diff["mean"]], yerr=[diff["half_width"] or 0.0], fmt=marker, color=colour, capsize=4)
        dax.annotate(f"n={diff['n']}", (x, diff["mean"]), textcoords="offset points", xytext=(6, -12), fontsize=7,
                     color=colour)
    dax.axhline(0.0, color="#444444", linewidth=1)
    dax.set_ylabel("difference, paired by seed ± 95% interval")
    dax.set_title("each point minus the Transformer on the same seeds", fontsize=9)
    for a in (ax, dax):
        a.set_xlabel("diagonal scale c (DiagFreeMask at the left)")
        a.grid(alpha=0.3)
    fig.tight_layout()
    return save_png(fig, os.path.join(out, "figure3_diag_scale.png"))


def plot_pointer_sweep(sweep, out):
    from ..figures import pyplot, save_png

    if not any(p["values"] for p in sweep["points"]):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for k, heads in enumerate(plan.POINTER_HEADS):
        pts = [p for p in sweep["points"] if p["pointer_heads"] == heads and p["values"]]
        ax.errorbar([p["pointer_lambda"] for p in pts], [p["ci"]["mean"] for p in pts],
                    yerr=[p["ci"]["half_width"] or 0.0 for p in pts], fmt="o-", capsize=4, label=f"--pointer-heads {heads}",
                    color=("#2ca02c", "#ff7f0e")[k % 2])
    t = sweep["transformer"]
    if t.get("mean") is not None:
        ax.axhline(t["mean"], color="#444444", linestyle="--", linewidth=1, label="Transformer")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(plan.POINTER_LAMBDAS)
    ax.set_xticklabels([f"{lam:g}" for lam in plan.POINTER_LAMBDAS])
    ax.set_xlabel("lambda_p")
    ax.set_ylabel(f"best validation nll (bits), mean over seeds {', '.join(map(str, sweep['seeds']))}")
    ax.set_title("BET(SG) on Multi30k: the pointer-loss sweep (validation only)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, os.path.join(out, "pointer_sweep.png"))


def heatmap_attention(records):
    """Per analysed row (seed 1 on Multi30k), the decoder self-attention of one validation sentence, mean over
    heads, every layer (``{"tokens", "index", "final", "first_pass"}``), as the run made it (``derived.py``: its
    ``attention.json``, kept with the archived run); None when a row has none or the rows' sentences differ."""
    found = {r["row"]: r for r in records if r["dataset"] == "multi30k" and r["system"] in plan.ANALYSED
             and r["seed"] == 1}
    if set(found) != set(plan.ANALYSED):
        return None
    attention = {row: store.read_attention(found[row]["dir"]) for row in plan.ANALYSED}
    if any(a is None for a in attention.values()) or len({a["index"] for a in attention.values()}) != 1:
        return None
    return attention


def plot_heatmap(records, out):
    """The Transformer's A, BET(SF)'s first pass A and its final A' of one validation sentence (mean over heads,
    every decoder layer), seed 1 of each; (path, what it shows) or (None, None) when their attention is absent."""
    import numpy as np

    from ..analysis.plots import heatmap_grid

    attention = heatmap_attention(records)
    if attention is None:
        return None, None
    base, bet = attention[plan.BASELINE], attention[plan.HEADLINE]
    grid = [[(f"Transformer A, layer {i + 1}", np.array(base["final"][i])),
             (f"BET(SF) first pass A, layer {i + 1}", np.array(bet["first_pass"][i])),
             (f"BET(SF) final A', layer {i + 1}", np.array(bet["final"][i]))] for i in range(len(base["final"]))]
    path = os.path.join(out, "attention_heatmap.png")
    heatmap_grid(grid, base["tokens"], path, f"Multi30k validation sentence {base['index']}, mean over heads, seed 1 "
                                             "(rows: queries, columns: keys; weights 0-1)")
    return path, {"split": "valid", "index": base["index"], "tokens": base["tokens"]}


# ----------------------------------------------------------------------------- Markdown


def _table1_md(t1, kind):
    lines = []
    paper = PAPER_TABLE1[kind]
    n = max([len(v["matrices"]["final"]) for v in t1.values()] + [6])
    lines.append("| model | statistic | " + " | ".join(f"layer {i + 1}" for i in range(n)) + " |")
    lines.append("|---|---|" + "---|" * n)
    for row, res in t1.items():
        for matrix, layers in res["matrices"].items():
            name = catalog.row(row).label + (" (first pass A)" if matrix == "first_pass" else
                                             " (A')" if row == "bet_sf" else "")
            for stat in ("CA", "HA_mean", "Ratio"):
                cells = [number(layer[stat], 4 if stat != "Ratio" else 2) if layer else "-" for layer in layers]
                lines.append(f"| {name} | {stat.replace('_mean', '(mean)')} | " + " | ".join(
                    cells + ["-"] * (n - len(cells))) + " |")
    for stat in ("CA", "HA_mean", "Ratio"):
        cells = [number(v, 4 if stat != "Ratio" else 2) for v in paper[stat]]
        lines.append(f"| paper's Transformer (6 layers, converged) | {stat.replace('_mean', '(mean)')} | "
                     + " | ".join(cells + ["-"] * (n - len(cells))) + " |")
    return lines


def _comparisons(data):
    L = []
    for dkey, per_metric in data["summary"].items():
        ds = catalog.dataset(dkey)
        main = METRICS[ds.kind][0]
        for system, entry in per_metric[main].items():
            if system == plan.BASELINE or "verdict" not in entry:
                continue
            d = entry["diff"]
            agree = ""
            pd = entry.get("paper_diff")
            if pd is not None and d.get("mean") is not None:
                paper_way, ours = direction(pd, main), direction(d["mean"], main)
                state = "resolved" if stats.resolved(d) else "not resolved"
                agree = (f"; the paper's {'IWSLT14 ' if not ds.paper_comparable else ''}difference ({pd:+.2f} "
                         f"{'BLEU' if ds.kind == 'mt' else METRIC_NAME[main]}) is {paper_way}, ours "
                         + ("shows no change" if ours == "no change" else
                            f"points {'the same way' if ours == paper_way else 'the other way'} ({state})"))
            tests = t_test_words(d)
            r = data["test_resampling"].get(dkey, {}).get(system)
            if r is not None and main == "sacrebleu_raw":
                tests += f"; test-resampling 95% interval [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}]"
            L.append(f"- {ds.label}, {entry['label']} vs Transformer: {interval(d, sign=True)} {METRIC_NAME[main]}"
                     f"{seeds_note(d)}: {entry['verdict']}{tests}{agree}.")
            c = entry.get("vs_control")
            if c:
                L.append(f"- {ds.label}, {entry['label']} vs {label_of(c['control'])} (like for like: both trained on "
                         f"sentences, evaluated on blocks): {interval(c['diff'], sign=True)} {METRIC_NAME[main]}"
                         f"{seeds_note(c['diff'])}: {c['verdict']}; paired t-test p = {p_value(c['diff'].get('p'))} "
                         "(two-sided, not in the Holm family).")
    return L


def markdown(data):
    scale, summary, records = data["scale"], data["summary"], data["runs"]
    sc = plan.SCALE_TABLE[scale]
    m = data["machine"]
    figures = set(data.get("figures", []))
    L = [f"# Reproduction study: {', '.join(catalog.dataset(d).label for d in summary) or 'no runs yet'} ({scale} scale)",
         "", f"Written by `{data['command']}` on {data['generated']}. Scale `{scale}`: {sc.description}.", ""]
    # ---------------------------------------------------------------- what it shows
    L += ["## What these numbers show and do not show", ""]
    if scale == "smoke":
        L.append("- **This is a smoke test**: tiny models, a few updates, a few hundred sentences. It shows that the "
                 "machinery runs end to end; its numbers say nothing about the methods.")
    L.append("- Models: small ones at this scale (*Settings*), not the paper's; absolute values are not comparable "
             "with the paper's. Each comparison is with the Transformer trained on the same data, schedule and seed.")
    L.append("- An effect is **resolved** when the 95% seed interval of the seed-paired difference excludes 0; an "
             "effect smaller than its interval is **not resolved**, whichever way its mean points. Resolved means "
             "resolved over these seeds at this scale, not that the paper's effect is confirmed at its scale.")
    L.append("- Two intervals, two questions: the **seed interval** (Student t over the seed-paired differences) is "
             "how much the difference moves when both models are trained again with other seeds; the "
             "**test-resampling interval** (paired bootstrap over test sentences, the same draw for every seed's "
             "pair) is how much the seed-averaged difference moves when other test sentences are drawn, the "
             "models fixed. A claim about the methods needs the first; the second is usually narrower.")
    L.append("- p-values are two-sided throughout: the paired t-test over seeds (Holm-adjusted across the systems "
             "compared with the Transformer on a dataset and metric) and sacreBLEU's paired bootstrap and "
             "approximate randomisation per seed's pair (test-set noise of one pair of models, not seed variation).")
    L.append("- Multi30k is not in the paper: only the direction is compared, with the paper's IWSLT14 De-En "
             "difference (same recipe family, another corpus).")
    L += _comparisons(data)
    plateau = [r for r in records if r.get("plateau")]
    met = [r for r in plateau if r["plateau"]["met"]]
    L.append(f"- Plateau criterion ({plan.PLATEAU_TEXT}): met by {len(met)} of {len(records)} runs"
             + ("; not met: " + ", ".join(_plateau_miss(r) for r in plateau if not r["plateau"]["met"])
                if len(met) < len(plateau) else "")
             + (f"; {len(records) - len(plateau)} without a curve" if len(plateau) < len(records) else "") + ".")
    sweep = data.get("pointer_sweep") or {}
    if sweep.get("chosen"):
        c, dft = sweep["chosen"], sweep["default"]
        L.append(f"- BET(SG)'s pointer loss, chosen on Multi30k validation nll: lambda_p {c['pointer_lambda']:g}, "
                 f"--pointer-heads {c['pointer_heads']}; the criteria's default (catalog.POINTER_DEFAULT, which the "
                 f"BET(SG) rows train with) is lambda_p {dft['pointer_lambda']:g}, {dft['pointer_heads']}: "
                 + ("they match." if sweep["matches_default"] else
                    "**they differ**: set POINTER_DEFAULT to the chosen point and run the BET(SG) rows again."))
    elif sweep:
        L.append("- BET(SG)'s pointer-loss sweep is not complete yet (part `pointer`): no setting chosen.")
    for part, names in data.get("missing", {}).items():
        if names:
            L.append(f"- Part `{part}`: {len(names)} run(s) not finished with this code's commands, left out: "
                     + ", ".join(names[:10]) + (" ..." if len(names) > 10 else "") + f" (`bet-reproduce --scale {scale} --part {part}`).")
    L.append("")
    # ---------------------------------------------------------------- figures in words
    L += ["### What the figures show and do not show", ""]
    if "differences.png" in figures:
        L.append("- `differences.png`: each system minus the Transformer, paired by seed. It shows the size of each "
                 "difference against both intervals; it does not show absolute quality (the tables do).")
    if any(f.startswith("decomposition_") for f in figures):
        L.append("- `decomposition_*.png`: BET(SF)'s four cells (with and without the DiagFreeMask, with and without "
                 "the re-weighting by R), each over its own seeds, and their differences paired by seed, the two "
                 "contrasts last, with the paper's difference as a cross. It shows how BET(SF)'s effect at this scale "
                 "splits between its two changes; the paper's crosses are at the paper's scale (on Multi30k, its "
                 "IWSLT14 De-En numbers).")
    if "figure3_diag_scale.png" in figures:
        L.append("- `figure3_diag_scale.png` (the paper's Figure 3 at this scale): test sacreBLEU against the "
                 "diagonal scale c (left: each point's mean over its own seeds; right: each point minus the "
                 "Transformer on the same seeds), DiagFreeMask at the left, each point's seeds beside it. "
                 + diag_sweep_words(data["diag_sweep"]["points"]) + " It shows one corpus and one model size only.")
    if any(f.startswith("figure45_") for f in figures):
        L.append("- `figure45_*.png` (the paper's Figures 4 and 5): validation token loss of the Transformer, "
                 "DiagFreeMask and BET(SF), mean over seeds with the seeds' range as a band. They show how fast each "
                 "system learns on this schedule; they do not show test quality, and a band that overlaps another "
                 "does not separate them.")
    if any(f.startswith("curves_") for f in figures):
        L.append("- `curves_*.png`: training and validation token loss (nll, bits; BET(SG)'s without lambda_p L_p) of "
                 "every system, mean over seeds with a band. The last fifth of each curve is what the plateau "
                 "criterion reads.")
    if "pointer_sweep.png" in figures:
        L.append("- `pointer_sweep.png`: BET(SG)'s best validation nll for each lambda_p and --pointer-heads, the "
                 "Transformer's as a dashed line. It is the evidence the default was chosen on (validation only); "
                 "it says nothing about test BLEU.")
    if "attention_heatmap.png" in figures:
        L.append("- `attention_heatmap.png`: one validation sentence, seed 1, mean over heads, every decoder layer: "
                 "the Transformer's A, BET(SF)'s first pass A and its final A'. A' has a zero diagonal except row 0 by "
                 "construction (DiagFreeMask). One sentence of one seed: it illustrates, it does not measure (Table 1 "
                 "does).")
    L.append("")
    # ---------------------------------------------------------------- per dataset
    for dkey, per_metric in summary.items():
        ds = catalog.dataset(dkey)
        L += [f"## {ds.label}", ""]
        for metric, by_system in per_metric.items():
            L += [f"{METRIC_TEXT[metric]}.", ""]
            L.append("| system | seeds | mean ± 95% CI | difference to Transformer (paired by seed) ± 95% seed "
                     "interval | p (t, two-sided) | p Holm | test-resampling 95% interval | paper | paper's "
                     "difference to Transformer |")
            L.append("|---|---|---|---|---|---|---|---|---|")
            for system, e in by_system.items():
                d = e.get("diff", {})
                diff = "(baseline)" if system == plan.BASELINE else (
                    interval(d, sign=True) + (" (not resolved)" if stats.resolved(d) is False else "") if d else "-")
                r = data["test_resampling"].get(dkey, {}).get(system) if metric == "sacrebleu_raw" else None
                rs = f"[{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}]" if r else "-"
                paper = number(e["paper"]) if e.get("paper") is not None else ("n/a" if not ds.paper_comparable else "-")
                pd = "-" if system == plan.BASELINE else (
                    number(e["paper_diff"], sign=True) + ("" if ds.paper_comparable else " (IWSLT14 De-En)")
                    if e.get("paper_diff") is not None else "-")
                L.append(f"| {e['label']} | {len(e['values'])} ({', '.join(e['values'])}) | {interval(e['ci'])} | {diff} | "
                         f"{p_value(d.get('p'))} | {p_value(d.get('p_holm'))} | {rs} | {paper} | {pd} |")
            L.append("")
        sig = data["significance"]
        pairs = [p for p in sig.get("pairs", []) if p["dataset"] == dkey]
        if pairs:
            L += ["sacreBLEU's own paired tests (`sacrebleu.significance`), each system against the Transformer of the "
                  "same seed on the raw references; both p-values two-sided (sacreBLEU tests the absolute "
                  "difference), not corrected for the number of pairs:", "",
                  f"- BLEU: `{sig.get('signature_bleu')}`",
                  f"- paired bootstrap: `{sig['signatures'].get('bs')}`",
                  f"- approximate randomisation: `{sig['signatures'].get('ar')}`", "",
                  "| system | seed | Transformer | system | difference | p (paired bootstrap) | p (approximate "
                  "randomisation) |", "|---|---|---|---|---|---|---|"]
            for p in pairs:
                L.append(f"| {label_of(p['system'])} | {p['seed']} | {p['baseline']:.2f} | {p['score']:.2f} | "
                         f"{p['delta']:+.2f} | {p_value(p['bs_p'])} | {p_value(p['ar_p'])} |")
            L.append("")
        if dkey in data.get("table1", {}):
            t1 = data["table1"][dkey]
            first = next(iter(t1.values()))
            L += [f"Table 1 on {ds.label} (validation, {first['sentences']} sequences; {first['definition']}):", ""] \
                + _table1_md(t1, ds.kind) + [""]
        for name, caption in ((f"figure45_{dkey}.png", "validation token loss, Transformer vs DiagFreeMask vs BET(SF)"),
                              (f"curves_{dkey}.png", "token loss of every system")):
            if name in figures:
                L += [f"![{ds.label}: {caption}]({name})", ""]
    L += decomposition.markdown(data.get("decomposition") or {}, figures)
    if "differences.png" in figures:
        L += ["## Differences to the Transformer", "", "![paired differences](differences.png)", ""]
    if "figure3_diag_scale.png" in figures:
        L += ["## Figure 3: the diagonal scale", "", "![diagonal-scale sweep](figure3_diag_scale.png)", ""]
    if sweep:
        L += ["## BET(SG): lambda_p and --pointer-heads, chosen on validation", "",
              f"Best validation nll (bits, without lambda_p L_p) over the seeds {', '.join(map(str, sweep['seeds']))}; "
              f"Transformer: {interval(sweep['transformer'], 3)}.", "",
              "| lambda_p | --pointer-heads | seeds | best validation nll ± 95% CI |", "|---|---|---|---|"]
        for p in sweep["points"]:
            chosen = sweep.get("chosen") == {"pointer_lambda": p["pointer_lambda"], "pointer_heads": p["pointer_heads"]}
            L.append(f"| {p['pointer_lambda']:g} | {p['pointer_heads']} | {len(p['values'])} | {interval(p['ci'], 3)}"
                     f"{' (chosen)' if chosen else ''} |")
        L.append("")
        if "pointer_sweep.png" in figures:
            L += ["![pointer-loss sweep](pointer_sweep.png)", ""]
    if "attention_heatmap.png" in figures:
        h = data.get("heatmap") or {}
        L += ["## Attention, one sentence", "", f"Validation sentence {h.get('index')} of Multi30k: "
              f"`{' '.join(h.get('tokens') or [])}`.", "", "![attention heatmap](attention_heatmap.png)", ""]
    # ---------------------------------------------------------------- settings and runs
    L += ["## Settings, and where they depart from the paper's", ""]
    L += [f"- {note}" for note in sc.departures] + [""]
    L += ["## Runs", "", f"Plateau: {plan.PLATEAU_TEXT}; nll at the cut and at the end, in bits.", "",
          "| dataset | system | seed | updates | value | valid nll (cut -> end) | drop | plateau | train CPU s | "
          "eval CPU s | wall s | resumed |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        pl = r.get("plateau")
        cut = (f"{pl['from']:.3f} @ {pl['from_update']} -> {pl['to']:.3f} @ {pl['to_update']}" if pl else "-")
        drop = f"{100 * pl['relative_drop']:.2f}%" if pl else "-"
        cpu = r.get("cpu_time_s") or {}
        copy = f" (a copy of {r[store.COPIED_FROM]}: the same commands)" if store.is_copy(r) else ""
        L.append(f"| {r['dataset']} | {label_of(r['system'])}{copy} | {r['seed']} | {r.get('num_updates')} | "
                 f"{number(r['value'])} | {cut} | {drop} | {'yes' if pl and pl['met'] else 'no' if pl else '-'} | "
                 f"{number(cpu.get('train'), 0)} | {number(cpu.get('eval'), 0)} | {number(store.run_seconds(r), 0)} | "
                 f"{'yes' if r.get('resumed') else 'no'} |")
    codes = sorted({r.get("code") or "unknown" for r in records})
    L += ["", "Commands: `results.json` holds each run's fairseq-train and evaluation command lines. Runs made by "
          f"the code at: {', '.join(codes) if codes else '-'}.", "",
          "Each finished run's record, training log, test hypotheses and Table 1 are kept in `runs/` beside this "
          "report (no checkpoints, no corpus text): `bet-reproduce --out` this folder, with any `--work-dir`, puts "
          "them back and trains only the runs still missing.", ""]
    L += ["## Machine, versions, time", ""]
    L.append(f"- report written on: {m.get('processor')}, {m.get('cpus')} CPUs, GPU: {m.get('gpu') or 'none'}; "
             f"{m.get('platform')}")
    made_on = Counter(r.get("machine") or "not recorded (made before runs kept their machine)" for r in records)
    L.append("- runs made on: " + ("; ".join(f"{name}: {n} run(s)" for name, n in made_on.items()) or "-"))
    L.append(f"- versions: Python {m.get('python')}, torch {m.get('torch')}, fairseq {m.get('fairseq')}, "
             f"sacreBLEU {m.get('sacrebleu')}, numpy {m.get('numpy')}")
    L.append(f"- report written by the code at commit: {m.get('commit') or 'unknown (not a git checkout)'}")
    t = data["time"]
    L.append(f"- time: runs {t['runs_s'] / 3600:.2f} h wall and {t['runs_cpu_s'] / 3600:.2f} h CPU in all (train + "
             f"evaluation, summed over the runs trained, not their copies; several ran side by side), data "
             f"preparation {t['prepare_s'] / 60:.1f} min, this invocation {t['invocation_s'] / 60:.1f} min")
    L.append("")
    return "\n".join(L)


def write(out, scale, records, work, command, prepare_s, invocation_s, missing, plots=True):
    """Write results.json, the PNGs and REPORT.md into ``out``; returns the report's path. ``missing``: per part,
    the names of its runs not finished."""
    os.makedirs(out, exist_ok=True)
    sc = plan.SCALE_TABLE[scale]
    records = sorted(records, key=lambda r: (dataset_order().index(r["dataset"]), system_order(system_of(r)),
                                             r["seed"]))
    records, refs = enrich(records, work)
    trained = [r for r in records if not store.is_copy(r)]  # a copy's time is its twin's
    summary = summarise(records)
    counts = bleu_counts(records, refs)
    data = {
        "scale": scale, "command": command,
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(), "plateau_criterion": dict(plan.PLATEAU, text=plan.PLATEAU_TEXT),
        "summary": summary, "test_resampling": test_resampling(counts, sc.bootstrap_resamples),
        "significance": significance(records, refs, sc), "pointer_sweep": pointer_sweep(records, scale),
        "diag_sweep": diag_sweep(summary), "table1": table1(records),
        "decomposition": decomposition_contrasts(summary, counts, sc.bootstrap_resamples),
        "runs": records, "missing": missing,
        "time": {"runs_s": round(sum(store.run_seconds(r) for r in trained), 1),
                 "runs_cpu_s": round(sum(v or 0 for r in trained for v in (r.get("cpu_time_s") or {}).values()), 1),
                 "prepare_s": round(prepare_s, 1), "invocation_s": round(invocation_s, 1)},
        "figures": [],
    }
    if plots and records:
        tables = {d: [s for s in summary[d][METRICS[catalog.dataset(d).kind][0]]] for d in summary}
        figures = plot_loss_figures(records, out, tables, "curves", "token loss (nll) of every system by update")
        figures += plot_loss_figures(records, out, {d: [s for s in FIGURE45 if s in v] for d, v in tables.items()},
                               "figure45", "validation token loss (the paper's Figures 4-5 at this scale)",
                               splits=("valid_nll",))
        figures += [plot_differences(summary, data["test_resampling"], out), plot_diag_sweep(data["diag_sweep"], out),
                    plot_pointer_sweep(data["pointer_sweep"], out)]
        figures += [decomposition.plot(d, part, out, METRIC_NAME[part["metric"]], HIGHER_BETTER[part["metric"]])
                    for d, part in data["decomposition"].items()]
        heatmap, data["heatmap"] = plot_heatmap(records, out)
        figures.append(heatmap)
        data["figures"] = [os.path.basename(p) for p in figures if p]
    with atomic_write(os.path.join(out, "results.json")) as f:
        json.dump(data, f, indent=1, default=float)
        f.write("\n")
    path = os.path.join(out, "REPORT.md")
    with atomic_write(path) as f:
        f.write(markdown(data))
    return path
