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
import shutil
import subprocess
import sys
import time

from bet_fairseq import recipes
from bet_fairseq.files import atomic_write
from . import rows as R


class RowError(SystemExit):
    def __init__(self, message, code=2):
        super().__init__(code)
        self.message = message
        print(f"error: {message}", file=sys.stderr)


def availability(row, dataset, arch=None):
    """None when the row can run on this dataset (with ``arch`` instead of its own), else the reason it cannot."""
    if dataset not in row.archs:
        return f"row {row.key!r} ({row.label}) has no {dataset} entry in Table 2"
    import bet_fairseq

    bet_fairseq.register()  # the project's archs, tasks, criterions (as fairseq's --user-dir would)
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    arch = arch or row.archs[dataset]
    kind = R.DATASETS[dataset].kind
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
    ds = R.DATASETS[dataset]
    if not os.path.isdir(data):
        raise RowError(f"--data {data} is not a folder; make it with: {ds.prepare}")
    if ds.kind == "mt":
        need = [f"dict.{ds.source}.txt", f"dict.{ds.target}.txt", f"train.{ds.source}-{ds.target}.{ds.source}.idx",
                f"test.{ds.source}-{ds.target}.{ds.target}.idx"]
    else:
        need = ["dict.txt", "train.idx", "test.idx"]
    missing = [n for n in need if not os.path.exists(os.path.join(data, n))]
    if missing:
        raise RowError(f"{data} is not a binarised {dataset} folder (missing {missing[0]}); make it with: {ds.prepare}")
    if row.needs_syntax_hints:
        hint = f"train.hints.{ds.target}.bin" if ds.kind == "mt" else "train.hints.bin"
        if not os.path.exists(os.path.join(data, hint)):
            lang = f" --lang {ds.target}" if ds.kind == "mt" else ""
            raise RowError(f"row {row.key} needs syntax hints: {os.path.join(data, hint)} is missing; make them with "
                           f"bet-syntax-hints --trainpref TEXT/train --validpref TEXT/valid{lang} --destdir {data} "
                           "(TEXT: the BPE text folder the data was binarised from)")


def has_cuda():
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


def fairseq_command(name):
    exe = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(exe):
        return [exe]
    found = shutil.which(name)
    if found:
        return [found]
    module = {"fairseq-train": "fairseq_cli.train", "fairseq-generate": "fairseq_cli.generate",
              "fairseq-eval-lm": "fairseq_cli.eval_lm"}[name]
    return [sys.executable, "-m", module]


def build_commands(row, dataset, data, save_dir, quick=False, updates=None, extra=(), user_dir=None, cpu=None,
                   arch=None):
    """(train argv, eval argv) for one row on one dataset: the dataset's recipe, then the row's flags."""
    import bet_fairseq

    kind = R.DATASETS[dataset].kind
    user_dir = user_dir or bet_fairseq.user_dir()
    cpu = (not has_cuda()) if cpu is None else cpu
    row_train, row_eval = row.train_flags.get(kind, {}), row.eval_flags.get(kind, {})
    train = recipes.merge(recipes.train_recipe(dataset, quick, updates), row_train)
    ev = recipes.merge(recipes.eval_recipe(dataset, quick), row_eval)
    if quick and row_train.get("--sample-break-mode") == "eos":
        train["--tokens-per-sample"] = 256  # one sentence a sample: the quick 64-token blocks would drop most
    if cpu:
        train["--cpu"] = ev["--cpu"] = True
    ckpt = os.path.join(save_dir, "checkpoint_best.pt")
    arch = arch or row.archs[dataset]
    train_argv = (fairseq_command("fairseq-train") + [data, "--user-dir", user_dir, "--arch", arch,
                                                       "--save-dir", save_dir] + recipes.to_argv(train) + list(extra))
    tool = "fairseq-generate" if kind == "mt" else "fairseq-eval-lm"
    eval_argv = fairseq_command(tool) + [data, "--user-dir", user_dir, "--path", ckpt] + recipes.to_argv(ev)
    return train_argv, eval_argv


def run_logged(argv, log_path, echo=True):
    """Run argv, writing stdout+stderr to log_path (and to our stdout when echo); returns (rc, seconds)."""
    start = time.time()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1" if not has_cuda() else env.get("OMP_NUM_THREADS", "4"))
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"# {datetime.datetime.now().isoformat(timespec='seconds')} {shlex.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for line in proc.stdout:
            log.write(line)
            if echo:
                sys.stdout.write(line)
        rc = proc.wait()
    return rc, time.time() - start


