"""``machine.code_commit``: the commit a run or report was made by, marked uncommitted only when the code differs
(a report written into docs/results is not a change of the code)."""

import subprocess

from bet_fairseq.tools.study import machine


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_only_a_change_of_the_code_is_uncommitted(tmp_path):
    (tmp_path / "bet_fairseq").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "bet_fairseq" / "m.py").write_text("x = 1\n")
    (tmp_path / "docs" / "REPORT.md").write_text("old\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "first")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert machine.code_commit(str(tmp_path)) == head
    (tmp_path / "docs" / "REPORT.md").write_text("a new report\n")
    assert machine.code_commit(str(tmp_path)) == head
    (tmp_path / "bet_fairseq" / "m.py").write_text("x = 2\n")
    assert machine.code_commit(str(tmp_path)) == head + " + uncommitted changes"
