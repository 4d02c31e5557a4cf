"""The study's kept runs (``tools/study/store.py``), without fairseq: a run made in one work folder by another
checkout and interpreter, kept beside the report with placeholders, put back into another work folder with this
code's folders; a damaged kept record is named and left out; an unfinished training gives way."""

import json
import os

from bet_fairseq.tools import markers
from bet_fairseq.tools.study import plan, store

RUN = plan.Run("multi30k", "bet_sf", 3)


def _command(tool_dir, work, user_dir):
    return (f"{tool_dir}/fairseq-train {work}/multi30k/data-bin --user-dir {user_dir} --arch bet_sf_iwslt "
            f"--save-dir {work}/runs/multi30k/bet_sf/seed3 --seed 3")


def _make_run(work, tool_dir="/elsewhere/venv/bin", user_dir="/elsewhere/checkout/bet_fairseq"):
    folder = store.run_dir(str(work), RUN)
    os.makedirs(folder)
    settings = {"train": _command(tool_dir, work, user_dir), "eval": f"{tool_dir}/fairseq-generate x"}
    markers.write(os.path.join(folder, "train.done.json"), {"num_updates": 2000}, {"train": settings["train"]})
    markers.write(os.path.join(folder, "run.json"), {"dataset": "multi30k", "row": "bet_sf", "seed": 3, "value": 1.5,
                                                     "dir": folder}, settings)
    with open(os.path.join(folder, "train.log"), "w", encoding="utf-8") as f:
        f.write(f"args: --save-dir {folder}\n")
    with open(os.path.join(folder, "hyp.detok.txt"), "w", encoding="utf-8") as f:
        f.write("a dog runs .\n")
    for name in ("checkpoint_best.pt", "ref.detok.txt"):
        open(os.path.join(folder, name), "w").close()
    return folder


def test_a_kept_run_goes_back_into_another_work_folder(tmp_path):
    first, second, out = tmp_path / "first", tmp_path / "second", str(tmp_path / "out")
    _make_run(first)
    assert store.save(str(first), out, RUN) and not store.save(str(first), out, plan.Run("multi30k", "vanilla", 1))
    kept = os.path.join(out, "runs", "multi30k", "bet_sf", "seed3")
    assert sorted(os.listdir(kept)) == ["hyp.detok.txt", "run.json", "train.done.json", "train.log"]
    record = json.load(open(os.path.join(kept, "run.json")))
    assert record["settings"]["train"] == _command("{bin}", "{work}", "{user_dir}")
    assert record["dir"] == "{work}/runs/multi30k/bet_sf/seed3" and markers.problem(os.path.join(kept, "run.json")) is None
    assert store.holds(out, RUN)

    assert store.restore(out, str(second), [RUN, plan.Run("multi30k", "vanilla", 1)]) == [RUN.name]
    assert store.done(str(second), RUN)
    here = store.places(str(second))
    back = json.load(open(os.path.join(store.run_dir(str(second), RUN), "run.json")))
    assert back["settings"]["train"] == _command(here["{bin}"], second, here["{user_dir}"])
    done = json.load(open(os.path.join(store.run_dir(str(second), RUN), "train.done.json")))
    assert done["settings"]["train"] == back["settings"]["train"] and done["num_updates"] == 2000
    assert open(os.path.join(store.run_dir(str(second), RUN), "train.log")).read() == \
        f"args: --save-dir {store.run_dir(str(second), RUN)}\n"
    assert store.restore(out, str(second), [RUN]) == []  # finished there now: left alone


def test_a_damaged_kept_record_is_named_and_left_out(tmp_path):
    out = str(tmp_path / "out")
    _make_run(tmp_path / "first")
    store.save(str(tmp_path / "first"), out, RUN)
    damaged = os.path.join(out, "runs", "multi30k", "bet_sf", "seed3", "train.done.json")
    with open(damaged, encoding="utf-8") as f:
        text = f.read().replace("2000", "1999")
    with open(damaged, "w", encoding="utf-8") as f:
        f.write(text)
    said = []
    assert store.restore(out, str(tmp_path / "second"), [RUN], say=said.append) == []
    assert len(said) == 1 and damaged in said[0] and "damaged" in said[0]
    assert not store.done(str(tmp_path / "second"), RUN)


def test_an_unfinished_training_gives_way_to_the_kept_run(tmp_path):
    out, second = str(tmp_path / "out"), tmp_path / "second"
    _make_run(tmp_path / "first")
    store.save(str(tmp_path / "first"), out, RUN)
    folder = store.run_dir(str(second), RUN)
    os.makedirs(folder)
    for name in ("checkpoint_last.pt", "checkpoint_best.pt", "train.started.json"):
        open(os.path.join(folder, name), "w").close()
    assert store.restore(out, str(second), [RUN]) == [RUN.name]
    assert sorted(os.listdir(folder)) == ["hyp.detok.txt", "run.json", "train.done.json", "train.log"]


def test_a_hand_edited_record_in_the_work_folder_is_named_and_nothing_deleted(tmp_path):
    """A run.json of the work folder edited by hand (its digest no longer matches) is neither overwritten by the
    archived copy nor taken for an unfinished training: one line names it, and every file of the run stays."""
    out, work = str(tmp_path / "out"), tmp_path / "work"
    folder = _make_run(work)
    store.save(str(work), out, RUN)
    for name in ("checkpoint_last.pt", "train.started.json"):
        open(os.path.join(folder, name), "w").close()
    record = os.path.join(folder, "run.json")
    with open(record, encoding="utf-8") as f:
        text = f.read().replace('"value": 1.5', '"value": 9.5')
    with open(record, "w", encoding="utf-8") as f:
        f.write(text)
    before = {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}
    said = []
    assert store.restore(out, str(work), [RUN], say=said.append) == []
    assert len(said) == 1 and record in said[0] and "\n" not in said[0]
    assert {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)} == before