_MODULES = {"fairseq-train": "fairseq_cli.train", "fairseq-generate": "fairseq_cli.generate",
            "fairseq-eval-lm": "fairseq_cli.eval_lm"}


def run_in_process(argv, log_path, echo=True):
    """Like run_logged, but calls the fairseq CLI's cli_main in this process (no start-up cost)."""
    import contextlib
    import importlib
    import logging

    tool = next((t for t in _MODULES if os.path.basename(argv[0]) == t or t in argv[:3]), None)
    args = argv[1:] if argv[0] != sys.executable else argv[3:]
    module = importlib.import_module(_MODULES[tool])
    start = time.time()
    rc = 0
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"# {datetime.datetime.now().isoformat(timespec='seconds')} {shlex.join(argv)} (in process)\n")
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                                               datefmt="%Y-%m-%d %H:%M:%S"))
        root = logging.getLogger()
        old_argv, old_level = sys.argv, root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        sys.argv = [tool, *args]
        # fairseq keeps the best validation loss seen so far on a function attribute; an earlier
        # run in this process would otherwise decide whether this one writes checkpoint_best.pt.
        from fairseq import checkpoint_utils

        if hasattr(checkpoint_utils.save_checkpoint, "best"):
            del checkpoint_utils.save_checkpoint.best
        try:
            with contextlib.redirect_stdout(log):
                module.cli_main()
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            import traceback

            traceback.print_exc(file=log)
            rc = 1
        finally:
            sys.argv = old_argv
            root.removeHandler(handler)
            root.setLevel(old_level)
    return rc, time.time() - start


def parse_bleu(text):
    m = re.search(r"BLEU4 = ([\d.]+)", text)
    return float(m.group(1)) if m else None


def detokenised(text, lang):
    """(hypotheses, references) of fairseq-generate output (H-/T- lines), Moses-detokenised, in test-set order."""
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang)
    hyps, refs = {}, {}
    for line in text.splitlines():
        m = re.match(r"^([HT])-(\d+)\t(.*)$", line)
        if not m:
            continue
        kind, idx, rest = m.groups()
        if kind == "H":
            rest = rest.split("\t", 1)[1] if "\t" in rest else ""
            hyps[int(idx)] = md.detokenize(rest.split())
        else:
            refs[int(idx)] = md.detokenize(rest.split())
    ids = sorted(set(hyps) & set(refs))
    return [hyps[i] for i in ids], [refs[i] for i in ids]


def sacrebleu_detok(text, target_lang):
    """sacreBLEU of the Moses-detokenised hypotheses (H-) against the detokenised references (T-)."""
    import sacrebleu

    hyps, refs = detokenised(text, target_lang)
    if not hyps:
        return None
    return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


def parse_eval_lm(text):
    m = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", text)
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


def last_num_updates(log_path):
    n = None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.search(r'"(?:train_|valid_)?num_updates": "?(\d+)', line)
            if m:
                n = int(m.group(1))
    return n


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="bet-run-row", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--row", help="Table 2 row key (--list shows them)")
    p.add_argument("--dataset", choices=sorted(R.DATASETS), help="dataset column")
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


def rows_of(dataset):
    return [r for r in R.ROWS if dataset in r.archs]


def from_script(parser, args):
    """``run/<dataset>.sh ROW DATA_BIN SAVE_DIR [options]``: fill --row/--data/--save-dir from the
    positionals; without them, or with a row the dataset does not have, print the script's usage and
    the dataset's rows and exit 2."""
    if args.dataset is None or args.row or args.data or args.save_dir:
        parser.error("--script goes with --dataset and ROW DATA_BIN SAVE_DIR (not --row/--data/--save-dir)")
    given, rows = args.positional, rows_of(args.dataset)
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
    ds = R.DATASETS[args.dataset]
    lines = [f"usage: {args.script} ROW DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]"]
    lines += [f"error: {problem}"] if problem else []
    lines += [f"Table 2 rows on {ds.column} ({args.dataset}):"]
    width = max(len(r.archs[args.dataset]) for r in rows)
    lines += [f"  {r.key:18s} --arch {r.archs[args.dataset]:{width}s}  {r.label}" for r in rows]
    lines += [f"DATA_BIN: {ds.prepare}",
              "bet-run-row options (--quick, --updates N, --dry-run, --force, ...): python run/table2.py --help"]
    print("\n".join(lines), file=sys.stderr)
    raise SystemExit(2)


