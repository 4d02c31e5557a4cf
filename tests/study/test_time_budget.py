"""``bet-reproduce --hours``: the executor starts no run that its estimate says would end past the sitting's
budget, and scales the estimate by what the runs took. fairseq is never called: the run itself is replaced by a
stand-in that advances a fake clock, so the arithmetic below is worked by hand."""

import dataclasses
import json
import threading
import types

import pytest

from bet_fairseq.tools.study import cli, plan, runs, scheduler, store

# the cpu scale's part headline3: vanilla seed 7, bet_sf seed 7, vanilla seed 8, bet_sf seed 8
RUNS = plan.plan("cpu", parts=["headline3"])
TAKES = 2000.0  # what each stand-in run "takes" on the fake clock


LM_RUNS = plan.plan("cpu", parts=["lm"])
# the estimates the arithmetic below is worked with, in place of the scale's measured ones (which move): 3,250 s a
# translation run, 1,900 s a language model, 1,350 s to prepare WikiText-2
ESTIMATES = {"seconds_per_run": {"mt": 3250.0, "lm": 1900.0}, "seconds_prepare": {"mt": 250.0, "lm": 1350.0}}
PREPARING = {"multi30k": 0.0, "wikitext2": 1300.0}  # what the stand-in preparation "takes"


@pytest.fixture
def fake_study(monkeypatch, tmp_path):
    clock = {"now": 0.0}
    started, events, done, preparing = [], [], set(), dict(PREPARING)

    def execute(run, scale, work, bin_dir, in_process=False):
        assert bin_dir == f"BIN-{run.dataset}"
        started.append(run.name)
        events.append(run.name)
        clock["now"] += TAKES
        return {"dataset": run.dataset, "metric": "bleu", "value": 30.0,
                "wall_time_s": {"train": TAKES - 20.0, "eval": 20.0}}, False

    def prepare_dataset(args, dataset, work, hints):
        events.append(f"prepare {dataset} in {threading.current_thread().name}")
        clock["now"] += preparing[dataset]
        return f"BIN-{dataset}"

    monkeypatch.setitem(plan.SCALE_TABLE, "cpu", dataclasses.replace(plan.SCALE_TABLE["cpu"], **ESTIMATES))
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(time=lambda: clock["now"]))
    monkeypatch.setattr(scheduler, "time", types.SimpleNamespace(time=lambda: clock["now"]))
    monkeypatch.setattr(cli, "_prepare_dataset", prepare_dataset)
    monkeypatch.setattr(runs, "execute", execute)
    monkeypatch.setattr(runs, "takes_no_time", lambda run, scale, work, bin_dir: False)
    monkeypatch.setattr(store, "done", lambda work, run: run.name in done)
    monkeypatch.setattr(store, "save", lambda work, out, run: None)
    # Multi30k was prepared in an earlier sitting: its preparation is weighed at 0 s
    (tmp_path / cli.PREPARE_RECORD).write_text(json.dumps({"multi30k": 250.0}))

    def study(hours, runs=RUNS, history=(), jobs=1):
        args = cli.build_parser().parse_args([f"--jobs={jobs}"] + ([] if hours is None else ["--hours", str(hours)]))
        cli.check_options(args)
        deadline = None if hours is None else hours * 3600
        datasets = cli.Datasets(args, runs, str(tmp_path))
        failures, deferred = scheduler.Scheduler("cpu", str(tmp_path), str(tmp_path / "out"), datasets,
                                                 jobs=args.jobs, deadline=deadline, hours=args.hours,
                                                 history=history).run(runs)
        assert failures == []
        return started, [r.name for r in deferred]

    study.events, study.done, study.work, study.preparing = events, done, tmp_path, preparing
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
    assert cli.main(["--hours", hours, "--dry-run"]) == 2
    assert "--hours" in capsys.readouterr().err



def test_a_dataset_is_prepared_just_before_its_first_run(fake_study):
    started, deferred = fake_study(None, RUNS[:2] + LM_RUNS[:1])
    main = threading.main_thread().name
    assert fake_study.events == [f"prepare multi30k in {main}", RUNS[0].name, RUNS[1].name,
                                 f"prepare wikitext2 in {main}", LM_RUNS[0].name]


def test_two_jobs_prepare_the_data_in_the_main_thread(fake_study):
    # Ctrl-C reaches only the main thread: a preparation in a job's thread (spaCy's parse, minutes) would outlast it
    runs = RUNS + LM_RUNS[:3]
    started, deferred = fake_study(None, runs, jobs=2)
    assert sorted(started) == sorted(r.name for r in runs) and deferred == []
    preparations = [e for e in fake_study.events if e.startswith("prepare")]
    main = threading.main_thread().name
    assert preparations == [f"prepare multi30k in {main}", f"prepare wikitext2 in {main}"]


def test_no_time_is_spent_preparing_data_for_runs_left_for_later(fake_study, capsys):
    # 1.5 h = 5,400 s. The two translation runs end at t=4,000 and make the estimate 2,000/3,250 of the scale's. The
    # language model's first run would need WikiText-2 first: 1,350 + 1,900 x 2,000/3,250 = 2,519 s, ending at 6,519:
    # it is left, and WikiText-2 is not prepared (no time is spent on data for a run left for later).
    started, deferred = fake_study(1.5, RUNS[:2] + LM_RUNS[:2])
    assert started == [RUNS[0].name, RUNS[1].name] and deferred == [LM_RUNS[0].name, LM_RUNS[1].name]
    assert not any("wikitext2" in e for e in fake_study.events)
    assert f"{LM_RUNS[0].name}: not started: ~0:41:59 with its data's preparation would end past --hours 1.5" \
        in capsys.readouterr().out


def test_a_dataset_prepared_in_an_earlier_sitting_costs_no_time(fake_study):
    # as above, but WikiText-2's steps finished before: 4,000 + 1,169 = 5,169 <= 5,400, the run starts
    (fake_study.work / cli.PREPARE_RECORD).write_text(json.dumps({"multi30k": 250.0, "wikitext2": 1300.0}))
    fake_study.preparing["wikitext2"] = 0.0  # its steps are skipped
    started, deferred = fake_study(1.5, RUNS[:2] + LM_RUNS[:2])
    assert started == [RUNS[0].name, RUNS[1].name, LM_RUNS[0].name] and deferred == [LM_RUNS[1].name]


def test_a_finished_run_is_not_worth_preparing_its_data_past_the_budget(fake_study, capsys):
    # 1.4 h = 5,040 s. At t=4,000 the first language model (finished earlier) would need WikiText-2's 1,350 s only:
    # 5,350 > 5,040, so it is counted as finished and its data left unprepared; the second, unfinished, is left.
    fake_study.done.add(LM_RUNS[0].name)
    started, deferred = fake_study(1.4, RUNS[:2] + LM_RUNS[:2])
    assert started == [RUNS[0].name, RUNS[1].name] and deferred == [LM_RUNS[1].name]
    assert not any("wikitext2" in e for e in fake_study.events)
    assert f"{LM_RUNS[0].name}: finished earlier (not checked" in capsys.readouterr().out
