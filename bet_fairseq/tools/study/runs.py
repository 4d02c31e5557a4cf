"""One run of the study: fairseq-train, then fairseq-generate (BLEU, sacreBLEU, the detokenised
hypotheses for the bootstrap) or fairseq-eval-lm (perplexity), then Table 1 for the analysed rows.

Files of a run (``WORK/runs/DATASET/ROW/seedN/``): fairseq's checkpoints, ``train.log``,
``train.done.json`` (fairseq-train finished: a restart must not train one update more from
checkpoint_last.pt), ``eval.log``, ``hyp.detok.txt``/``ref.detok.txt``, ``table1.json`` and last
``run.json``, the completion marker, written atomically (``bet_fairseq/files.py``): a run with it is
never redone; one without it resumes: fairseq-train restores ``checkpoint_last.pt`` of its
``--save-dir`` by itself.
"""

import contextlib
import datetime
import itertools
import json
import logging
import os
import resource
import shlex
import signal
import subprocess
import threading
import time

from bet_fairseq import recipes
from bet_fairseq.files import atomic_write
from ..results import rows as R
from ..results import runner
from . import plan as P


class RunFailed(RuntimeError):
    pass


def run_dir(work, run):
    return os.path.join(work, "runs", run.dataset, run.row, f"seed{run.seed}")


def arch(run):
    return R.row(run.row).archs[P.DATASETS[run.dataset].recipe]


def commands(run, scale, bin_dir, save_dir, user_dir=None, cpu=True):
    """(train argv, eval argv): the dataset's recipe, the scale's overrides, the row's flags, the seed."""
    import bet_fairseq

    ds, sc, row = P.DATASETS[run.dataset], P.SCALE_TABLE[scale], R.row(run.row)
    user_dir = user_dir or bet_fairseq.user_dir()
    train = recipes.merge(recipes.train_recipe(ds.recipe), sc.train[run.dataset], row.train_flags.get(ds.kind, {}),
                          {"--seed": run.seed})
    ev = recipes.merge(recipes.eval_recipe(ds.recipe), sc.eval[run.dataset], row.eval_flags.get(ds.kind, {}))
    for flags in (train, ev):
        flags["--cpu"] = True if cpu else None
    train_argv = (runner.fairseq_command("fairseq-train") + [bin_dir, "--user-dir", user_dir, "--arch", arch(run),
                                                              "--save-dir", save_dir] + recipes.to_argv(train))
    tool = "fairseq-generate" if ds.kind == "mt" else "fairseq-eval-lm"
    eval_argv = (runner.fairseq_command(tool) + [bin_dir, "--user-dir", user_dir, "--path",
                                                 os.path.join(save_dir, "checkpoint_best.pt")] + recipes.to_argv(ev))
    return train_argv, eval_argv


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write_json(path, value):
    with atomic_write(path) as f:
        json.dump(value, f, indent=1)
        f.write("\n")


detokenised = runner.detokenised  # (hypotheses, references), Moses-detokenised


@contextlib.contextmanager
def quiet_logging():
    """No console output from the root logger for the duration (one progress line per run)."""
    root = logging.getLogger()
    handlers = root.handlers[:]
    root.handlers = []
    try:
        yield
    finally:
        root.handlers = handlers


def _child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _execute(argv, log_path, in_process):
    """(rc, wall seconds, CPU seconds of the child; None in process)."""
    if in_process:
        import bet_fairseq

        bet_fairseq.register()  # what --user-dir does in a fresh process (here the package is already imported)
        with quiet_logging():  # fairseq's log goes to the run's log file only, as in a subprocess
            rc, wall = runner.run_in_process(argv, log_path, echo=False)
        return rc, wall, None
    before = _child_cpu()
    rc, wall = run_logged(argv, log_path)
    return rc, wall, _child_cpu() - before  # approximate when several runs end at once (--jobs)


LIVE = set()  # the fairseq processes running now (stopped on Ctrl-C)
_LIVE_LOCK = threading.Lock()


