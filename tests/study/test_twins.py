"""Identical runs (``tools/study/store.py``: find_twin, copy_twin), without fairseq: BET(SG)'s row at the default pointer-loss setting has the
commands of the default's sweep point, so a finished point is copied into the row instead of trained again; a new
default makes the row the twin of another point; a run whose commands differ is trained."""

import dataclasses
import json
import os
import shutil

import pytest

from bet_fairseq import catalog
from bet_fairseq.tools import markers
from bet_fairseq.tools.study import commands, plan, runs, store

BIN = "/data/multi30k/data-bin"
DEFAULT = (catalog.POINTER_DEFAULT["pointer_lambda"], catalog.POINTER_DEFAULT["pointer_heads"])
ROW = plan.Run("multi30k", "bet_sg", 1)


def point(lam, heads, seed=1):
    row, setting = plan.pointer_point(lam, heads)
    return plan.Run("multi30k", row, seed, setting)


def settings(run, work):
    return runs._settings(run, "cpu", str(work), BIN)[2]


def current(run, work):
    """The run's record when its marker holds with its current commands, else None."""
    return markers.read(store.record_path(str(work), run), settings(run, work), say=lambda why: None)


def finish(run, work, value):
    """A finished run as ``runs.execute`` leaves it: its record and kept files, made with its current commands."""
    folder = store.run_dir(str(work), run)
    os.makedirs(folder)
    made_with = settings(run, work)
    markers.write(os.path.join(folder, "train.done.json"), {"num_updates": 6000}, {"train": made_with["train"]})
    markers.write(os.path.join(folder, store.RECORD), {"dataset": run.dataset, "row": run.row, "setting": run.setting,
                                                   "system": run.system, "seed": run.seed, "metric": "bleu",
                                                   "value": value, "dir": folder,
                                                   "wall_time_s": {"train": 2700.0, "eval": 40.0}}, made_with)
    with open(os.path.join(folder, "hyp.detok.txt"), "w", encoding="utf-8") as f:
        f.write(f"hypothesis of {run.system}\n")
    with open(os.path.join(folder, "train.log"), "w", encoding="utf-8") as f:
        f.write(f"--save-dir {folder}\n")


@pytest.fixture
def no_training(monkeypatch):
    trained = []

    def train(job, in_process=False):
        trained.append(job.save_dir)
        raise runs.RunFailed("trained")

    monkeypatch.setattr(runs.executor, "train", train)
    return trained


def test_the_row_at_the_default_has_its_points_commands():
    # by hand: the row's command is the point's with the point's folder name replaced by the row's
    row, twin = settings(ROW, "/w"), settings(point(*DEFAULT), "/w")
    assert row != twin
    assert json.dumps(twin).replace(f"bet_sg+{plan.pointer_setting(*DEFAULT)}/", "bet_sg/") == json.dumps(row)
    lam, heads = DEFAULT
    assert f"--pointer-lambda {lam:g} --pointer-heads {heads}" in row["train"]


def test_a_finished_point_is_copied_into_the_row(tmp_path, no_training):
    finish(point(*DEFAULT), tmp_path, 40.5)
    finish(point(0.05, "mean"), tmp_path, 39.0)
    assert runs.takes_no_time(ROW, "cpu", str(tmp_path), BIN)
    record, skipped = runs.execute(ROW, "cpu", str(tmp_path), BIN)
    assert no_training == [] and skipped
    assert record["value"] == 40.5 and record["system"] == "bet_sg" and record["setting"] == ""
    assert record[store.COPIED_FROM] == point(*DEFAULT).name
    assert record["dir"] == store.run_dir(str(tmp_path), ROW) and record["wall_time_s"]["train"] == 2700.0
    assert current(ROW, tmp_path) == record  # a finished run now: its marker holds
    folder = store.run_dir(str(tmp_path), ROW)
    assert open(os.path.join(folder, "hyp.detok.txt")).read() == f"hypothesis of bet_sg+{plan.pointer_setting(*DEFAULT)}\n"
    assert open(os.path.join(folder, "train.log")).read() == f"--save-dir {folder}\n"
    done = json.load(open(os.path.join(folder, "train.done.json")))
    assert done["settings"]["train"] == settings(ROW, tmp_path)["train"]
    assert store.is_copy(record) and not store.is_copy(json.load(open(store.record_path(str(tmp_path), point(*DEFAULT)))))


