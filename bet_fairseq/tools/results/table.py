"""``bet-results``: collect the ``result.json`` files written by ``bet-run-row`` into a Markdown table
in the layout of Table 2 (ours beside the paper's number), and optionally plot the loss curves.

    bet-results runs/ -o table2.md --plot-dir figures/
"""

import argparse
import json
import os
import sys

from bet_fairseq import catalog
from bet_fairseq.errors import InputError, check_writable_file, check_writable_folder, run_tool
from bet_fairseq.files import atomic_write
from bet_fairseq.tools import markers

COLUMNS = [d.key for d in catalog.table2_datasets()]


def find_results(paths):
    found = []
    for p in paths:
        if os.path.isfile(p):
            found.append(p)
        elif os.path.isdir(p):
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames.sort()
                if "result.json" in filenames:
                    found.append(os.path.join(dirpath, "result.json"))
        else:
            raise InputError(f"{p}: no such file or folder (give result.json files or folders holding them)")
    return found


def load_results(paths):
    results = []
    for path in find_results(paths):
        with open(path, encoding="utf-8") as f:
            try:
                r = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InputError(f"{path} is not valid JSON ({exc}): not a bet-run-row result") from None
        if not isinstance(r, dict):
            raise InputError(f"{path} holds a JSON {type(r).__name__}, not a bet-run-row result")
        missing = [k for k in ("row", "dataset", "metric", "value") if k not in r]
        if missing:
            raise InputError(f"{path} lacks {missing}: not a bet-run-row result")
        if "digest" in r and markers.problem(path):  # results of version 0.2 carry no digest
            raise InputError(f"{path} was changed after bet-run-row wrote it (its content does not match its digest): "
                             "run bet-run-row again with --force, or restore the file")
        r["_path"] = path
        results.append(r)
    return results


def setting(result) -> str:
    """"paper", "quick" or "modified" (results of version 0.2 record only ``quick``)."""
    return result.get("setting") or ("quick" if result.get("quick") else "paper")


def pick(results):
    """One result per (row, dataset): runs of the paper's setting before the others, then the latest."""
    best = {}
    for r in sorted(results, key=lambda r: (setting(r) == "paper", r.get("date", ""))):
        best[catalog.ROW_ALIASES.get(r["row"], r["row"]), r["dataset"]] = r
    return best


def fmt(value, metric):
    if value is None:
        return "-"
    return f"{value:.3f}" if metric == "bpc" else f"{value:.2f}"


def markdown(results, all_rows=True):
    chosen = pick(results)
    lines = []
    if any(setting(r) == "quick" for r in chosen.values()):
        n = sorted({r.get("num_updates") for r in chosen.values() if setting(r) == "quick"} - {None})
        lines.append(f"Quick mode (tiny models, {', '.join(map(str, n)) or 'a few'} updates, small slices): "
                     "a smoke test, NOT comparable with the paper's numbers.\n")
    modified = sorted(f"{k} on {d}" for (k, d), r in chosen.items() if setting(r) == "modified")
    if modified:
        lines.append(f"Modified settings (--updates, --arch or extra fairseq-train arguments) for {', '.join(modified)}: "
                     "NOT the paper's setting, NOT comparable with its numbers.\n")
    header = ["system"] + [catalog.dataset(d).column for d in COLUMNS]
    lines.append("Cells: ours (paper). BLEU: higher is better; perplexity (WikiText) and bits per character "
                 "(enwik8): lower is better; '-' not run / not in the paper.\n")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    known = [r.key for r in catalog.table2_rows()]
    keys = known + sorted({k for k, _ in chosen} - set(known))
    for key in keys:
        row = catalog.ROWS.get(key)
        if not all_rows and not any((key, d) in chosen for d in COLUMNS):
            continue
        label = row.label if row else key
        cells = []
        for d in COLUMNS:
            metric = catalog.dataset(d).metric
            paper = row.paper.get(d) if row else None
            r = chosen.get((key, d))
            ours = fmt(r["value"], metric) if r else "-"
            cells.append(f"{ours} ({fmt(paper, metric)})" if paper is not None else ours)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| row | dataset | arch | metric | ours | paper | updates | train s | eval s | setting | result |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for (key, d), r in sorted(chosen.items(), key=lambda kv: (keys.index(kv[0][0]), COLUMNS.index(kv[0][1])
                                                               if kv[0][1] in COLUMNS else 99)):
        wall = r.get("wall_time_s", {})
        extra = f" (sacreBLEU {r['sacrebleu_detok']})" if r.get("sacrebleu_detok") is not None else ""
        lines.append(f"| {key} | {d} | {r.get('arch', '')} | {r['metric']} | {fmt(r['value'], r['metric'])}{extra} | "
                     f"{fmt(r.get('paper_value'), r['metric'])} | {r.get('num_updates', '')} | {wall.get('train', '')} | "
                     f"{wall.get('eval', '')} | {setting(r)} | {r['_path']} |")
    return "\n".join(lines) + "\n"


def plot(results, plot_dir):
    from .curves import parse_log, plot_curves

    written = []
    chosen = pick(results)
    for d in COLUMNS:
        runs = []
        for (key, dataset), r in chosen.items():
            log = r.get("train_log") or os.path.join(os.path.dirname(r["_path"]), "train.log")
            if dataset != d or not os.path.exists(log):
                continue
            runs.append((r.get("row_label", key), [parse_log(log)], None))
        if runs:
            written.append(plot_curves(runs, os.path.join(plot_dir, f"loss_{d}.png"),
                                       f"{catalog.dataset(d).column}: loss curves"))
    return written


def main(argv=None):
    """``bet-results``: the exit status (bad input: one line, status 2)."""
    return run_tool("bet-results", _main, argv)


def _main(argv=None):
    p = argparse.ArgumentParser(prog="bet-results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="result.json files or folders searched for them")
    p.add_argument("-o", "--output", help="write the Markdown here (default: stdout)")
    p.add_argument("--plot-dir", help="also write loss_<dataset>.png curves from the runs' train.log")
    p.add_argument("--only-run-rows", action="store_true", help="leave out rows without any result")
    args = p.parse_args(argv)
    if args.output:  # before reading every run
        check_writable_file(args.output, "-o")
    if args.plot_dir:
        check_writable_folder(args.plot_dir, "--plot-dir")
    results = load_results(args.paths)
    if not results:
        raise InputError(f"no result.json under {' '.join(args.paths)}")
    text = markdown(results, all_rows=not args.only_run_rows)
    if args.output:
        with atomic_write(args.output) as f:
            f.write(text)
        print(f"wrote {args.output} ({len(results)} results)")
    else:
        sys.stdout.write(text)
    if args.plot_dir:
        for path in plot(results, args.plot_dir):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
