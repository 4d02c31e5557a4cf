"""``markers.Steps`` (data preparation's steps): which re-runs skip a finished step and which redo it."""

import hashlib
import json
import os

from bet_fairseq.tools.markers import Steps


def run_copy(steps, src, dst, calls):
    def copy():
        calls.append(src)
        with open(src, "rb") as f, open(dst, "wb") as g:
            g.write(f.read())
    return steps.run("copy", [src], [dst], copy, {"mode": "plain"})


def test_steps_skip_on_same_content_and_redo_on_change(tmp_path):
    src, dst, calls = str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), []
    with open(src, "w") as f:
        f.write("ein Haus\n")
    steps = Steps(str(tmp_path / "work"))
    assert run_copy(steps, src, dst, calls) and len(calls) == 1
    marker = json.load(open(tmp_path / "work" / ".done" / "copy.done"))
    st = os.stat(src)
    assert marker["inputs"] == [[os.path.abspath(src), st.st_size, int(st.st_mtime),
                                 hashlib.sha256(b"ein Haus\n").hexdigest()]]
    assert not run_copy(steps, src, dst, calls) and len(calls) == 1

    # a copied or restored folder: same bytes, another mtime -> still done
    os.utime(src, (st.st_atime + 1000, st.st_mtime + 1000))
    assert not run_copy(steps, src, dst, calls) and len(calls) == 1

    # same size, other bytes, another mtime -> redone
    with open(src, "w") as f:
        f.write("ein Baum\n")
    os.utime(src, (st.st_atime + 2000, st.st_mtime + 2000))
    assert run_copy(steps, src, dst, calls) and len(calls) == 2
    assert open(dst).read() == "ein Baum\n"

    # other settings, or a missing output -> redone
    assert steps.run("copy", [src], [dst], lambda: calls.append("s"), {"mode": "other"}) and calls[-1] == "s"
    os.remove(dst)
    assert run_copy(steps, src, dst, calls) and len(calls) == 4


def test_steps_marker_without_digest_is_redone_when_mtime_differs(tmp_path):
    """A marker of the earlier (path, size, mtime) format still counts while the mtime matches; it has no
    digest to prove the content, so a changed mtime redoes the step."""
    src, dst, calls = str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), []
    with open(src, "w") as f:
        f.write("x\n")
    steps = Steps(str(tmp_path / "work"))
    run_copy(steps, src, dst, calls)
    path = tmp_path / "work" / ".done" / "copy.done"
    marker = json.load(open(path))
    marker["inputs"][0] = marker["inputs"][0][:3]
    del marker["digest"]  # the earlier format had none
    json.dump(marker, open(path, "w"))
    assert not run_copy(steps, src, dst, calls) and len(calls) == 1
    st = os.stat(src)
    os.utime(src, (st.st_atime + 1000, st.st_mtime + 1000))
    assert run_copy(steps, src, dst, calls) and len(calls) == 2


def test_a_hand_edited_step_marker_is_named_and_its_step_redone(tmp_path):
    """A marker whose content no longer matches its digest (edited by hand, or cut short) is not trusted: the step
    runs again, and the line that says so names the marker."""
    src, dst, calls, said = str(tmp_path / "in.txt"), str(tmp_path / "out.txt"), [], []
    with open(src, "w") as f:
        f.write("x\n")
    steps = Steps(str(tmp_path / "work"), say=said.append)
    run_copy(steps, src, dst, calls)
    path = tmp_path / "work" / ".done" / "copy.done"
    marker = json.load(open(path))
    marker["settings"] = {"mode": "edited"}
    json.dump(marker, open(path, "w"))
    assert run_copy(steps, src, dst, calls) and len(calls) == 2
    assert any(str(path) in line and "damaged" in line for line in said), said
    assert not run_copy(steps, src, dst, calls) and len(calls) == 2  # whole again
