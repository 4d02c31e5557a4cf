"""The study's run store: where a run's files are, which runs finished (and which records are damaged), the
copies of finished runs kept beside the report (the archive) and the copies of a run finished under another name
(identical runs). It reads and copies files; it trains nothing and imports nothing of the study above it.

Files of a run (``WORK/runs/DATASET/SYSTEM/seedN/``, SYSTEM the row and its setting, ``plan.Run.system``):
fairseq's checkpoints, ``train.log``, ``train.started.json``/``train.done.json`` (fairseq-train started / finished
with these settings: a restart must not train one update more from checkpoint_last.pt), ``eval.log``,
``hyp.detok.txt``/``ref.detok.txt``, the files derived from its checkpoint (``DERIVED``) and last ``run.json``,
the record and completion marker (``bet_fairseq.tools.markers``): a run with a whole one is never redone.

The archive (``OUT/runs/...``, the same layout) keeps the small files the report is made from (``KEPT``: no
checkpoints), with this machine's folders written as placeholders; committed with the report, ``restore`` puts
them back into any work folder, where the runs' markers hold (their commands are the same, whatever the folders).
The test references are not kept (they are the corpus's own text): the report reads them from the prepared data.

A run whose commands are those of a run finished under another name is copied from it (``find_twin``,
``copy_twin``), not trained again: the same commands give the same model. BET(SG)'s row at the default
pointer-loss setting and that setting's point of the lambda_p sweep are such twins. The copy's record names its
own system and says where it was copied from (``COPIED_FROM``); the report counts its time once.
"""

import json
import os
import shlex
from typing import Dict, List, Optional

import bet_fairseq
from bet_fairseq.files import atomic_write
from bet_fairseq.tools import markers
from . import commands, plan

RECORD = "run.json"  # a run's record, its completion marker
TRAIN_STARTED, TRAIN_DONE = "train.started.json", "train.done.json"
# what the study derives from a run's checkpoint_best.pt besides its test scores: Table 1, the heatmap's attention
TABLE1, ATTENTION = "table1.json", "attention.json"
DERIVED = (TABLE1, ATTENTION)
MARKED = (RECORD, TRAIN_DONE) + DERIVED  # kept files that are markers: a digest of their own
KEPT = MARKED + ("train.log", "hyp.detok.txt")
COPIED_FROM = "copied_from"  # in a copy's record: the name of the run it was copied from


# ----------------------------------------------------------------------------- a run's folder and record


def run_dir(work, run):
    """A run's folder in a work folder, and in a report's archive of kept runs (the same layout)."""
    return os.path.join(work, "runs", run.dataset, run.system, f"seed{run.seed}")


def record_path(work, run):
    return os.path.join(run_dir(work, run), RECORD)


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def damaged(work, run) -> Optional[str]:
    """Why the run's record cannot be trusted, in one line naming the file (None when it is whole or absent)."""
    return markers.problem(record_path(work, run))


def done(work, run):
    """Whether the run finished (its record exists and is whole; its settings are checked when it is executed)."""
    return os.path.exists(record_path(work, run)) and damaged(work, run) is None


def load(work, run):
    return read_json(record_path(work, run)) if done(work, run) else None


def load_current(work, run, scale):
    """The run's record when it finished with the commands this code gives it now, wherever its folders were;
    None otherwise (unfinished, or made with an older default or a smaller --max-update: the study does it
    again, the report leaves it out)."""
    record = load(work, run)
    if record is None:
        return None
    now = commands.settings(run, scale, run_dir(work, run), "DATA")[2]
    return record if commands.same_commands(record.get("settings") or {}, now) else None


def run_seconds(record):
    return sum(v for v in record["wall_time_s"].values() if v)


def is_copy(record: dict) -> bool:
    return bool(record.get(COPIED_FROM))


def forget_training(save):
    """Remove a run's checkpoints and training log (its training settings changed or its marker is damaged)."""
    for name in os.listdir(save):
        if name.startswith("checkpoint") and name.endswith(".pt") or name in ("train.log", TRAIN_DONE,
                                                                               TRAIN_STARTED):
            os.remove(os.path.join(save, name))


def forget_derived(save):
    """Remove the files derived from a run's checkpoint (it is about to change)."""
    for name in DERIVED:
        if os.path.exists(os.path.join(save, name)):
            os.remove(os.path.join(save, name))


def read_attention(run_folder: str) -> Optional[dict]:
    """The heatmap's attention kept in a run's folder (``attention.json``), when it is there and whole."""
    path = os.path.join(run_folder, ATTENTION)
    if not os.path.exists(path) or markers.problem(path) is not None:
        return None
    return read_json(path)


# ----------------------------------------------------------------------------- copies with other folders


def folder(out: str) -> str:
    """Where a report in ``out`` keeps its runs."""
    return os.path.join(out, "runs")


def places(work: str, train_command: Optional[str] = None) -> Dict[str, str]:
    """Placeholder -> folder, for the folders a run's files name: the work folder, the plugin (``--user-dir``)
    and the folder of fairseq's commands; those of ``train_command`` (a kept run's, which another checkout or
    interpreter may have made), else those this code's commands would use."""
    from bet_fairseq.tools.executor import fairseq_command

    user_dir, tool = bet_fairseq.user_dir(), fairseq_command("fairseq-train")[0]
    if train_command:
        argv = shlex.split(train_command)
        tool = argv[0]
        if "--user-dir" in argv[:-1]:
            user_dir = argv[argv.index("--user-dir") + 1]
    return {"{work}": os.path.abspath(work), "{user_dir}": user_dir, "{bin}": os.path.dirname(tool)}


