"""``bet-reproduce --hours``: the executor starts no run that its estimate says would end past the sitting's
budget, and scales the estimate by what the runs took. fairseq is never called: the run itself is replaced by a
stand-in that advances a fake clock, so the arithmetic below is worked by hand."""

import types

import pytest

from bet_fairseq.tools.study import archive
from bet_fairseq.tools.study import cli
from bet_fairseq.tools.study import plan as P
from bet_fairseq.tools.study import runs as U

# the cpu scale's part headline3: vanilla seed 7, bet_sf seed 7, vanilla seed 8, bet_sf seed 8; the scale's
# estimate for each is 3,250 s
RUNS = P.plan("cpu", parts=["headline3"])
TAKES = 2000.0  # what each stand-in run "takes" on the fake clock


@pytest.fixture
def fake_study(monkeypatch, tmp_path):
    clock = {"now": 0.0}
    started = []

    def execute(run, scale, work, bin_dir, in_process=False):
        started.append(run.name)
        clock["now"] += TAKES
        return {"dataset": run.dataset, "metric": "bleu", "value": 30.0,
                "wall_time_s": {"train": TAKES - 20.0, "eval": 20.0}}, False

    monkeypatch.setattr(cli, "time", types.SimpleNamespace(time=lambda: clock["now"]))
    monkeypatch.setattr(U, "execute", execute)
    monkeypatch.setattr(U, "current", lambda run, scale, work, bin_dir: False)
    monkeypatch.setattr(archive, "save", lambda work, out, run: None)

    def study(hours, runs=RUNS, history=()):
        args = cli.build_parser().parse_args(["--jobs", "1"] + ([] if hours is None else ["--hours", str(hours)]))
        cli.check_options(args)
        deadline = None if hours is None else hours * 3600
        failures, deferred = cli.execute(args, runs, str(tmp_path), {"multi30k": "BIN"}, str(tmp_path / "out"),
                                         deadline, history)
        assert failures == []
        return started, [r.name for r in deferred]

    return study


def test_without_a_budget_every_run_is_started(fake_study):
    started, deferred = fake_study(None)
    assert started == [r.name for r in RUNS] and deferred == []


def test_the_budget_scales_the_estimate_by_the_runs_measured(fake_study, capsys):
    # 1.2 h = 4,320 s. Run 1 at t=0: 0 + 3,250 (the scale's estimate) <= 4,320, started; it takes 2,000 s, so the
    # estimate becomes 3,250 x 2,000/3,250 = 2,000. Run 2 at t=2,000: 4,000 <= 4,320, started (with the unscaled
    # estimate, 5,250, it would not be). Run 3 at t=4,000: 6,000 > 4,320, left; run 4 is left after it.
    started, deferred = fake_study(1.2)
    assert started == [RUNS[0].name, RUNS[1].name]
    assert deferred == [RUNS[2].name, RUNS[3].name]
    out = capsys.readouterr().out
    assert f"{RUNS[2].name}: not started: ~0:33:20 would end past --hours 1.2" in out


def test_a_budget_shorter_than_one_run_starts_nothing(fake_study):
    # 0.9 h = 3,240 s < the first run's 3,250 s estimate
    started, deferred = fake_study(0.9)
    assert started == [] and deferred == [r.name for r in RUNS]


def test_before_any_run_here_the_estimate_reads_the_runs_finished_earlier(fake_study, capsys):
    # Two runs finished in an earlier sitting took 1,300 s each against 3,250 estimated: factor 0.4, a run is weighed
    # at 1,300 s (a smoke-scale record is not read). With 0.5 h = 1,800 s the first run starts (0 + 1,300 <= 1,800);
    # it takes 2,000 s, the factor becomes 2,000/3,250, and the second, at t=2,000, is left.
    earlier = [{"dataset": "multi30k", "scale": "cpu", "wall_time_s": {"train": 1280.0, "eval": 20.0}}] * 2
    other_scale = [{"dataset": "multi30k", "scale": "smoke", "wall_time_s": {"train": 100000.0}}]
    started, deferred = fake_study(0.5, RUNS[:2], earlier + other_scale)
    assert started == [RUNS[0].name] and deferred == [RUNS[1].name]
    assert f"{RUNS[1].name}: not started: ~0:33:20 would end past --hours 0.5" in capsys.readouterr().out


@pytest.mark.parametrize("hours", ["0", "-1", "nan", "inf"])
def test_a_budget_must_be_a_positive_number(hours, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--hours", hours, "--dry-run"])
    assert exc.value.code == 2 and "--hours" in capsys.readouterr().err