def run_logged(argv, log_path):
    """``argv`` in a subprocess, its output appended to ``log_path``; returns (rc, wall seconds). An
    interruption here stops the child too (it saves nothing half-written: fairseq writes checkpoints
    under a temporary name)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    start = time.time()
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"# {datetime.datetime.now().isoformat(timespec='seconds')} {shlex.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        with _LIVE_LOCK:
            LIVE.add(proc)
        try:
            rc = proc.wait()
        except BaseException:
            stop(proc)
            raise
        finally:
            with _LIVE_LOCK:
                LIVE.discard(proc)
    return rc, time.time() - start


def stop(proc, grace=30):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_all():
    with _LIVE_LOCK:
        procs = list(LIVE)
    for proc in procs:
        stop(proc)


def table1(checkpoint, data, max_batches):
    """Table 1 statistics (the paper's definitions) of a checkpoint's decoder self-attention on ``valid``."""
    from ..analysis.attention_stats import collect_attention_stats
    from ..analysis.capture import decoder_self_attentions
    from ..analysis.loading import load_checkpoint, split_batches

    loaded = load_checkpoint(checkpoint, data, cpu=not runner.has_cuda())
    attentions = decoder_self_attentions(loaded.model)
    batches, n_split = split_batches(loaded, "valid")
    if max_batches:
        batches = itertools.islice(batches, max_batches)
    acc = collect_attention_stats(loaded.model, attentions, batches, loaded.model.decoder.padding_idx,
                                  device=loaded.device)
    return {"checkpoint": checkpoint, "split": "valid", "sentences": acc.sentences, "sentences_in_split": n_split,
            "tokens": acc.tokens, **acc.definition(), "matrices": acc.result()}


def execute(run, scale, work, bin_dir, in_process=False):
    """Do what is left of ``run``; returns its record (``run.json``) and whether it was already complete."""
    save = run_dir(work, run)
    marker = os.path.join(save, "run.json")
    if os.path.exists(marker):
        return _read_json(marker), True
    os.makedirs(save, exist_ok=True)
    ds, sc = P.DATASETS[run.dataset], P.SCALE_TABLE[scale]
    cpu = sc.device == "cpu" or not runner.has_cuda()
    train_argv, eval_argv = commands(run, scale, bin_dir, save, cpu=cpu)
    train_log, eval_log = os.path.join(save, "train.log"), os.path.join(save, "eval.log")
    trained = os.path.join(save, "train.done.json")
    if os.path.exists(trained):
        timing = _read_json(trained)
    else:
        resumed = os.path.exists(os.path.join(save, "checkpoint_last.pt"))
        rc, wall, cpu_s = _execute(train_argv, train_log, in_process)
        if rc != 0:
            raise RunFailed(f"{run.name}: fairseq-train failed (exit {rc}); see {train_log}")
        timing = {"train_wall_s": round(wall, 1), "train_cpu_s": None if cpu_s is None else round(cpu_s, 1),
                  "resumed": resumed, "num_updates": runner.last_num_updates(train_log)}
        _write_json(trained, timing)
    if os.path.exists(eval_log):
        os.remove(eval_log)
    rc, eval_wall, eval_cpu = _execute(eval_argv, eval_log, in_process)
    with open(eval_log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if rc != 0:
        raise RunFailed(f"{run.name}: evaluation failed (exit {rc}); see {eval_log}")
    metrics = {}
    if ds.kind == "mt":
        metrics["bleu"] = runner.parse_bleu(text)
        hyps, refs = detokenised(text, ds.target)
        if not hyps:
            raise RunFailed(f"{run.name}: no hypotheses in {eval_log}")
        import sacrebleu

        metrics["sacrebleu"] = round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
        metrics["sentences"] = len(hyps)
        for name, lines in (("hyp.detok.txt", hyps), ("ref.detok.txt", refs)):
            with atomic_write(os.path.join(save, name)) as f:
                f.writelines(line + "\n" for line in lines)
        value = metrics["bleu"]
    else:
        metrics["loss_base2"], metrics["ppl"] = runner.parse_eval_lm(text)
        value = metrics["ppl"]
    if value is None:
        raise RunFailed(f"{run.name}: no {ds.metric} in {eval_log}")
    analysed = None
    if run.row in P.ANALYSED and run.seed == 1 and sc.analysis_batches:
        path = os.path.join(save, "table1.json")
        if not os.path.exists(path):
            with quiet_logging():
                stats = table1(os.path.join(save, "checkpoint_best.pt"), bin_dir, sc.analysis_batches)
            _write_json(path, stats)
        analysed = path
    record = {
        "dataset": run.dataset, "row": run.row, "row_label": R.row(run.row).label, "seed": run.seed,
        "arch": arch(run), "scale": scale, "metric": ds.metric, "value": value, **metrics,
        "num_updates": timing.get("num_updates"), "resumed": timing.get("resumed"),
        "wall_time_s": {"train": timing["train_wall_s"], "eval": round(eval_wall, 1)},
        "cpu_time_s": {"train": timing.get("train_cpu_s"), "eval": None if eval_cpu is None else round(eval_cpu, 1)},
        "in_process": bool(in_process), "table1": analysed,
        "command": {"train": shlex.join(train_argv), "eval": shlex.join(eval_argv)},
        "dir": save, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    _write_json(marker, record)
    return record, False


def run_seconds(record):
    return sum(v for v in record["wall_time_s"].values() if v)


def done(work, run):
    return os.path.exists(os.path.join(run_dir(work, run), "run.json"))


def load(work, run):
    path = os.path.join(run_dir(work, run), "run.json")
    return _read_json(path) if os.path.exists(path) else None


def now():
    return time.time()
