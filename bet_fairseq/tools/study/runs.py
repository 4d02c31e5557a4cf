"""One run of the study: fairseq-train, then fairseq-generate (BLEU, sacreBLEU, the detokenised hypotheses for the
bootstrap) or fairseq-eval-lm (perplexity), then the files derived from its checkpoint (``derived``), then its
record (``run.json``, written last: ``store`` says where each file is and when a run counts as finished).

A run without a whole record resumes: fairseq-train restores ``checkpoint_last.pt`` of its ``--save-dir`` by
itself, and ``train.done.json`` keeps a finished training from training one update more.
"""

import datetime
import os

from bet_fairseq.files import atomic_write
from bet_fairseq.tools import executor, markers
from bet_fairseq.tools.executor import RunFailed
from . import commands, derived, machine, plan, store


def _say(message):
    print(f"[study] {message}\n", end="", flush=True)  # one write: the jobs' threads print side by side


def _settings(run, scale, work, bin_dir):
    return commands.settings(run, scale, store.run_dir(work, run), bin_dir)


def takes_no_time(run, scale, work, bin_dir):
    """Whether ``execute`` would train nothing: the run finished with the commands it would run now (its record
    is read), or a finished run of another name has them (it is copied: ``store.find_twin``)."""
    settings = _settings(run, scale, work, bin_dir)[2]
    marker = store.record_path(work, run)
    return (os.path.exists(marker) and markers.problem(marker, settings) is None
            or store.find_twin(run, settings, work) is not None)


def execute(run, scale, work, bin_dir, in_process=False):
    """Do what is left of ``run``; returns its record (``run.json``) and whether it was already complete.

    Each step's marker holds the settings it was made with (the commands): a marker made with other
    settings, or a damaged one, is reported and its step redone (training from scratch when its settings
    changed: the old checkpoints are removed, else fairseq-train would resume from them)."""
    save = store.run_dir(work, run)
    the_job, train_settings, settings = _settings(run, scale, work, bin_dir)
    marker = store.record_path(work, run)
    record = markers.read(marker, settings, say=_say)
    if record is not None:
        if os.path.exists(the_job.checkpoint_path):  # a run finished before its derived files were made with it
            derived.make(run, scale, save, the_job.checkpoint_path, bin_dir)
        return record, True
    twin = store.find_twin(run, settings, work)
    if twin is not None:
        _say(f"{run.name}: {os.path.relpath(twin, os.path.join(work, 'runs'))} has the same commands: copied, "
             "not trained again")
        return store.copy_twin(run, twin, work, settings), True
    os.makedirs(save, exist_ok=True)
    timing = _train(run, the_job, save, train_settings, in_process)
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
    analysed = derived.make(run, scale, save, the_job.checkpoint_path, bin_dir)
    record = {
        "dataset": run.dataset, "row": run.row, "setting": run.setting, "system": run.system,
        "row_label": plan.system_label(run.row, run.setting), "seed": run.seed,
        "arch": commands.arch(run), "scale": scale, "metric": ds.metric, "value": scored["value"], **metrics,
        "num_updates": timing.get("num_updates"), "resumed": timing.get("resumed"),
        "wall_time_s": {"train": timing["train_wall_s"], "eval": scored["eval_wall_s"]},
        "cpu_time_s": {"train": timing.get("train_cpu_s"), "eval": scored["eval_cpu_s"]},
        "in_process": bool(in_process), "machine": machine.machine_name(), "table1": analysed,
        "command": settings, "code": machine.code_commit(),
        "dir": save, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return markers.write(marker, record, settings), False


def _train(run, the_job, save, train_settings, in_process):
    """fairseq-train, unless ``train.done.json`` says it finished with these settings; returns its timing."""
    started, trained = os.path.join(save, store.TRAIN_STARTED), os.path.join(save, store.TRAIN_DONE)
    timing = markers.read(trained, train_settings, say=_say)
    if timing is not None:
        return timing
    earlier = {}  # the timing of the training this one goes on from
    if markers.problem(started, train_settings) is None and os.path.exists(started):
        earlier = store.read_json(started).get("earlier") or {}  # an interrupted one, with these settings
    elif os.path.exists(trained) or os.path.exists(started):
        before = _whole_training(started, trained)
        if before is not None and commands.extends(before[0], train_settings["train"]):
            _say(f"{run.name}: going on from checkpoint_last.pt to the larger --max-update")
            earlier = before[1]
            if os.path.exists(trained):
                os.remove(trained)
        else:
            _say(f"{run.name}: training again from scratch")
            store.forget_training(save)
    store.forget_derived(save)  # made from the checkpoint about to change
    markers.write(started, {"earlier": earlier}, train_settings)  # resumes only with these settings
    return markers.write(trained, _after(earlier, executor.train(the_job, in_process)), train_settings)


def _whole_training(started, trained):
    """(train command, timing so far) of the training kept in a run's folder when its marker is whole: the
    finished one (``train.done.json``), else the started one; None when neither can be trusted."""
    for path in (trained, started):
        if os.path.exists(path) and markers.problem(path) is None:
            record = store.read_json(path)
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
