"""The study's report: ``REPORT.md``, ``results.json`` (every run and every statistic), and PNG figures
(validation curves per dataset, a bar chart of the means with their 95% intervals).

Statistics (``stats.py``): per row, the mean over seeds with a Student-t 95% interval; its difference
to the Transformer paired by seed, with its interval; on Multi30k a paired bootstrap of sacreBLEU
between the Transformer and BET(SF) for each seed. An effect whose interval includes 0 is called
"not resolved", whichever way its mean points.
"""

import datetime
import json
import os
import platform
import subprocess
import sys

from bet_fairseq.files import atomic_write
from bet_fairseq import catalog
from . import plan as P
from . import runs as U
from . import stats as S

# The paper's Table 1: converged 6-layer Transformers (MT: IWSLT14 De-En decoder; LM: WikiText-2).
PAPER_TABLE1 = {
    "mt": {"CA": [0.2964, 0.0592, 0.0762, 0.0544, 0.0629, 0.0754],
           "HA_mean": [0.0435, 0.0475, 0.0466, 0.0479, 0.0473, 0.0464],
           "Ratio": [6.81, 1.25, 1.64, 1.14, 1.33, 1.63]},
    "lm": {"CA": [0.0628, 0.0584, 0.0541, 0.0546, 0.0939, 0.0664],
           "HA_mean": [0.0192, 0.0193, 0.0194, 0.0194, 0.0186, 0.0192],
           "Ratio": [3.27, 3.02, 2.79, 2.81, 5.05, 3.46]},
}
METRIC_TEXT = {"bleu": "BLEU (fairseq-generate's tokenised BLEU4, beam 5, BPE removed), higher is better",
               "sacrebleu": "sacreBLEU on Moses-detokenised output, higher is better",
               "ppl": "test perplexity (fairseq-eval-lm), lower is better"}
HIGHER_BETTER = {"bleu": True, "sacrebleu": True, "ppl": False}


def _f(x, digits=2, sign=False):
    if x is None:
        return "-"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _ci(c, digits=2, sign=False):
    if c.get("mean") is None:
        return "-"
    if c.get("half_width") is None:
        return f"{_f(c['mean'], digits, sign)} (1 seed)"
    return f"{_f(c['mean'], digits, sign)} ± {c['half_width']:.{digits}f}"


def _direction(delta, metric):
    if delta is None or delta == 0:
        return "no change"
    return "better" if (delta > 0) == HIGHER_BETTER[metric] else "worse"


def verdict(diff, metric):
    """A paired difference in words: resolved or not, and which way its mean points."""
    if diff.get("mean") is None:
        return "no paired seeds"
    way = _direction(diff["mean"], metric)
    if diff.get("half_width") is None:
        return f"{way} on one seed (no interval)"
    lo, hi = diff["mean"] - diff["half_width"], diff["mean"] + diff["half_width"]
    if S.resolved(diff):
        return f"{way}, resolved (95% CI [{lo:+.2f}, {hi:+.2f}] excludes 0)"
    return f"not resolved (95% CI [{lo:+.2f}, {hi:+.2f}] includes 0; the mean points to {way})"


# ----------------------------------------------------------------------------- the numbers


def summarise(records, scale):
    """Per dataset and metric: per row the values by seed, their interval, the paired difference."""
    out = {}
    for dkey, ds in catalog.DATASETS.items():
        recs = [r for r in records if r["dataset"] == dkey]
        if not recs:
            continue
        metrics = ["bleu", "sacrebleu"] if ds.kind == "mt" else ["ppl"]
        per_metric = {}
        for metric in metrics:
            by_row = {}
            for row in P.ALL_ROWS:
                values = {r["seed"]: r[metric] for r in recs if r["row"] == row and r.get(metric) is not None}
                if values:
                    by_row[row] = {"values": {str(s): v for s, v in sorted(values.items())},
                                   "ci": S.mean_ci(list(values.values()))}
            base = {int(s): v for s, v in by_row.get(P.BASELINE, {}).get("values", {}).items()}
            for row, entry in by_row.items():
                if row != P.BASELINE and base:
                    mine = {int(s): v for s, v in entry["values"].items()}
                    entry["diff"] = S.paired_difference(mine, base)
                    entry["verdict"] = verdict(entry["diff"], metric)
                paper = catalog.row(row).paper.get(ds.paper)
                paper_base = catalog.row(P.BASELINE).paper.get(ds.paper)
                entry["paper"] = paper if ds.paper_comparable else None
                entry["paper_diff"] = None if paper is None or paper_base is None else round(paper - paper_base, 2)
            per_metric[metric] = by_row
        out[dkey] = per_metric
    return out


