"""A run whose commands are those of a run finished under another name is copied from it, not trained again: the
same commands give the same model. BET(SG)'s row at the default pointer-loss setting and that setting's point of
the lambda_p sweep are such twins; a new default makes the row's runs the twins of another point, with nothing
renamed and nothing trained twice.

Commands are compared without their folders (``runs.without_folders``). The copy has
the kept files of a run (``archive.KEPT``: the record, training log and test hypotheses), no checkpoints; its record
names its own system and says where it was copied from (``copied_from``), and the report counts its time once.
"""

import json
import os
import shlex
from typing import Optional

from bet_fairseq.tools import markers
from . import archive
from . import plan as P
from . import runs as U

COPIED_FROM = "copied_from"  # in a copy's record: the name of the run it was copied from


def find(run: P.Run, settings: dict, work: str) -> Optional[str]:
    """The folder of a finished run of ``work`` (the same dataset and seed, another system) whose commands are
    ``settings``, folders apart (``runs.same_commands``); None when there is none."""
    systems = os.path.join(work, "runs", run.dataset)
    if not os.path.isdir(systems):
        return None
    own = U.run_dir(work, run)
    for system in sorted(os.listdir(systems)):
        other = os.path.join(systems, system, f"seed{run.seed}")
        marker = os.path.join(other, U.RECORD)
        if other == own or not os.path.exists(marker) or markers.problem(marker) is not None:
            continue
        with open(marker, encoding="utf-8") as f:
            made_with = json.load(f).get("settings")
        if made_with is not None and U.same_commands(made_with, settings):
            return other
    return None


def copy(run: P.Run, source: str, work: str, settings: dict) -> dict:
    """Make ``run`` a copy of the finished run in ``source`` (its kept files, folders swapped); returns the record."""
    own = U.run_dir(work, run)
    if os.path.isdir(own):  # a run of other settings, or an interrupted training: the twin is finished
        U.forget_training(own)
        for name in archive.KEPT:  # Table 1 and the attention among them
            if os.path.exists(os.path.join(own, name)):
                os.remove(os.path.join(own, name))
    archive.copy_kept(source, own, [(source, own)])
    with open(U.record_path(work, run), encoding="utf-8") as f:
        record = json.load(f)
    record = {k: v for k, v in record.items() if k not in ("settings", "digest")}
    record.update(row=run.row, setting=run.setting, system=run.system, row_label=P.system_label(run.row, run.setting),
                  **{COPIED_FROM: os.path.relpath(source, os.path.join(work, "runs"))})
    return markers.write(U.record_path(work, run), record, settings)


def is_copy(record: dict) -> bool:
    return bool(record.get(COPIED_FROM))


def _commands(run: P.Run, scale: str) -> tuple:
    """What ``runs.same_commands`` compares of a run, with its dataset: the key of its twins."""
    return (run.dataset, *(tuple(U.without_folders(shlex.join(argv))) for argv in U.commands(run, scale, "BIN", "RUN")))


def copies_in(runs, scale: str, finished=()) -> set:
    """The runs of ``runs`` that will be copies, not trained: each has the commands of a run before it or of one of
    the ``finished`` runs outside ``runs``."""
    first = {_commands(r, scale) for r in finished if r not in runs}
    copies = set()
    for run in runs:
        commands = _commands(run, scale)
        if commands in first:
            copies.add(run)
        first.add(commands)
    return copies
