"""``bet-run-row``: train and evaluate one row of Table 2 on one dataset, and write ``result.json``.

    bet-run-row --row bet_sf --dataset iwslt14_de_en --data DATA/iwslt14/bin --save-dir runs/iwslt14/bet_sf
    bet-run-row ... --quick            # tiny model, a few updates: a smoke test on a CPU (or BET_QUICK=1)
    bet-run-row ... -- --fp16          # anything after "--" is appended to fairseq-train
    run/iwslt14_de_en.sh bet_sf DATA/iwslt14/bin runs/iwslt14/bet_sf [options]   # the same, one script a dataset

Training is fairseq-train with the row's architecture (``rows.py``) and the dataset's settings
(``bet_fairseq/recipes.py``), its output kept in SAVE_DIR/train.log (``--log-format json``, read by
``bet-results --plot``); evaluation is fairseq-generate (beam 5, --remove-bpe, tokenised BLEU4 as the
fairseq IWSLT recipe reports it, plus sacreBLEU on Moses-detokenised text) or fairseq-eval-lm
(perplexity; bits per character = "Loss (base 2)" per byte token for enwik8) on the test split, its
output in SAVE_DIR/eval.log.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import sys

from bet_fairseq import catalog, recipes
from bet_fairseq.errors import InputError, check_writable_folder, run_tool
from bet_fairseq.tools import executor, markers

INTERRUPTED = ("interrupted; fairseq-train keeps SAVE_DIR/checkpoint_last.pt: run the same command again to resume "
               "from it")


def availability(row, dataset, arch=None):
    """None when the row can run on this dataset (with ``arch`` instead of its own), else the reason it cannot."""
    if not row.covers(dataset):
        return f"row {row.key!r} ({row.label}) has no {dataset} entry in Table 2"
    import bet_fairseq

    bet_fairseq.register()  # the project's archs, tasks, criterions (as fairseq's --user-dir would)
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    arch = arch or row.arch(dataset)
    kind = catalog.dataset(dataset).kind
    if arch not in ARCH_MODEL_REGISTRY:
        return f"row {row.key!r} on {dataset} is not available: architecture {arch!r} is not registered"
    flags = row.train_flags.get(kind, {})
    task, criterion = flags.get("--task"), flags.get("--criterion")
    if task and task not in TASK_REGISTRY:
        return f"row {row.key!r} on {dataset} is not available: task {task!r} is not registered"
    if criterion and criterion not in CRITERION_REGISTRY:
        return f"row {row.key!r} on {dataset} is not available: criterion {criterion!r} is not registered"
    return None


def check_data(row, dataset, data):
    ds = catalog.dataset(dataset)
    if not os.path.isdir(data):
        raise InputError(f"--data {data} is not a folder; make it with: {ds.prepare}")
    if ds.kind == "mt":
        need = [f"dict.{ds.source}.txt", f"dict.{ds.target}.txt", f"train.{ds.source}-{ds.target}.{ds.source}.idx",
                f"test.{ds.source}-{ds.target}.{ds.target}.idx"]
    else:
        need = ["dict.txt", "train.idx", "test.idx"]
    missing = [n for n in need if not os.path.exists(os.path.join(data, n))]
    if missing:
        raise InputError(f"--data {data} is not a binarised {dataset} folder (missing {missing[0]}); make it with: "
                         f"{ds.prepare}")
    if row.needs_syntax_hints:
        hint = f"train.hints.{ds.target}.bin" if ds.kind == "mt" else "train.hints.bin"
        if not os.path.exists(os.path.join(data, hint)):
            lang = f" --lang {ds.target}" if ds.kind == "mt" else ""
            raise InputError(f"row {row.key} needs syntax hints: {os.path.join(data, hint)} is missing; make them with "
                           f"bet-syntax-hints --trainpref TEXT/train --validpref TEXT/valid{lang} --destdir {data} "
                           "(TEXT: the BPE text folder the data was binarised from)")


def row_job(row, dataset, data, save_dir, quick=False, updates=None, extra=(), cpu=None, arch=None,
            user_dir=None) -> executor.Job:
    """One row on one dataset: the dataset's recipe, then the row's flags."""
    ds = catalog.dataset(dataset)
    row_train, row_eval = row.train_flags.get(ds.kind, {}), row.eval_flags.get(ds.kind, {})
    train = recipes.merge(recipes.train_recipe(dataset, quick, updates), row_train)
    if quick and row_train.get("--sample-break-mode") == "eos":
        train["--tokens-per-sample"] = 256  # one sentence a sample: the quick 64-token blocks would drop most
    job = executor.Job(arch or row.arch(dataset), data, save_dir, ds, train,
                       recipes.merge(recipes.eval_recipe(dataset, quick), row_eval), extra_train=list(extra),
                       user_dir=user_dir)
    if cpu is not None:
        job.cpu = cpu
    return job


def build_commands(row, dataset, data, save_dir, quick=False, updates=None, extra=(), user_dir=None, cpu=None,
                   arch=None):
    """(train argv, eval argv) for one row on one dataset."""
    return row_job(row, dataset, data, save_dir, quick, updates, extra, cpu, arch, user_dir).commands()


def setting(args):
    """"paper" (the recipe as it is), "quick" (--quick) or "modified" (--updates, --arch or fairseq-train
    arguments after --): only "paper" results stand beside the paper's numbers in ``bet-results``."""
    if args.quick:
        return "quick"
    return "modified" if (args.updates or args.arch or args.extra) else "paper"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="bet-run-row", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--row", help="Table 2 row key (--list shows them)")
    p.add_argument("--dataset", choices=[d.key for d in catalog.table2_datasets()], help="dataset column")
    p.add_argument("--data", help="the binarised data folder (fairseq-preprocess output)")
    p.add_argument("--save-dir", help="checkpoints, train.log, eval.log and result.json go here")
    p.add_argument("--quick", action="store_true", default=os.environ.get("BET_QUICK", "") not in ("", "0"),
                   help="tiny model, a few updates (also BET_QUICK=1)")
    p.add_argument("--updates", type=int, help="--max-update (quick default %d)" % recipes.QUICK_UPDATES)
    p.add_argument("--cpu", action="store_true", default=None, help="force the CPU (default: when no GPU)")
    p.add_argument("--force", action="store_true", help="run even when SAVE_DIR/result.json exists")
    p.add_argument("--eval-only", action="store_true", help="evaluate the existing checkpoint_best.pt")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    p.add_argument("--quiet", action="store_true", help="keep fairseq's output in the logs only")
    p.add_argument("--in-process", action="store_true",
                   help="call fairseq's CLIs inside this process instead of subprocesses (saves their start-up; "
                        "the recorded commands are the same)")
    p.add_argument("--arch", help="train this architecture with the row's settings instead of the row's own "
                                  "(result.json records it); another row's architecture on --dataset runs that row")
    p.add_argument("--list", action="store_true",
                   help="list rows, datasets and availability (of --dataset only, when given), then exit")
    # run/<dataset>.sh passes --script "$0" --dataset D "$@": ROW DATA_BIN SAVE_DIR come as positionals
    p.add_argument("--script", help=argparse.SUPPRESS)
    p.add_argument("positional", nargs="*", help=argparse.SUPPRESS)
    if argv is None:
        argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = p.parse_intermixed_args(argv)
    args.extra = extra
    if args.script:
        from_script(p, args)
    elif args.positional:
        p.error(f"unexpected argument {args.positional[0]!r} (fairseq-train arguments go after --)")
    if not args.list:
        missing = [n for n in ("row", "dataset", "data", "save_dir") if getattr(args, n) is None]
        if missing:
            p.error("the following arguments are required: " + ", ".join("--" + m.replace("_", "-") for m in missing))
    return args