def swap_folders(text: str, pairs) -> str:
    for old, new in sorted(pairs, key=lambda p: -len(p[0])):  # the longest first: one folder may hold another
        if old:  # a command found on PATH by a bare name has no folder
            text = text.replace(old, new)
    return text


def _copy(src: str, dst: str, pairs) -> None:
    """Copy one kept file with its folders swapped; a marker gets its digest again (its text changed)."""
    with open(src, encoding="utf-8") as f:
        text = swap_folders(f.read(), pairs)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.basename(src) in MARKED:
        record = json.loads(text)
        record.pop("digest", None)
        markers.write(dst, record)
        return
    if os.path.exists(dst):
        with open(dst, encoding="utf-8") as f:
            if f.read() == text:
                return
    with atomic_write(dst) as f:
        f.write(text)


def copy_kept(src: str, dst: str, pairs) -> None:
    """Copy the kept files a run's folder ``src`` has into ``dst``."""
    for name in KEPT:
        if os.path.exists(os.path.join(src, name)):
            _copy(os.path.join(src, name), os.path.join(dst, name), pairs)


# ----------------------------------------------------------------------------- the archive beside the report


def save(work: str, out: str, run: plan.Run) -> bool:
    """Keep a finished run of ``work`` in ``out``'s archive; False when it is not finished."""
    if not done(work, run):
        return False
    made_with = load(work, run)["settings"]["train"]
    copy_kept(run_dir(work, run), run_dir(out, run), [(f, name) for name, f in places(work, made_with).items()])
    return True


def holds(out: str, run: plan.Run) -> bool:
    """Whether ``out``'s archive holds ``run``, whole."""
    return done(out, run)


def restore(out: str, work: str, runs: List[plan.Run], say=print) -> List[str]:
    """Put the archived runs among ``runs`` that ``work`` has not finished into ``work``; returns their names.

    A damaged archived record is named and left out (the run is done again). A record in ``work`` that is
    damaged or was edited by hand is named and left as it is, with the run's other files: nothing is put back
    over it and nothing deleted (the user decides: put the archived copy back by deleting the record, or let the
    study evaluate the run again). An unfinished training of the same run (no record) gives way to the finished
    one: its checkpoints are removed."""
    restored = []
    pairs = list(places(work).items())
    for run in runs:
        src = run_dir(out, run)
        if not os.path.exists(record_path(out, run)):
            continue
        if os.path.exists(record_path(work, run)):
            why = damaged(work, run)
            if why is not None:
                say(f"[archive] {why}: left as it is, the run's files untouched (delete it to have the kept copy "
                    f"in {src} put back)")
            continue
        why = next((p for p in (markers.problem(os.path.join(src, n)) for n in MARKED) if p is not None), None)
        if why is not None:
            say(f"[archive] {why}: not restored, the run is done again")
            continue
        dst = run_dir(work, run)
        if os.path.isdir(dst):
            forget_training(dst)
        copy_kept(src, dst, pairs)
        restored.append(run.name)
    return restored


# ----------------------------------------------------------------------------- identical runs


def find_twin(run: plan.Run, settings: dict, work: str) -> Optional[str]:
    """The folder of a finished run of ``work`` (the same dataset and seed, another system) whose commands are
    ``settings``, folders apart (``commands.same_commands``); None when there is none."""
    systems = os.path.join(work, "runs", run.dataset)
    if not os.path.isdir(systems):
        return None
    own = run_dir(work, run)
    for system in sorted(os.listdir(systems)):
        other = os.path.join(systems, system, f"seed{run.seed}")
        marker = os.path.join(other, RECORD)
        if other == own or not os.path.exists(marker) or markers.problem(marker) is not None:
            continue
        made_with = read_json(marker).get("settings")
        if made_with is not None and commands.same_commands(made_with, settings):
            return other
    return None


def copy_twin(run: plan.Run, source: str, work: str, settings: dict) -> dict:
    """Make ``run`` a copy of the finished run in ``source`` (its kept files, folders swapped); returns the record."""
    own = run_dir(work, run)
    if os.path.isdir(own):  # a run of other settings, or an interrupted training: the twin is finished
        forget_training(own)
        for name in KEPT:  # Table 1 and the attention among them
            if os.path.exists(os.path.join(own, name)):
                os.remove(os.path.join(own, name))
    copy_kept(source, own, [(source, own)])
    record = read_json(record_path(work, run))
    record = {k: v for k, v in record.items() if k not in ("settings", "digest")}
    record.update(row=run.row, setting=run.setting, system=run.system,
                  row_label=plan.system_label(run.row, run.setting),
                  **{COPIED_FROM: os.path.relpath(source, os.path.join(work, "runs"))})
    return markers.write(record_path(work, run), record, settings)


def copies_in(runs, scale: str, finished=()) -> set:
    """The runs of ``runs`` that will be copies, not trained: each has the commands of a run before it or of one of
    the ``finished`` runs outside ``runs``."""
    first = {commands.key(r, scale) for r in finished if r not in runs}
    copies = set()
    for run in runs:
        key = commands.key(run, scale)
        if key in first:
            copies.add(run)
        first.add(key)
    return copies
