"""Tools with an output folder check it can be written before any work, so that an unwritable folder costs
a second, not the runs or the whole split read before the first write."""

import pytest

from bet_fairseq.tools.analysis import cli as analyze
from bet_fairseq.tools.results import table
from bet_fairseq.tools.study import cli as reproduce


@pytest.fixture
def blocker(tmp_path):
    """A plain file: a folder 'under' it can never be created (a real failure, also for root)."""
    path = tmp_path / "a-file"
    path.write_text("x")
    return path


def test_bet_reproduce_checks_out_before_any_run(tmp_path, blocker, capsys, monkeypatch):
    monkeypatch.setattr(reproduce, "_prepare_dataset", lambda *a: pytest.fail("data prepared before --out was checked"))
    status = reproduce.main(["--scale", "smoke", "--out", str(blocker / "report"), "--work-dir", str(tmp_path / "w")])
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"bet-reproduce: error: --out {blocker / 'report'}: would be under the file {blocker}, not a "
                   "folder: choose another --out")


@pytest.mark.parametrize("argv", [
    ["stats", "missing.pt", "--data", "d", "--out", "{blocker}/stats"],
    ["heatmap", "missing.pt", "--data", "d", "--index", "0", "--out-dir", "{blocker}/pictures"],
    ["bars", "s.json", "--out", "{blocker}/bars.png"],
], ids=["stats", "heatmap", "bars"])
def test_bet_analyze_checks_its_output_before_loading(blocker, capsys, argv):
    assert analyze.main([a.replace("{blocker}", str(blocker)) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "would be under the file" in err and "missing.pt" not in err and len(err.splitlines()) == 1


def test_bet_results_checks_its_outputs_before_reading(blocker, capsys, tmp_path):
    assert table.main([str(tmp_path), "-o", str(blocker / "table2.md")]) == 2
    assert capsys.readouterr().err.startswith(f"bet-results: error: -o {blocker / 'table2.md'}: would be under")