def list_rows(dataset=None):
    for r in R.ROWS:
        for d in R.MT_DATASETS + R.LM_DATASETS:
            if d in r.archs and dataset in (None, d):
                why = availability(r, d)
                print(f"{r.key:18s} {d:14s} {r.archs[d]:32s} {'available' if why is None else 'NOT AVAILABLE'}")


def run_row(args):
    try:
        row = R.row(args.row)
    except KeyError as exc:
        raise RowError(exc.args[0])
    if args.arch:  # another row's architecture on this dataset runs that row (its settings, its result)
        row = next((r for r in R.ROWS if r.archs.get(args.dataset) == args.arch), row)
    why = availability(row, args.dataset, args.arch)
    if why:
        raise RowError(why)
    data, save_dir = os.path.abspath(args.data), os.path.abspath(args.save_dir)
    check_data(row, args.dataset, data)
    result_path = os.path.join(save_dir, "result.json")
    if os.path.exists(result_path) and not (args.force or args.eval_only or args.dry_run):
        print(f"{result_path} exists: skipping (--force to run again)")
        with open(result_path, encoding="utf-8") as f:
            return json.load(f)
    train_argv, eval_argv = build_commands(row, args.dataset, data, save_dir, args.quick, args.updates, args.extra,
                                           cpu=args.cpu, arch=args.arch)
    if args.dry_run:
        print(shlex.join(train_argv))
        print(shlex.join(eval_argv))
        return None
    os.makedirs(save_dir, exist_ok=True)
    train_log, eval_log = os.path.join(save_dir, "train.log"), os.path.join(save_dir, "eval.log")
    run = run_in_process if args.in_process else run_logged
    train_s = 0.0
    if not args.eval_only:
        rc, train_s = run(train_argv, train_log, echo=not args.quiet)
        if rc != 0:
            raise RowError(f"fairseq-train failed (exit {rc}); see {train_log}", code=rc)
    ckpt = os.path.join(save_dir, "checkpoint_best.pt")
    if not os.path.exists(ckpt):
        raise RowError(f"no checkpoint {ckpt} to evaluate")
    if os.path.exists(eval_log):
        os.remove(eval_log)
    rc, eval_s = run(eval_argv, eval_log, echo=not args.quiet)
    with open(eval_log, encoding="utf-8", errors="replace") as f:
        eval_text = f.read()
    if rc != 0:
        raise RowError(f"evaluation failed (exit {rc}); see {eval_log}", code=rc)
    ds = R.DATASETS[args.dataset]
    extra = {}
    if ds.kind == "mt":
        value = parse_bleu(eval_text)
        extra["sacrebleu_detok"] = sacrebleu_detok(eval_text, ds.target)
        extra["hypotheses"] = len(re.findall(r"^H-\d+\t", eval_text, re.M))
    else:
        loss2, ppl = parse_eval_lm(eval_text)
        value = loss2 if ds.metric == "bpc" else ppl
        extra.update(loss_base2=loss2, perplexity=ppl)
    if value is None:
        raise RowError(f"no {ds.metric} found in {eval_log}")
    result = {
        "row": row.key, "row_label": row.label, "dataset": args.dataset, "column": ds.column,
        "arch": args.arch or row.archs[args.dataset], "metric": ds.metric, "value": value,
        "paper_value": row.paper.get(args.dataset), "quick": bool(args.quick),
        "num_updates": last_num_updates(train_log) if os.path.exists(train_log) else None,
        "command": {"train": shlex.join(train_argv), "eval": shlex.join(eval_argv)},
        "wall_time_s": {"train": round(train_s, 1), "eval": round(eval_s, 1), "total": round(train_s + eval_s, 1)},
        "data": data, "checkpoint": ckpt, "train_log": train_log, "eval_log": eval_log,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }
    with atomic_write(result_path) as f:
        json.dump(result, f, indent=1)
    print(f"{row.label} on {ds.column}: {ds.metric} = {value} (paper {row.paper.get(args.dataset)}) -> {result_path}")
    return result


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        list_rows(args.dataset)
        return 0
    run_row(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