def bootstrap(records, work, resamples):
    """Per seed, sacreBLEU of BET(SF) against the Transformer on the same test sentences, resampled."""
    out = []
    base = {r["seed"]: r for r in records if r["dataset"] == "multi30k" and r["row"] == P.BASELINE}
    other = {r["seed"]: r for r in records if r["dataset"] == "multi30k" and r["row"] == "bet_sf"}
    for seed in sorted(set(base) & set(other)):
        texts = {}
        for key, rec in (("a", base[seed]), ("b", other[seed])):
            with open(os.path.join(rec["dir"], "hyp.detok.txt"), encoding="utf-8") as f:
                hyps = f.read().splitlines()
            with open(os.path.join(rec["dir"], "ref.detok.txt"), encoding="utf-8") as f:
                refs = f.read().splitlines()
            texts[key] = (hyps, refs)
        if texts["a"][1] != texts["b"][1]:
            raise ValueError(f"seed {seed}: the two runs' references differ (different test sets?)")
        result = S.paired_bootstrap(S.bleu_statistics(*texts["a"]), S.bleu_statistics(*texts["b"]),
                                    resamples=resamples, seed=1000 + seed)
        result["rng_seed"] = result.pop("seed")
        out.append({**result, "seed": seed, "system_a": P.BASELINE, "system_b": "bet_sf"})
    return out


def table1(records):
    out = {}
    for r in records:
        if r.get("table1") and os.path.exists(r["table1"]):
            with open(r["table1"], encoding="utf-8") as f:
                out.setdefault(r["dataset"], {})[r["row"]] = json.load(f)
    return out


def machine(root):
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["processor"] = names[0] if names else platform.processor()
    except OSError:
        info["processor"] = platform.processor()
    for name in ("torch", "fairseq", "sacrebleu", "numpy"):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # pragma: no cover
            info[name] = None
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # pragma: no cover
        info["gpu"] = None
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        info["commit"] = (commit + (" + uncommitted changes" if dirty else "")) if commit else None
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


# ----------------------------------------------------------------------------- figures


def plot_curves(records, out):
    from ..results.curves import parse_log, plot_curves as draw

    paths = []
    for dkey, ds in catalog.DATASETS.items():
        recs = sorted((r for r in records if r["dataset"] == dkey), key=lambda r: (P.ALL_ROWS.index(r["row"]),
                                                                                  r["seed"]))
        curves = [(f"{r['row_label']} seed {r['seed']}", parse_log(os.path.join(r["dir"], "train.log")))
                  for r in recs if os.path.exists(os.path.join(r["dir"], "train.log"))]
        if curves:
            path = os.path.join(out, f"curves_{dkey}.png")
            draw(curves, path, f"{ds.label}: training and validation loss (base 2) by update")
            paths.append(path)
    return paths


def plot_bars(summary, out):
    from ..figures import pyplot, save_png

    plt = pyplot()
    panels = [(d, m) for d in summary for m in (["bleu"] if catalog.dataset(d).kind == "mt" else ["ppl"])]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (dkey, metric) in zip(axes[0], panels):
        by_row = summary[dkey][metric]
        rows = [r for r in P.ALL_ROWS if r in by_row]
        means = [by_row[r]["ci"]["mean"] for r in rows]
        errs = [by_row[r]["ci"]["half_width"] or 0.0 for r in rows]
        ax.bar(range(len(rows)), means, yerr=errs, capsize=6, color="#9ecae1", edgecolor="#3182bd")
        for i, r in enumerate(rows):
            vals = list(by_row[r]["values"].values())
            ax.plot([i] * len(vals), vals, "k.", alpha=0.6)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([catalog.row(r).label for r in rows], rotation=15, fontsize=8)
        ax.set_ylabel(metric.upper() if metric == "bleu" else "perplexity")
        lo = min(v - e for v, e in zip(means, errs))
        hi = max(v + e for v, e in zip(means, errs))
        pad = max(hi - lo, 1e-6) * 0.5
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_title(f"{catalog.dataset(dkey).label}: mean, 95% CI (t), seeds as dots", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, os.path.join(out, "bars.png"))


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
                cells = [_f(layer[stat], 4 if stat != "Ratio" else 2) if layer else "-" for layer in layers]
                lines.append(f"| {name} | {stat.replace('_mean', '(mean)')} | " + " | ".join(
                    cells + ["-"] * (n - len(cells))) + " |")
    for stat in ("CA", "HA_mean", "Ratio"):
        cells = [_f(v, 4 if stat != "Ratio" else 2) for v in paper[stat]]
        lines.append(f"| paper's Transformer (6 layers, converged) | {stat.replace('_mean', '(mean)')} | "
                     + " | ".join(cells + ["-"] * (n - len(cells))) + " |")
    return lines


