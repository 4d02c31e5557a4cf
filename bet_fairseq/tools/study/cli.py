"""``bet-reproduce``: the seeded, resumable reproduction study (Transformer, + DiagFreeMask, BET(SF),
BET(SG) on Multi30k De-En and WikiText-2, several seeds each, Figure 3's diagonal sweep and BET(SG)'s
lambda_p sweep) and its report.

    bet-reproduce --scale smoke --data-dir DATA          # minutes: the machinery, not results
    bet-reproduce --data-dir DATA --part headline        # the cpu scale (default), one part: ~3 hours on 2 cores
    bet-reproduce --data-dir DATA --part headline2       # the headline pair's seeds 4-6 (headline3: 7-8)
    bet-reproduce --data-dir DATA                        # every part, one after the other
    bet-reproduce --data-dir DATA --hours 2.7            # as many runs as fit 2.7 hours; the same command goes on
    bet-reproduce --scale paper                          # prints the plan and its GPU-hours; --run runs it
    bet-reproduce --dry-run                              # the plan, the expected time and the commands

Runs already finished in --work-dir are never redone; an interrupted run resumes from its
checkpoint_last.pt. Ctrl-C, or `kill PID` of a study started in the background, leaves every file consistent:
run the same command again to go on.
The report (REPORT.md, results.json, PNGs) is written to --out after the runs, from every finished run.
Each finished run is also kept in OUT/runs (its record, logs and test hypotheses; no checkpoints): committed
with the report, it lets the study go on in another work folder or on another machine, where those runs are
put back and count as finished.
"""

import argparse
import json
import math
import os
import shlex
import sys
import time

from bet_fairseq import catalog
from bet_fairseq.errors import InputError, check_writable_folder, run_tool
from bet_fairseq.files import atomic_write
from . import commands, plan, store
from .scheduler import Scheduler


