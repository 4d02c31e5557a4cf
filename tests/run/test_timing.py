"""bet_fairseq.tools.timing, the benchmarks' timing: spans and totals read off a scripted clock, the alternating
order of the models, and the medians and ratios against figures worked out by hand."""

import argparse
import time

import pytest
import torch

from bet_fairseq.tools import timing


def scripted(*readings):
    """A clock that returns ``readings`` one by one (and fails the test if read once more)."""
    it = iter(readings)
    return lambda: next(it)


def test_seconds_is_the_span_of_one_call():
    calls = []
    clock = timing.Clock(now=scripted(10.0, 12.5))
    assert clock.seconds(calls.append, "x") == 2.5
    assert calls == ["x"]


def test_stopwatch_adds_its_spans_and_leaves_out_the_time_between():
    # spans 1.0-1.5 and 4.0-4.25; the 2.5 s between them is untimed work
    watch = timing.Clock(now=scripted(1.0, 1.5, 4.0, 4.25)).stopwatch()
    with watch:
        pass
    with watch:
        pass
    assert watch.seconds == 0.75


def test_stopwatch_counts_a_span_that_raises():
    watch = timing.Clock(now=scripted(0.0, 2.0)).stopwatch()
    with pytest.raises(KeyError):
        with watch:
            raise KeyError("x")
    assert watch.seconds == 2.0


def test_clocks_are_the_wall_and_the_process_cpu_time():
    assert timing.Clock("wall")._now is time.perf_counter
    assert timing.Clock("cpu")._now is time.process_time
    with pytest.raises(ValueError, match="clock 'gpu'"):
        timing.Clock("gpu")


def test_a_cuda_clock_waits_for_the_device_before_each_reading(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))
    clock = timing.Clock("wall", "cuda:0", now=lambda: events.append("read") or 0.0)
    clock.seconds(lambda: events.append("work"))
    assert events == ["sync", "read", "work", "sync", "read"]
    events.clear()
    timing.Clock("wall", "cpu", now=lambda: events.append("read") or 0.0).seconds(lambda: None)
    assert events == ["read", "read"]


def test_repeat_alternates_the_order_after_warmup_rounds_in_the_names_order():
    order, reported = [], []
    values = iter(range(100))

    def measure(name):
        order.append(name)
        return next(values)

    out = timing.repeat(["a", "b", "c"], 3, measure, warmup=1, report=lambda rep, v: reported.append((rep, v)))
    assert order == ["a", "b", "c",  # warm-up, discarded
                     "a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert out == {"a": [3, 8, 9], "b": [4, 7, 10], "c": [5, 6, 11]}
    assert reported == [(0, {"a": 3, "b": 4, "c": 5}), (1, {"a": 8, "b": 7, "c": 6}), (2, {"a": 9, "b": 10, "c": 11})]


def test_medians_and_ratios_against_hand_computed_values():
    # repetition:   1    2    3    4
    vanilla = [100.0, 80.0, 120.0, 90.0]
    bet = [95.0, 88.0, 96.0, 81.0]
    # per repetition: 0.95, 1.1, 0.8, 0.9 -> sorted 0.8, 0.9, 0.95, 1.1 -> median (0.9 + 0.95) / 2 = 0.925
    assert timing.per_rep_ratios(vanilla, bet) == pytest.approx([0.95, 1.1, 0.8, 0.9])
    assert timing.median_ratio(vanilla, bet) == pytest.approx(0.925)
    # medians: vanilla (90 + 100) / 2 = 95, BET (88 + 95) / 2 = 91.5 -> 91.5 / 95
    assert timing.ratio_of_medians(vanilla, bet) == pytest.approx(91.5 / 95)
    assert timing.medians({"vanilla": vanilla, "bet": bet, "none": []}) == {"vanilla": 95.0, "bet": 91.5}
    with pytest.raises(ValueError, match="3 and 4 repetitions"):
        timing.per_rep_ratios(vanilla[:3], bet)


def test_the_median_of_ratios_resists_a_drift_that_moves_the_ratio_of_medians():
    """The machine halves its speed after two repetitions; BET is 0.9 x vanilla within every repetition."""
    vanilla = [100.0, 100.0, 50.0, 50.0, 50.0]
    bet = [90.0, 90.0, 45.0, 45.0, 45.0]
    assert timing.median_ratio(vanilla, bet) == pytest.approx(0.9)
    vanilla_late = [100.0, 100.0, 100.0, 50.0, 50.0]  # vanilla measured before the slow-down once more
    assert timing.median_ratio(vanilla_late, bet) == pytest.approx(0.9)
    assert timing.ratio_of_medians(vanilla_late, bet) == pytest.approx(0.45)


def test_clock_option_refuses_cpu_time_on_a_gpu(capsys):
    p = argparse.ArgumentParser()
    timing.add_clock_option(p)
    timing.add_threads_option(p)
    args = p.parse_args(["--clock", "cpu"])
    assert args.threads == 0
    assert timing.clock_from_args(p, args.clock, "cpu").kind == "cpu"
    with pytest.raises(SystemExit) as exit_:
        timing.clock_from_args(p, args.clock, "cuda")
    assert exit_.value.code == 2
    assert "--clock cpu measures CPU time; use --clock wall with --device cuda" in capsys.readouterr().err


def test_set_threads_keeps_torch_s_choice_at_0():
    before = torch.get_num_threads()
    try:
        assert timing.set_threads(0) == before
        assert timing.set_threads(1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