def test_a_run_of_other_commands_is_trained(tmp_path, no_training):
    finish(point(0.05, "mean"), tmp_path, 39.0)
    finish(plan.Run("multi30k", "bet_sg", 2), tmp_path, 40.0)  # the row's own seed 2: another seed is no twin
    assert not runs.takes_no_time(ROW, "cpu", str(tmp_path), BIN)
    with pytest.raises(runs.RunFailed, match="trained"):
        runs.execute(ROW, "cpu", str(tmp_path), BIN)
    assert no_training == [store.run_dir(str(tmp_path), ROW)]


def test_a_new_default_makes_the_row_the_twin_of_another_point(tmp_path, no_training, monkeypatch):
    finish(point(*DEFAULT), tmp_path, 40.5)
    other = next(p for p in ((0.05, "mean"), (0.002, "first")) if p != DEFAULT)
    finish(point(*other), tmp_path, 41.3)
    runs.execute(ROW, "cpu", str(tmp_path), BIN)  # the row: a copy of the old default's point
    # the default becomes the other point: the row's commands are now that point's
    row = catalog.ROWS["bet_sg"]
    flags = {kind: dict(f, **{"--pointer-lambda": other[0], "--pointer-heads": other[1]})
             for kind, f in row.train_flags.items()}
    monkeypatch.setitem(catalog.ROWS, "bet_sg", dataclasses.replace(row, train_flags=flags))
    assert current(ROW, tmp_path) is None
    # the report leaves out the row's run of the old default (its record is still there, whole)
    assert store.done(str(tmp_path), ROW) and store.load_current(str(tmp_path), ROW, "cpu") is None
    record, _ = runs.execute(ROW, "cpu", str(tmp_path), BIN)
    assert store.load_current(str(tmp_path), ROW, "cpu") == record
    assert no_training == [] and record["value"] == 41.3 and record[store.COPIED_FROM] == point(*other).name
    # the old default's point is left as it was
    assert json.load(open(store.record_path(str(tmp_path), point(*DEFAULT))))["value"] == 40.5


def test_a_finished_run_is_current_wherever_its_folders_are(tmp_path):
    run = point(0.05, "mean")
    finish(run, tmp_path / "here", 39.0)
    shutil.copytree(tmp_path / "here", tmp_path / "moved")  # its commands name the first folder
    record = store.load_current(str(tmp_path / "moved"), run, "cpu")
    assert record is not None and record["value"] == 39.0
    # by hand: only the folders were left out of the comparison
    assert commands.without_folders("/venv/bin/fairseq-train /d/bin --user-dir /u --arch a --save-dir /w/r --seed 1") == [
        "--user-dir", "<folder>", "--arch", "a", "--save-dir", "<folder>", "--seed", "1"]
    assert store.load_current(str(tmp_path / "moved"), point(0.05, "first"), "cpu") is None  # not finished there


def test_the_plan_knows_its_copies():
    # the row's seeds 1-2 on Multi30k come after the default's point (part pointer, 2 seeds); seed 3 and the
    # language models have no twin
    assert store.copies_in(plan.plan("cpu"), "cpu") == {plan.Run("multi30k", "bet_sg", s) for s in (1, 2)}
    assert store.copies_in(plan.plan("cpu", parts=["rows"]), "cpu") == set()  # alone, the row's runs are trained
    # the row's seeds 1-2 after the default's point has finished (another invocation): copies, not trained
    finished = [point(*DEFAULT, seed) for seed in (1, 2)]
    assert store.copies_in(plan.plan("cpu", parts=["rows"]), "cpu", finished) == {plan.Run("multi30k", "bet_sg", s)
                                                                               for s in (1, 2)}
    assert store.copies_in(plan.plan("cpu", parts=["rows"]), "cpu", [point(0.05, "mean", 1)]) == set()