def markdown(data):
    scale, summary, records = data["scale"], data["summary"], data["runs"]
    sc = P.SCALE_TABLE[scale]
    m = data["machine"]
    L = [f"# Reproduction study: {', '.join(catalog.dataset(d).label for d in summary)} ({scale} scale)", "",
         f"Written by `{data['command']}` on {data['generated']}. Scale `{scale}`: {sc.description}.", ""]
    # what the figures show
    L += ["## What these numbers show and do not show", ""]
    if scale == "smoke":
        L.append("- **This is a smoke test**: tiny models, a few updates, a few hundred sentences. It shows that the "
                 "machinery runs end to end; its numbers say nothing about the methods.")
    L.append("- Models: small ones trained for the updates listed under *Runs*, not the paper's models; absolute "
             "values are not comparable with the paper's. Each comparison is with the Transformer trained on the "
             "same data, schedule and seed.")
    L.append("- An effect is **resolved** when the 95% interval of the seed-paired difference excludes 0; an effect "
             "smaller than its interval is **not resolved**, whichever way its mean points. Resolved here means "
             "resolved over these seeds at this scale, not that the paper's effect is confirmed at its scale.")
    L.append("- Multi30k is not in the paper: only the direction is compared, with the paper's IWSLT14 De-En "
             "difference (same recipe family, another corpus).")
    for dkey, per_metric in summary.items():
        ds = catalog.dataset(dkey)
        main = "bleu" if ds.kind == "mt" else "ppl"
        for row, entry in per_metric[main].items():
            if row == P.BASELINE or "verdict" not in entry:
                continue
            pd = entry.get("paper_diff")
            paper_way = _direction(pd, main) if pd is not None else None
            agree = ""
            if paper_way and entry["diff"].get("mean") is not None:
                ours = _direction(entry["diff"]["mean"], main)
                state = "resolved" if S.resolved(entry["diff"]) else "not resolved"
                ours = ("shows no change" if ours == "no change" else
                        f"points {'the same way' if ours == paper_way else 'the other way'} ({state})")
                agree = (f"; the paper's {'IWSLT14 ' if not ds.paper_comparable else ''}difference ({pd:+.2f}) is "
                         f"{paper_way}, ours {ours}")
            L.append(f"- {ds.label}, {catalog.row(row).label} vs Transformer: {_ci(entry['diff'], sign=True)} "
                     f"{main.upper() if main == 'bleu' else 'perplexity'}: {entry['verdict']}{agree}.")
    for b in data.get("bootstrap", []):
        sig = "p < 0.05" if b["p"] < 0.05 else "not significant at 0.05"
        L.append(f"- Multi30k seed {b['seed']}: paired bootstrap of sacreBLEU, BET(SF) - Transformer "
                 f"{b['delta']:+.2f} (95% CI [{b['ci'][0]:+.2f}, {b['ci'][1]:+.2f}], p = {b['p']:.3f}, {sig}): the "
                 "test-set sampling noise of one pair of models; it says nothing about seed-to-seed variation.")
    missing = data.get("missing", [])
    if missing:
        L.append(f"- {len(missing)} planned run(s) are not finished yet and are left out: "
                 + ", ".join(missing[:12]) + (" ..." if len(missing) > 12 else "") + ".")
    L.append("- Table 1 below is measured on one seed of each model at this scale (validation split, at most "
             f"{sc.analysis_batches} batches); the paper's figures are for converged 6-layer models.")
    L.append("")
    # results per dataset
    for dkey, per_metric in summary.items():
        ds = catalog.dataset(dkey)
        L += [f"## {ds.label}", ""]
        for metric, by_row in per_metric.items():
            L += [f"{METRIC_TEXT[metric]}.", ""]
            L.append("| system | seeds | mean ± 95% CI | difference to Transformer (paired by seed) ± 95% CI | "
                     "paper | ours - paper | paper's difference to Transformer |")
            L.append("|---|---|---|---|---|---|---|")
            for row, e in by_row.items():
                diff = "(baseline)" if row == P.BASELINE else (_ci(e["diff"], sign=True) + (
                    "" if S.resolved(e["diff"]) else " (not resolved)") if "diff" in e else "-")
                paper = _f(e["paper"]) if e.get("paper") is not None else (
                    "n/a" if not ds.paper_comparable else "-")
                vs = _f(e["ci"]["mean"] - e["paper"], sign=True) if e.get("paper") is not None else "n/a"
                pd = "-" if row == P.BASELINE else (
                    _f(e["paper_diff"], sign=True) + ("" if ds.paper_comparable else " (IWSLT14 De-En)")
                    if e.get("paper_diff") is not None else "-")
                L.append(f"| {catalog.row(row).label} | {len(e['values'])} ({', '.join(e['values'])}) | {_ci(e['ci'])} | "
                         f"{diff} | {paper} | {vs} | {pd} |")
            L.append("")
        if ds.kind == "mt" and data.get("bootstrap"):
            L += ["Paired bootstrap resampling (Koehn 2004) of the test set, sacreBLEU, BET(SF) against the "
                  f"Transformer of the same seed ({data['bootstrap'][0]['resamples']} resamples, seeded; p: share "
                  "of resamples whose difference does not have the observed sign):", "",
                  "| seed | Transformer | BET(SF) | difference | 95% CI | p |", "|---|---|---|---|---|---|"]
            for b in data["bootstrap"]:
                L.append(f"| {b['seed']} | {b['a']:.2f} | {b['b']:.2f} | {b['delta']:+.2f} | "
                         f"[{b['ci'][0]:+.2f}, {b['ci'][1]:+.2f}] | {b['p']:.3f} |")
            L.append("")
        if dkey in data.get("table1", {}):
            t1 = data["table1"][dkey]
            first = next(iter(t1.values()))
            L += [f"Table 1 on {ds.label} (validation, {first['sentences']} sequences; {first['definition']}):",
                  ""] + _table1_md(t1, ds.kind) + [""]
        if f"curves_{dkey}.png" in data.get("figures", []):
            L += [f"![{ds.label} loss curves](curves_{dkey}.png)", ""]
    if "bars.png" in data.get("figures", []):
        L += ["## Means and intervals", "", "![means with 95% intervals](bars.png)", ""]
    # runs
    L += ["## Runs", "", "| dataset | system | seed | updates | value | train s | eval s | resumed |",
          "|---|---|---|---|---|---|---|---|"]
    for r in records:
        L.append(f"| {r['dataset']} | {r['row_label']} | {r['seed']} | {r.get('num_updates')} | {_f(r['value'])} | "
                 f"{_f(r['wall_time_s']['train'], 0)} | {_f(r['wall_time_s']['eval'], 0)} | "
                 f"{'yes' if r.get('resumed') else 'no'} |")
    L += ["", "Commands: `results.json` holds each run's fairseq-train and evaluation command lines.", ""]
    L += ["## Machine, versions, time", ""]
    L.append(f"- machine: {m.get('processor')}, {m.get('cpus')} CPUs, GPU: {m.get('gpu') or 'none'}; "
             f"{m.get('platform')}")
    L.append(f"- versions: Python {m.get('python')}, torch {m.get('torch')}, fairseq {m.get('fairseq')}, "
             f"sacreBLEU {m.get('sacrebleu')}, numpy {m.get('numpy')}")
    L.append(f"- commit: {m.get('commit') or 'unknown (not a git checkout)'}")
    t = data["time"]
    L.append(f"- wall time: runs {t['runs_s'] / 3600:.2f} h in all (train + evaluation, summed over runs), data "
             f"preparation {t['prepare_s'] / 60:.1f} min, this invocation {t['invocation_s'] / 60:.1f} min")
    L.append("")
    return "\n".join(L)