def _csv(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def build_parser():
    p = argparse.ArgumentParser(prog="bet-reproduce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", default="cpu", help="smoke | cpu (default) | paper")
    p.add_argument("--out", help="report folder (default: docs/results for cpu, docs/results/paper for paper, "
                                 "WORK_DIR/report for smoke)")
    p.add_argument("--work-dir", help="data, checkpoints and logs (default: work-dirs/reproduce/SCALE)")
    p.add_argument("--data-dir", help="a folder holding multi30k/ and wikitext-2/ (default: download the public "
                                      "releases into the work folder)")
    p.add_argument("--jobs", type=int, help="runs at a time, one CPU thread each (default: 2 at the cpu scale "
                                            "on a machine with 2 or more cores, else 1)")
    p.add_argument("--part", type=_csv, help="only these parts, comma-separated (default: all, in this order): "
                                             + ", ".join(plan.PARTS))
    p.add_argument("--only", type=_csv, help="only these rows, comma-separated: " + ", ".join(plan.MAIN_ROWS))
    p.add_argument("--dataset", type=_csv, help="only these datasets, comma-separated: " + ", ".join(plan.DATASETS))
    p.add_argument("--max-seeds", type=int, help="at most this many seeds per row")
    p.add_argument("--dry-run", action="store_true", help="print the plan, its expected time and the commands")
    p.add_argument("--run", action="store_true", help="with --scale paper: run it (otherwise only the plan)")
    p.add_argument("--in-process", action="store_true",
                   help="call fairseq's command-line entry points inside this process (no start-up cost per run; "
                        "one job)")
    p.add_argument("--report-only", action="store_true", help="write the report from the finished runs only")
    p.add_argument("--no-plots", action="store_true", help="no PNG figures (matplotlib absent)")
    p.add_argument("--hours", type=float,
                   help="this sitting's time: start no run (nor prepare its dataset) that the estimate says would "
                        "end later than this many hours after the command started (the rest is left for the next "
                        "invocation; the report lists it)")
    return p


def check_options(args):
    if args.jobs is None:
        args.jobs = min(2, os.cpu_count() or 1) if args.scale == "cpu" and not args.in_process else 1
    if args.scale not in plan.SCALES:
        raise InputError(f"--scale {args.scale!r}: one of {', '.join(plan.SCALES)}")
    if args.jobs < 1:
        raise InputError(f"--jobs must be >= 1, got {args.jobs}")
    if args.in_process and args.jobs > 1:
        raise InputError("--in-process runs one job at a time: drop --jobs or --in-process")
    if args.data_dir and not os.path.isdir(args.data_dir):
        raise InputError(f"--data-dir {args.data_dir} is not a folder")
    if args.run and args.scale != "paper":
        raise InputError("--run goes with --scale paper (the other scales run without it)")
    if args.hours is not None and not (0 < args.hours < math.inf):
        raise InputError(f"--hours must be a positive number of hours, got {args.hours}")


def describe(args, runs, work, out):
    sc = plan.SCALE_TABLE[args.scale]
    # finished here with this code's commands, or kept in the archive (checked once it is put back)
    finished = [r for r in dict.fromkeys(plan.plan(args.scale) + runs)
                if store.load_current(work, r, args.scale) or not store.done(work, r) and store.holds(out, r)]
    done = [r for r in runs if r in finished]
    copies = store.copies_in(runs, args.scale, finished)  # no time: copied from their twins
    left = [r for r in runs if r not in done and r not in copies]
    print(f"bet-reproduce --scale {args.scale}: {sc.description}")
    counted = []
    for part in args.part or plan.PARTS:
        mine = [r for r in plan.plan(args.scale, max_seeds=args.max_seeds, parts=[part]) if r in runs and r not in counted]
        counted += mine
        if not mine:
            continue
        systems = {}
        for r in mine:
            systems[f"{r.dataset}/{r.system}"] = systems.get(f"{r.dataset}/{r.system}", 0) + 1
        hours = plan.expected_seconds(args.scale, [r for r in mine if r not in copies], args.jobs, prepare=False) / 3600
        copied = sum(r in copies for r in mine)
        print(f"  part {part}: {len(mine)} runs{f' ({copied} copies)' if copied else ''}, ~{hours:.1f} "
              f"{'GPU-' if sc.device == 'gpu' else ''}hours with --jobs {args.jobs} (after the parts above it; data "
              "preparation apart): " + ", ".join(f"{k} x{n}" for k, n in systems.items()))
    others = [r for r in runs if r not in counted]
    if others:
        print("  rows outside the parts: " + ", ".join(r.name for r in others))
    total = plan.expected_seconds(args.scale, [r for r in runs if r not in copies], args.jobs)
    rest = plan.expected_seconds(args.scale, left, args.jobs, prepare=bool(left))
    unit = "GPU-hours" if sc.device == "gpu" else "hours"
    print(f"  {len(runs)} runs, {len(done)} finished; expected {total / 3600:.1f} {unit} in all with --jobs "
          f"{args.jobs}, ~{rest / 3600:.1f} left")
    for note in sc.notes:
        print(f"  {note}")


PREPARE_RECORD = "prepare.json"  # in the work folder: the seconds spent preparing each dataset, in all sittings


def _prepare_seconds(work):
    """What preparing the work folder's datasets took: {dataset: seconds} ({} before any)."""
    path = os.path.join(work, PREPARE_RECORD)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _prepare_dataset(args, dataset, work, hints):
    """Prepare one dataset of the study (BET(SG)'s hints with ``hints``) and add the time to the record."""
    from . import data

    sc = plan.SCALE_TABLE[args.scale]
    start = time.time()
    print(f"[data] {catalog.dataset(dataset).label}: preparing in {work}", flush=True)
    bin_dir = data.prepare(dataset, work, args.data_dir, sc.data[catalog.dataset(dataset).kind], hints=hints)
    took = time.time() - start
    record = _prepare_seconds(work)
    record[dataset] = round(record.get(dataset, 0.0) + took, 1)
    os.makedirs(work, exist_ok=True)
    with atomic_write(os.path.join(work, PREPARE_RECORD)) as f:
        json.dump(record, f, indent=1)
    print(f"[data] {catalog.dataset(dataset).label}: {bin_dir} ({took:.0f} s)", flush=True)
    return bin_dir


class Datasets:
    """The runs' datasets, each prepared when its first run is about to start (``execute`` asks from its main
    thread, where Ctrl-C reaches it), so that a sitting whose ``--hours`` leave no time for a dataset's runs
    spends none on its data. BET(SG)'s hints are made where one of the runs needs them."""

    def __init__(self, args, runs, work, hints=True):
        self.args, self.work, self.bins = args, work, {}
        self.hints = {d: hints and any(catalog.row(r.row).needs_syntax_hints for r in runs if r.dataset == d)
                      for d in {r.dataset for r in runs}}
        self.prepared_before = set(_prepare_seconds(work))

    def ready(self, dataset):
        return dataset in self.bins

    def seconds_to_prepare(self, dataset):
        """The scale's estimate, or 0 for a dataset this work folder has prepared before (its steps are skipped)."""
        if self.ready(dataset) or dataset in self.prepared_before:
            return 0.0
        return plan.SCALE_TABLE[self.args.scale].seconds_prepare[catalog.dataset(dataset).kind]

    def bin_dir(self, dataset):
        if dataset not in self.bins:
            self.bins[dataset] = _prepare_dataset(self.args, dataset, self.work, self.hints[dataset])
        return self.bins[dataset]


def default_out(scale, work):
    return {"cpu": os.path.join("docs", "results"), "paper": os.path.join("docs", "results", "paper")}.get(
        scale, os.path.join(work, "report"))


INTERRUPTED = ("interrupted. Finished runs are kept and an unfinished one resumes from its checkpoint_last.pt: run the "
               "same command again.")


def main(argv=None):
    """``bet-reproduce``: the exit status (bad input: one line, status 2; Ctrl-C or ``kill``: one line, status 130,
    every fairseq process stopped and every marker consistent)."""
    return run_tool("bet-reproduce", _main, argv, interrupted=INTERRUPTED)


def _main(argv=None):
    started = time.time()
    parser = build_parser()
    args = parser.parse_args(argv)
    check_options(args)
    runs = plan.plan(args.scale, args.only, args.dataset, args.max_seeds, args.part)
    work = os.path.abspath(args.work_dir or os.path.join("work-dirs", "reproduce", args.scale))
    out = os.path.abspath(args.out or default_out(args.scale, work))
    describe(args, runs, work, out)
    if args.dry_run or (args.scale == "paper" and not args.run and not args.report_only):
        for run in runs[:len(plan.DATASETS) * len(plan.MAIN_ROWS)]:
            train, ev = commands.commands(run, args.scale, f"<{run.dataset} data-bin>", store.run_dir(work, run),
                                   cpu=plan.SCALE_TABLE[args.scale].device == "cpu")
            print(f"# {run.name}\n{shlex.join(train)}\n{shlex.join(ev)}")
        if args.scale == "paper" and not args.run:
            print("not running: --scale paper runs only with --run (on a GPU machine)")
        return 0
    check_writable_folder(out, "--out")  # now, not after hours of runs
    check_writable_folder(work, "--work-dir")
    from . import data, report

    everything = plan.plan(args.scale)
    restored = store.restore(out, work, everything)
    if restored:
        print(f"[archive] {len(restored)} finished runs put back from {store.folder(out)} into {work}", flush=True)
    command = "bet-reproduce " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    failures, deferred = [], []
    if runs and not args.report_only:
        # every run is looked at, the finished ones too: one whose commands changed (a new default, a larger
        # --max-update) is done again; the others are skipped at once
        deadline = None if args.hours is None else started + args.hours * 3600
        history = [rec for rec in (store.load(work, r) for r in everything) if rec and not store.is_copy(rec)]
        scheduler = Scheduler(args.scale, work, out, Datasets(args, runs, work), jobs=args.jobs,
                              in_process=args.in_process, deadline=deadline, hours=args.hours,
                              history=history)
        failures, deferred = scheduler.run(runs)
    elif args.data_dir and restored and not os.path.exists(data.raw_references(work)):
        # runs put back from the archive into a new work folder: the report scores their hypotheses
        # against the raw test references, which come with the prepared data
        scored = [r for r in everything if store.done(work, r) and catalog.dataset(r.dataset).kind == "mt"]
        datasets = Datasets(args, scored, work, hints=False)
        for dataset in sorted({r.dataset for r in scored}):
            datasets.bin_dir(dataset)
    # the report covers the whole study of the scale, whichever part this invocation ran (and its archive keeps
    # every finished run, those made by an earlier invocation or an older version of this code included)
    for run in everything:
        store.save(work, out, run)
    current = {r: store.load_current(work, r, args.scale) for r in everything}  # left out: runs of other commands
    records = [rec for rec in current.values() if rec is not None]
    missing = {part: [r.name for r in plan.plan(args.scale, parts=[part]) if current.get(r) is None] for part in plan.PARTS}
    prepare_s = sum(_prepare_seconds(work).values())
    path = report.write(out, args.scale, records, work, command, prepare_s, time.time() - started, missing,
                        plots=not args.no_plots)
    print(f"report: {path} ({len(records)} of {len(everything)} runs of the study)", flush=True)
    if deferred:
        print(f"bet-reproduce: --hours {args.hours:g}: {len(deferred)} run(s) left for the next invocation (the same "
              f"command goes on from them): " + ", ".join(r.name for r in deferred), flush=True)
    if failures:
        print("bet-reproduce: failed runs:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