def from_script(parser, args):
    """``run/<dataset>.sh ROW DATA_BIN SAVE_DIR [options]``: fill --row/--data/--save-dir from the
    positionals; without them, or with a row the dataset does not have, print the script's usage and
    the dataset's rows and exit 2."""
    if args.dataset is None or args.row or args.data or args.save_dir:
        parser.error("--script goes with --dataset and ROW DATA_BIN SAVE_DIR (not --row/--data/--save-dir)")
    given, rows = args.positional, catalog.rows_on(args.dataset)
    if args.list and not given:
        return
    if len(given) == 3 and given[0] in {r.key for r in rows}:
        args.row, args.data, args.save_dir = given
        return
    problem = None
    if len(given) > 3:
        problem = f"unexpected argument {given[3]!r} (fairseq-train arguments go after --)"
    elif given and len(given) < 3:
        problem = "ROW, DATA_BIN and SAVE_DIR are all needed"
    elif given:
        problem = f"{args.dataset} has no row {given[0]!r}"
    ds = catalog.dataset(args.dataset)
    lines = [f"usage: {args.script} ROW DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]"]
    lines += [f"error: {problem}"] if problem else []
    lines += [f"Table 2 rows on {ds.column} ({args.dataset}):"]
    width = max(len(r.arch(args.dataset)) for r in rows)
    lines += [f"  {r.key:18s} --arch {r.arch(args.dataset):{width}s}  {r.label}" for r in rows]
    lines += [f"DATA_BIN: {ds.prepare}",
              "bet-run-row options (--quick, --updates N, --dry-run, --force, ...): python run/table2.py --help"]
    print("\n".join(lines), file=sys.stderr)
    raise SystemExit(2)


