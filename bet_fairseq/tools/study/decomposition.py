"""BET(SF) taken apart: the 2 x 2 of its two changes (``plan.DECOMPOSITION``: the DiagFreeMask, the re-weighting
by R) and the two contrasts it exists for (``plan.DECOMPOSITION_CONTRASTS``), each paired by seed over the seeds
both systems have, with its seed interval, its test-resampling interval (sacreBLEU, translation) and the paper's
corresponding difference.

Holm's correction is over the two contrasts of one dataset and metric: they are the family planned together to
answer one question (how BET(SF)'s effect splits between the mask and the re-weighting), apart from the family of
every system against the Transformer (the summary's), where each cell is also compared.
"""

import os

from bet_fairseq import catalog
from . import plan, stats
from .words import METRIC_NAME, direction, interval, number, p_value, seeds_note, t_test_words, verdict

CONTRAST_TEXT = {
    ("bet_sf", "diagfree"): "what the re-weighting adds to the mask",
    ("bet_sf_nodiagmask", plan.BASELINE): "the re-weighting alone",
}
FAMILY = ("the two decomposition contrasts of this dataset and metric (planned together; the cells against the "
          "Transformer are in the summary's family)")


def _paper(row, ds):
    return catalog.row(row).paper.get(ds.paper)


def compute(summary, metric_of, resample=None):
    """Per dataset of ``summary`` (``report.summarise``) with a decomposition system, on its metric
    ``metric_of(dataset)``: the four cells and the two contrasts. ``resample(dataset, system, against)``: the
    test-resampling interval of ``system - against`` over the seeds both have (``{"ci", "seeds", ...}``), or None."""
    out = {}
    for dkey, per_metric in summary.items():
        ds, metric = catalog.dataset(dkey), metric_of(dkey)
        by_system = per_metric.get(metric, {})
        if sum(row in by_system for row in plan.DECOMPOSITION.values()) < 2:
            continue
        base_paper = _paper(plan.BASELINE, ds)
        cells = []
        for (mask, reweighting), row in plan.DECOMPOSITION.items():
            e = by_system.get(row, {})
            paper = _paper(row, ds)
            resampled = None if row == plan.BASELINE or resample is None else resample(dkey, row, plan.BASELINE)
            cells.append({"mask": mask, "reweighting": reweighting, "system": row, "label": catalog.row(row).label,
                          "values": e.get("values", {}), "ci": e.get("ci", stats.mean_ci([])), "diff": e.get("diff"),
                          "test_resampling": resampled,
                          "paper": paper, "paper_diff": None if row == plan.BASELINE or paper is None
                          or base_paper is None else round(paper - base_paper, 2)})
        contrasts = []
        for system, against in plan.DECOMPOSITION_CONTRASTS:
            mine = {int(s): v for s, v in by_system.get(system, {}).get("values", {}).items()}
            theirs = {int(s): v for s, v in by_system.get(against, {}).get("values", {}).items()}
            a, b = _paper(system, ds), _paper(against, ds)
            contrasts.append({
                "system": system, "against": against, "what": CONTRAST_TEXT[(system, against)],
                "diff": stats.paired_difference(mine, theirs),
                "test_resampling": resample(dkey, system, against) if resample is not None else None,
                "paper_diff": None if a is None or b is None else round(a - b, 2), "paper_dataset": ds.paper,
                "paper_comparable": ds.paper_comparable})
            contrasts[-1]["verdict"] = verdict(contrasts[-1]["diff"], metric)
        family = {k: c["diff"]["p"] for k, c in enumerate(contrasts) if c["diff"].get("p") is not None}
        for k, p in stats.holm(family).items():
            contrasts[k]["diff"]["p_holm"] = p
        out[dkey] = {"metric": metric, "cells": cells, "contrasts": contrasts, "holm_family": FAMILY}
    return out


