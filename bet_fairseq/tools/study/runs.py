"""One run of the study: fairseq-train, then fairseq-generate (BLEU, sacreBLEU, the detokenised
hypotheses for the bootstrap) or fairseq-eval-lm (perplexity), then Table 1 for the analysed rows.

Files of a run (``WORK/runs/DATASET/SYSTEM/seedN/``, SYSTEM the row and its setting, ``plan.Run.system``): fairseq's checkpoints, ``train.log``,
``train.done.json`` (fairseq-train finished: a restart must not train one update more from
checkpoint_last.pt), ``eval.log``, ``hyp.detok.txt``/``ref.detok.txt``, ``table1.json`` and last
``run.json``, the completion marker, written atomically (``bet_fairseq/files.py``): a run with it is
never redone; one without it resumes: fairseq-train restores ``checkpoint_last.pt`` of its
``--save-dir`` by itself.
"""

import datetime
import itertools
import json
import os
import shlex

from bet_fairseq import catalog, recipes
from bet_fairseq.files import atomic_write
from bet_fairseq.tools import executor, markers
from bet_fairseq.tools.executor import RunFailed, quiet_logging, stop_all  # noqa: F401  (the study's CLI uses them)
from . import plan as P


def run_dir(work, run):
    """A run's folder in a work folder, and in a report's archive of kept runs (the same layout)."""
    return os.path.join(work, "runs", run.dataset, run.system, f"seed{run.seed}")


RECORD = "run.json"  # a run's record, its completion marker


def record_path(work, run):
    return os.path.join(run_dir(work, run), RECORD)


def arch(run):
    return catalog.row(run.row).arch(run.dataset)


def job(run, scale, bin_dir, save_dir, cpu=True) -> executor.Job:
    """The dataset's recipe, the scale's overrides for its kind, the row's flags, the run's setting, the seed
    (and the criterion the output layer needs: ``recipes.for_softmax``)."""
    ds, sc, row = catalog.dataset(run.dataset), P.SCALE_TABLE[scale], catalog.row(run.row)
    train = recipes.for_softmax(recipes.merge(recipes.train_recipe(ds.key), sc.train[ds.kind],
                                              row.train_flags.get(ds.kind, {}), run.flags, {"--seed": run.seed}))
    ev = recipes.merge(recipes.eval_recipe(ds.key), sc.eval[ds.kind], row.eval_flags.get(ds.kind, {}))
    return executor.Job(arch(run), bin_dir, save_dir, ds, train, ev, cpu=cpu)


def commands(run, scale, bin_dir, save_dir, cpu=True):
    """(train argv, eval argv) of a run."""
    return job(run, scale, bin_dir, save_dir, cpu).commands()


# what the study derives from a run's checkpoint_best.pt besides its test scores: Table 1, the heatmap's attention
TABLE1, ATTENTION = "table1.json", "attention.json"
DERIVED = (TABLE1, ATTENTION)


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def table1(checkpoint, data, max_batches):
    """Table 1 statistics (the paper's definitions) of a checkpoint's decoder self-attention on ``valid``."""
    from bet_fairseq.attention.capture import decoder_self_attentions
    from ..analysis.attention_stats import collect_attention_stats
    from ..analysis.loading import load_checkpoint, split_batches

    loaded = load_checkpoint(checkpoint, data, cpu=not executor.has_cuda())
    attentions = decoder_self_attentions(loaded.model, convert=True)
    batches, n_split = split_batches(loaded, "valid")
    if max_batches:
        batches = itertools.islice(batches, max_batches)
    acc = collect_attention_stats(loaded.model, attentions, batches, loaded.model.decoder.padding_idx,
                                  device=loaded.device)
    return {"checkpoint": checkpoint, "split": "valid", "sentences": acc.sentences, "sentences_in_split": n_split,
            "tokens": acc.tokens, **acc.definition(), "matrices": acc.result()}


def _say(message):
    print(f"[study] {message}\n", end="", flush=True)  # one write: the jobs' threads print side by side


def _settings(run, scale, work, bin_dir):
    """(job, training settings, run settings): what a run's markers must hold to count."""
    the_job = job(run, scale, bin_dir, run_dir(work, run),
                  cpu=P.SCALE_TABLE[scale].device == "cpu" or not executor.has_cuda())
    train_argv, eval_argv = the_job.commands()
    train_settings = {"train": shlex.join(train_argv)}
    return the_job, train_settings, {**train_settings, "eval": shlex.join(eval_argv)}


