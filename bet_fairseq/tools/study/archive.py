"""The study's finished runs kept beside its report (``OUT/runs/DATASET/SYSTEM/seedN/``), so that a study too
long for one machine's sitting goes on elsewhere: the small files the report is made from (the run's record,
its training log, its test hypotheses, Table 1, the heatmap's attention), no checkpoints, with this machine's
folders written as placeholders. Committed with the report, they are put back into any work folder by
``restore``, where the runs' markers hold (their commands are the same, whatever the folders) and the study
counts them as finished.

The test references are not kept (they are the corpus's own text): the report reads them from the prepared
data, as it does for the runs made in place.
"""

import json
import os
import shlex
from typing import Dict, List, Optional

import bet_fairseq
from bet_fairseq.files import atomic_write
from bet_fairseq.tools import markers
from . import plan as P
from . import runs as U

MARKED = (U.RECORD, "train.done.json") + U.DERIVED  # markers: a digest of their own
KEPT = MARKED + ("train.log", "hyp.detok.txt")


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


def save(work: str, out: str, run: P.Run) -> bool:
    """Keep a finished run of ``work`` in ``out``'s archive; False when it is not finished."""
    if not U.done(work, run):
        return False
    src = U.run_dir(work, run)
    dst = U.run_dir(out, run)
    with open(U.record_path(work, run), encoding="utf-8") as f:
        made_with = json.load(f)["settings"]["train"]
    copy_kept(src, dst, [(folder_, name) for name, folder_ in places(work, made_with).items()])
    return True


def holds(out: str, run: P.Run) -> bool:
    """Whether ``out``'s archive holds ``run``, whole."""
    return U.done(out, run)


def restore(out: str, work: str, runs: List[P.Run], say=print) -> List[str]:
    """Put the archived runs among ``runs`` that ``work`` has not finished into ``work``; returns their names.
    A damaged archived record is reported (naming its file) and left out; an unfinished training of the same
    run in ``work`` gives way to the finished one (its checkpoints are removed)."""
    restored = []
    pairs = list(places(work).items())
    for run in runs:
        src = U.run_dir(out, run)
        if U.done(work, run) or not os.path.exists(U.record_path(out, run)):
            continue
        why = next((p for p in (markers.problem(os.path.join(src, n)) for n in MARKED) if p is not None), None)
        if why is not None:
            say(f"[archive] {why}: not restored, the run is done again")
            continue
        dst = U.run_dir(work, run)
        if os.path.isdir(dst):
            U.forget_training(dst)
        copy_kept(src, dst, pairs)
        restored.append(run.name)
    return restored


def attention_path(run_folder: str) -> str:
    return os.path.join(run_folder, U.ATTENTION)


def read_attention(run_folder: str) -> Optional[dict]:
    """The heatmap's attention kept in a run's folder (``attention.json``), when it is there and whole."""
    path = attention_path(run_folder)
    if not os.path.exists(path) or markers.problem(path) is not None:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)