def markdown(parts, figures):
    """The report's section on BET(SF) taken apart: per dataset, its four cells and its two contrasts; ``figures``:
    the names of the figures written."""
    if not parts:
        return []
    L = ["## BET(SF) taken apart: the DiagFreeMask and the re-weighting", "",
         "BET(SF) is two changes to the Transformer at once: the DiagFreeMask (the second pass never attends to the "
         "query's own position) and the re-weighting of the attention by the first pass's R. The four cells below "
         "are each combination; the two contrasts are paired by seed over the seeds both systems have: BET(SF) "
         "against + DiagFreeMask is what the re-weighting adds to the mask, BET(SF) - DiagFreeMask against the "
         f"Transformer is the re-weighting alone. Holm's correction is over {FAMILY}.", ""]
    for dkey, part in parts.items():
        ds, metric = catalog.dataset(dkey), part["metric"]
        where = "" if ds.paper_comparable else " (IWSLT14 De-En)"
        L += [f"### {ds.label}: {METRIC_NAME[metric]}", "",
              "| cell | DiagFreeMask | re-weighting by R | seeds | mean ± 95% CI | difference to Transformer (paired by "
              "seed) ± 95% seed interval | paper | paper's difference to Transformer |", "|---|---|---|---|---|---|---|---|"]
        for c in part["cells"]:
            d = c.get("diff") or {}
            diff = "(baseline)" if c["system"] == plan.BASELINE else (interval(d, sign=True) if d else "-")
            paper = number(c["paper"]) + where if c.get("paper") is not None else "-"
            pd = "-" if c["paper_diff"] is None else number(c["paper_diff"], sign=True) + where
            seeds = f"{len(c['values'])} ({', '.join(c['values'])})" if c["values"] else "0"
            L.append(f"| {c['label']} | {'yes' if c['mask'] else 'no'} | {'yes' if c['reweighting'] else 'no'} | "
                     f"{seeds} | {interval(c['ci'])} | {diff} | {paper} | {pd} |")
        L += ["", "| contrast | what it measures | seeds paired | difference ± 95% seed interval | test-resampling 95% "
              "interval | p (t, two-sided) | p Holm (the two contrasts) | paper's difference |",
              "|---|---|---|---|---|---|---|---|"]
        words = []
        for c in part["contrasts"]:
            d, r = c["diff"], c.get("test_resampling")
            name = f"{catalog.row(c['system']).label} vs {catalog.row(c['against']).label}"
            rs = f"[{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}]" if r else ("-" if metric == "sacrebleu_raw" else "n/a")
            pd = "-" if c["paper_diff"] is None else number(c["paper_diff"], sign=True) + where
            L.append(f"| {name} | {c['what']} | {', '.join(map(str, d['seeds'])) or '-'} | {interval(d, sign=True)} | "
                     f"{rs} | {p_value(d.get('p'))} | {p_value(d.get('p_holm'))} | {pd} |")
            tests = t_test_words(d, family="the two contrasts")
            if r:
                tests += f"; test-resampling 95% interval [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}]"
            paper = ""
            if c["paper_diff"] is not None and d.get("mean") is not None:
                paper_way, ours = direction(c["paper_diff"], metric), direction(d["mean"], metric)
                paper = (f"; the paper's{where} difference is {c['paper_diff']:+.2f} ({paper_way}), ours "
                         + ("shows no change" if ours == "no change" else
                            f"points {'the same way' if ours == paper_way else 'the other way'}"))
            if d.get("mean") is None:
                words.append(f"- {name} ({c['what']}): no seed in common yet.")
                continue
            words.append(f"- {name} ({c['what']}): {interval(d, sign=True)} {METRIC_NAME[metric]}{seeds_note(d)}: "
                         f"{c['verdict']}{tests}{paper}.")
        L += [""] + words + [""]
        name = f"decomposition_{dkey}.png"
        if name in figures:
            L += [f"![{ds.label}: BET(SF) taken apart]({name})", ""]
    return L