def takes_no_time(run, scale, work, bin_dir):
    """Whether ``execute`` would train nothing: the run finished with the commands it would run now (its record
    is read), or a finished run of another name has them (it is copied: ``twins``)."""
    from . import twins

    settings = _settings(run, scale, work, bin_dir)[2]
    marker = record_path(work, run)
    return (os.path.exists(marker) and markers.problem(marker, settings) is None
            or twins.find(run, settings, work) is not None)


def execute(run, scale, work, bin_dir, in_process=False):
    """Do what is left of ``run``; returns its record (``run.json``) and whether it was already complete.

    Each step's marker holds the settings it was made with (the commands): a marker made with other
    settings, or a damaged one, is reported and its step redone (training from scratch when its settings
    changed: the old checkpoints are removed, else fairseq-train would resume from them)."""
    save = run_dir(work, run)
    sc = P.SCALE_TABLE[scale]
    the_job, train_settings, settings = _settings(run, scale, work, bin_dir)
    marker = record_path(work, run)
    record = markers.read(marker, settings, say=_say)
    if record is not None:
        return record, True
    from . import twins

    twin = twins.find(run, settings, work)
    if twin is not None:
        _say(f"{run.name}: {os.path.relpath(twin, os.path.join(work, 'runs'))} has the same commands: copied, "
             "not trained again")
        return twins.copy(run, twin, work, settings), True
    os.makedirs(save, exist_ok=True)
    started, trained = os.path.join(save, "train.started.json"), os.path.join(save, "train.done.json")
    timing = markers.read(trained, train_settings, say=_say)
    if timing is None:
        earlier = {}  # the timing of the training this one goes on from
        if markers.problem(started, train_settings) is None and os.path.exists(started):
            earlier = _read_json(started).get("earlier") or {}  # an interrupted one, with these settings
        elif os.path.exists(trained) or os.path.exists(started):
            before = _whole_training(started, trained)
            if before is not None and extends(before[0], train_settings["train"]):
                _say(f"{run.name}: going on from checkpoint_last.pt to the larger --max-update")
                earlier = before[1]
                if os.path.exists(trained):
                    os.remove(trained)
            else:
                _say(f"{run.name}: training again from scratch")
                forget_training(save)
        for name in DERIVED:  # made from the checkpoint about to change
            if os.path.exists(os.path.join(save, name)):
                os.remove(os.path.join(save, name))
        markers.write(started, {"earlier": earlier}, train_settings)  # resumes only with these settings
        timing = markers.write(trained, _after(earlier, executor.train(the_job, in_process)), train_settings)
    scored = executor.evaluate(the_job, in_process)
    ds = the_job.dataset
    metrics = {k: v for k, v in scored.items() if k not in ("hypotheses", "references", "value")
               and not k.startswith("eval_")}
    if ds.kind == "mt":
        if not scored["hypotheses"]:
            raise RunFailed(f"{run.name}: no hypotheses in {os.path.join(save, 'eval.log')}")
        for name, lines in (("hyp.detok.txt", scored["hypotheses"]), ("ref.detok.txt", scored["references"])):
            with atomic_write(os.path.join(save, name)) as f:
                f.writelines(line + "\n" for line in lines)
    analysed = None
    if run.row in P.ANALYSED and not run.setting and run.seed == 1 and sc.analysis_batches:
        path = os.path.join(save, TABLE1)
        if not os.path.exists(path):
            with quiet_logging():
                stats = table1(the_job.checkpoint_path, bin_dir, sc.analysis_batches)
            markers.write(path, stats)
        analysed = path
    record = {
        "dataset": run.dataset, "row": run.row, "setting": run.setting, "system": run.system,
        "row_label": P.system_label(run.row, run.setting), "seed": run.seed,
        "arch": arch(run), "scale": scale, "metric": ds.metric, "value": scored["value"], **metrics,
        "num_updates": timing.get("num_updates"), "resumed": timing.get("resumed"),
        "wall_time_s": {"train": timing["train_wall_s"], "eval": scored["eval_wall_s"]},
        "cpu_time_s": {"train": timing.get("train_cpu_s"), "eval": scored["eval_cpu_s"]},
        "in_process": bool(in_process), "machine": machine_name(), "table1": analysed, "command": settings,
        "code": code_commit(),
        "dir": save, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return markers.write(marker, record, settings), False


def extends(before: str, after: str) -> bool:
    """Whether the training command ``after`` is ``before`` with a larger ``--max-update`` and nothing else changed:
    fairseq-train then goes on from ``before``'s checkpoint_last.pt to the same model a run trained to the larger
    number from the start would be (the learning-rate schedule depends on the update number only, the batches
    come in the same order and the dropout seed is the seed plus the update number)."""
    a, b = shlex.split(before), shlex.split(after)
    if len(a) != len(b) or "--max-update" not in a[:-1] or "--max-update" not in b[:-1]:
        return False
    i, j = a.index("--max-update") + 1, b.index("--max-update") + 1
    try:
        larger = int(b[j]) > int(a[i])
    except ValueError:
        return False
    return larger and i == j and a[:i] + a[i + 1:] == b[:j] + b[j + 1:]


def _whole_training(started, trained):
    """(train command, timing so far) of the training kept in a run's folder when its marker is whole: the
    finished one (``train.done.json``), else the started one; None when neither can be trusted."""
    for path in (trained, started):
        if os.path.exists(path) and markers.problem(path) is None:
            record = _read_json(path)
            command = (record.get("settings") or {}).get("train")
            if command is None:
                return None
            timing = record.get("earlier") or {} if path == started else {
                k: v for k, v in record.items() if k not in ("settings", "digest")}
            return command, timing
    return None


def _after(earlier, timing):
    """The timing of a training that went on from ``earlier``'s: times summed, marked resumed."""
    if not earlier:
        return timing
    total = dict(timing, resumed=True)
    for key in ("train_wall_s", "train_cpu_s"):
        total[key] = None if earlier.get(key) is None or timing.get(key) is None else round(
            earlier[key] + timing[key], 1)
    return total


def forget_training(save):
    """Remove a run's checkpoints and training log (its training settings changed or its marker is damaged)."""
    for name in os.listdir(save):
        if name.startswith("checkpoint") and name.endswith(".pt") or name in ("train.log", "train.done.json",
                                                                               "train.started.json"):
            os.remove(os.path.join(save, name))


# what "the code" of a commit is: a report or kept runs written into docs/results do not make it uncommitted
CODE = ("bet_fairseq", "preprocess", "setup.py", "pyproject.toml")


def code_commit(root=None):
    """The git commit of the code running the study (with "+ uncommitted changes" when ``CODE`` differs from it),
    or None."""
    import subprocess

    root = root or os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", *CODE],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (commit + (" + uncommitted changes" if dirty else "")) if commit else None


def processor():
    """The CPU's model name (``/proc/cpuinfo``, else what ``platform`` says)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor()


def gpu_name():
    """The first GPU's name, or None (none, or a CUDA that answers is_available but not the name)."""
    if not executor.has_cuda():
        return None
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # pragma: no cover
        return None


def machine_name():
    """This machine in a few words, kept in each run's record: a study spans sittings, and their machines differ."""
    gpu = gpu_name()
    return f"{processor()}, {os.cpu_count()} CPUs" + (f", GPU {gpu}" if gpu else "")


def run_seconds(record):
    return sum(v for v in record["wall_time_s"].values() if v)


def done(work, run):
    """Whether the run finished (its marker exists and is whole; its settings are checked when it is executed)."""
    path = record_path(work, run)
    return os.path.exists(path) and markers.problem(path) is None


def load(work, run):
    return _read_json(record_path(work, run)) if done(work, run) else None


FOLDER_FLAGS = ("--user-dir", "--save-dir", "--path")


def without_folders(command: str) -> list:
    """A run's command as what it does, not where: the program and the data (before ``--user-dir``) and the
    values of ``FOLDER_FLAGS`` left out (a work folder moved or put back from the archive holds the same runs)."""
    argv = shlex.split(command)
    argv = argv[argv.index("--user-dir"):] if "--user-dir" in argv else argv
    return ["<folder>" if i and argv[i - 1] in FOLDER_FLAGS else a for i, a in enumerate(argv)]


def same_commands(made: dict, now: dict) -> bool:
    """Whether two runs' settings (``{"train": command, "eval": command}``) are the same commands, folders apart."""
    return set(made) == set(now) and all(without_folders(made[k]) == without_folders(now[k]) for k in now)


def load_current(work, run, scale):
    """The run's record when it finished with the commands this code gives it now, wherever its folders were;
    None otherwise (unfinished, or made with an older default or a smaller --max-update: ``execute`` does it
    again, the report leaves it out)."""
    record = load(work, run)
    if record is None:
        return None
    return record if same_commands(record.get("settings") or {}, _settings(run, scale, work, "DATA")[2]) else None