def trained_arch(save_dir):
    """The --arch of the last fairseq-train run logged in SAVE_DIR/train.log (the executor writes each command as a
    header line), else of SAVE_DIR/result.json; None when neither says."""
    found = None
    try:
        with open(os.path.join(save_dir, "train.log"), encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.match(r"# \S+ .*?--arch (\S+)", line)
                if m:
                    found = m.group(1)
    except OSError:
        pass
    if found is None:
        try:
            with open(os.path.join(save_dir, "result.json"), encoding="utf-8") as f:
                recorded = json.load(f)
        except (OSError, ValueError):
            recorded = None
        found = recorded.get("arch") if isinstance(recorded, dict) else None
    return found


def check_save_dir(save_dir, arch, force):
    """SAVE_DIR holds no run of another architecture: fairseq-train would try to resume its checkpoint_last.pt (and
    fail), and the new result.json would replace the other run's."""
    if not os.path.isdir(save_dir):
        return
    other = trained_arch(save_dir)
    if other is None or other == arch:
        return
    if os.path.exists(os.path.join(save_dir, "checkpoint_last.pt")):
        raise InputError(f"--save-dir {save_dir} holds a run of --arch {other} (checkpoint_last.pt, which "
                         f"fairseq-train would resume into {arch}): choose another --save-dir, or move its checkpoints "
                         "away")
    if os.path.exists(os.path.join(save_dir, "result.json")) and not force:
        raise InputError(f"--save-dir {save_dir} holds the result.json of --arch {other}, which this run of {arch} "
                         "would replace: choose another --save-dir, or add --force")


def list_rows(dataset=None):
    for r in catalog.table2_rows():
        for d in catalog.table2_datasets():
            if r.covers(d.key) and dataset in (None, d.key):
                why = availability(r, d.key)
                print(f"{r.key:18s} {d.key:14s} {r.arch(d.key):32s} {'available' if why is None else 'NOT AVAILABLE'}")


def run_row(args):
    try:
        row = catalog.row(args.row)
    except KeyError as exc:
        raise InputError(f"--row: {exc.args[0]}") from None
    if args.arch:  # another row's architecture on this dataset runs that row (its settings, its result)
        named = catalog.row_of_arch(args.arch)
        row = named if named is not None and named.covers(args.dataset) else row
    why = availability(row, args.dataset, args.arch)
    if why:
        raise InputError(why)
    data, save_dir = os.path.abspath(args.data), os.path.abspath(args.save_dir)
    check_data(row, args.dataset, data)
    check_writable_folder(save_dir, "--save-dir")
    result_path = os.path.join(save_dir, "result.json")
    job = row_job(row, args.dataset, data, save_dir, args.quick, args.updates, args.extra, cpu=args.cpu, arch=args.arch)
    check_save_dir(save_dir, job.arch, args.force)
    train_argv, eval_argv = job.commands()
    if args.dry_run:
        print(shlex.join(train_argv))
        print(shlex.join(eval_argv))
        return None
    if args.eval_only and not os.path.exists(job.checkpoint_path):
        raise InputError(f"--eval-only: no {job.checkpoint_path} to evaluate; train it first (drop --eval-only)")
    settings = {"train": shlex.join(train_argv), "eval": shlex.join(eval_argv)}
    if os.path.exists(result_path) and not (args.force or args.eval_only):
        done = markers.read(result_path, settings, say=lambda m: print(m, file=sys.stderr))
        if done is not None:
            print(f"{result_path} exists: skipping (--force to run again)")
            return done
    ds = catalog.dataset(args.dataset)
    run = {"in_process": args.in_process, "echo": not args.quiet}
    timing = {"train_wall_s": 0.0}
    if not args.eval_only:
        timing = executor.train(job, **run)
    scored = executor.evaluate(job, **run)
    train_log, eval_log = os.path.join(save_dir, "train.log"), os.path.join(save_dir, "eval.log")
    extra = ({"sacrebleu_detok": scored["sacrebleu"], "hypotheses": scored["sentences"]} if ds.kind == "mt"
             else {"loss_base2": scored["loss_base2"], "perplexity": scored["ppl"]})
    train_s, eval_s = timing["train_wall_s"], scored["eval_wall_s"]
    result = {
        "row": row.key, "row_label": row.label, "dataset": args.dataset, "column": ds.column,
        "arch": job.arch, "metric": ds.metric, "value": scored["value"],
        "paper_value": row.paper.get(args.dataset), "quick": bool(args.quick), "setting": setting(args),
        "num_updates": executor.last_num_updates(train_log) if os.path.exists(train_log) else None,
        "command": settings,
        "wall_time_s": {"train": train_s, "eval": eval_s, "total": round(train_s + eval_s, 1)},
        "data": data, "checkpoint": job.checkpoint_path, "train_log": train_log, "eval_log": eval_log,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }
    markers.write(result_path, result, settings)
    print(f"{row.label} on {ds.column}: {ds.metric} = {scored['value']} (paper {row.paper.get(args.dataset)}) "
          f"-> {result_path}")
    return result


def run(argv=None):
    args = parse_args(argv)
    if args.list:
        list_rows(args.dataset)
        return 0
    run_row(args)
    return 0


def main(argv=None):
    """``bet-run-row``: the exit status (an error in the user's input: one line, status 2; a fairseq run that
    failed: one line naming its log, status 1)."""
    return run_tool("bet-run-row", run, argv, interrupted=INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