def plot(dkey, part, out, metric_name, higher_better):
    """``decomposition_DATASET.png``: left, each cell's mean with its seed interval and its seeds; right, the
    paired differences (each cell minus the Transformer, then the two contrasts) with their seed intervals (thick),
    test-resampling intervals (thin) and the paper's difference (x). None when no cell has a value."""
    from ..figures import pyplot, save_png

    cells = part["cells"]
    if not any(c["ci"].get("mean") is not None for c in cells):
        return None
    plt = pyplot()
    fig, (ax, dax) = plt.subplots(1, 2, figsize=(11.5, 4.4), gridspec_kw={"width_ratios": [1.1, 1.3]})
    colours = {(False, False): "#444444", (True, False): "#1f77b4", (False, True): "#ff7f0e", (True, True): "#d62728"}
    for x, c in enumerate(cells):
        colour = colours[(c["mask"], c["reweighting"])]
        if c["ci"].get("mean") is None:
            ax.annotate("no runs yet", (x, 0.5), xycoords=("data", "axes fraction"), ha="center", fontsize=7,
                        color=colour)
            continue
        ax.errorbar([x], [c["ci"]["mean"]], yerr=[c["ci"]["half_width"] or 0.0], fmt="o", color=colour, capsize=5,
                    linewidth=2)
        values = list(c["values"].values())
        ax.plot([x + 0.15] * len(values), values, ".", color=colour, alpha=0.5, markersize=4)
        ax.annotate(f"n={len(values)}", (x, c["ci"]["mean"]), textcoords="offset points", xytext=(8, -12), fontsize=7)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c["label"].replace(" + ", "\n+ ").replace(" - ", "\n- ")
                        + f"\nmask {'yes' if c['mask'] else 'no'}\nre-weighting {'yes' if c['reweighting'] else 'no'}"
                        for c in cells], fontsize=6.5)
    ax.set_xlim(-0.5, len(cells) - 0.3)
    ax.set_ylabel(f"{metric_name} (test), mean ± 95% seed interval")
    ax.set_title("the four cells, each over its own seeds (dots)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    rows = [(f"{c['label']} vs Transformer", c.get("diff") or {}, c.get("test_resampling"), c["paper_diff"],
             colours[(c["mask"], c["reweighting"])]) for c in cells if c["system"] != plan.BASELINE]
    rows += [(f"{catalog.row(c['system']).label} vs {catalog.row(c['against']).label}\n({c['what']})", c["diff"],
              c.get("test_resampling"), c["paper_diff"], "#000000") for c in part["contrasts"]]
    for y, (label, diff, resampled, paper, colour) in enumerate(rows):
        if paper is not None:
            dax.plot([paper], [y], "x", color=colour, markersize=7)
        if diff.get("mean") is None:
            dax.annotate("no seed in common yet", (0, y), textcoords="offset points", xytext=(6, 3), fontsize=7,
                         color=colour)
            continue
        dax.errorbar([diff["mean"]], [y], xerr=[diff["half_width"] or 0.0], fmt="o", color=colour, capsize=4,
                     linewidth=2.2)
        dax.annotate(f"n={diff['n']}", (diff["mean"], y), textcoords="offset points", xytext=(6, 5), fontsize=7)
        if resampled:
            dax.plot(resampled["ci"], [y + 0.22] * 2, color=colour, linewidth=1)
    dax.axvline(0, color="black", linewidth=0.8)
    dax.axhline(len(rows) - len(part["contrasts"]) - 0.5, color="#999999", linewidth=0.6, linestyle=":")
    dax.set_yticks(range(len(rows)))
    dax.set_yticklabels([r[0] for r in rows], fontsize=6.5)
    dax.invert_yaxis()
    dax.set_xlabel(f"difference, paired by seed ({'higher' if higher_better else 'lower'} is better)")
    dax.set_title("paired differences: 95% seed interval (thick), test-resampling (thin, below), paper's (x)",
                  fontsize=8)
    dax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{catalog.dataset(dkey).label}: BET(SF) = Transformer + DiagFreeMask + re-weighting by R",
                 fontsize=10)
    fig.tight_layout()
    return save_png(fig, os.path.join(out, f"decomposition_{dkey}.png"))