def write(out, scale, records, work, command, prepare_s, invocation_s, missing, plots=True):
    """Write results.json, the PNGs and REPORT.md into ``out``; returns the report's path."""
    os.makedirs(out, exist_ok=True)
    sc = P.SCALE_TABLE[scale]
    records = sorted(records, key=lambda r: (list(catalog.DATASETS).index(r["dataset"]), P.ALL_ROWS.index(r["row"]),
                                             r["seed"]))
    summary = summarise(records, scale)
    data = {
        "scale": scale, "command": command,
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(U.__file__.rsplit(os.sep, 4)[0]),
        "summary": summary, "bootstrap": bootstrap(records, work, sc.bootstrap_resamples),
        "table1": table1(records), "runs": records, "missing": missing,
        "time": {"runs_s": round(sum(U.run_seconds(r) for r in records), 1), "prepare_s": round(prepare_s, 1),
                 "invocation_s": round(invocation_s, 1)},
        "figures": [],
    }
    if plots and records:
        figures = plot_curves(records, out) + [plot_bars(summary, out)]
        data["figures"] = [os.path.basename(p) for p in figures if p]
    with atomic_write(os.path.join(out, "results.json")) as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    path = os.path.join(out, "REPORT.md")
    with atomic_write(path) as f:
        f.write(markdown(data))
    return path
