"""How the benchmarks in ``run/`` time things: one clock, the compared models measured in alternating order
repetition by repetition, and the figures drawn from those repetitions (medians, per-repetition ratios).

- The clock is the wall clock (``time.perf_counter``: what fairseq reports) or this process's CPU time over all its
  threads (``time.process_time``, ``--clock cpu``): other jobs on a shared machine do not add to it, though they
  still slow it through shared caches and memory bandwidth. On a CUDA device every reading first waits for the
  queued kernels, so that a timed span holds the GPU work launched inside it.
- The order of the models is reversed every other repetition (``alternate``): on a machine whose speed drifts, a
  fixed order would give one model the later slot every time.
- The median of the per-repetition ratios (``median_ratio``): the two figures of one repetition ran back to back
  under the same load, so their ratio is steadier than the ratio of two medians taken at different moments.

Imports torch only to synchronise a CUDA device or set the thread count.
"""

import argparse
import statistics
import time
from typing import Callable, Dict, Hashable, List, Mapping, Optional, Sequence, TypeVar

CLOCKS: Dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}

Name = TypeVar("Name", bound=Hashable)
Value = TypeVar("Value")


class Clock:
    """Seconds on the ``kind`` clock (``CLOCKS``), read after the queued CUDA kernels of ``device`` finished.
    ``now`` replaces the clock itself (tests)."""

    def __init__(self, kind: str = "wall", device="cpu", now: Optional[Callable[[], float]] = None):
        if kind not in CLOCKS:
            raise ValueError(f"clock {kind!r}: choose from {sorted(CLOCKS)}")
        self.kind = kind
        self.cuda = str(device).startswith("cuda")
        self._now = now or CLOCKS[kind]

    def read(self) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return self._now()

    def seconds(self, fn: Callable, *args, **kwargs) -> float:
        """The time one call of ``fn(*args, **kwargs)`` takes."""
        start = self.read()
        fn(*args, **kwargs)
        return self.read() - start

    def stopwatch(self) -> "Stopwatch":
        return Stopwatch(self)


class Stopwatch:
    """The total time spent inside the ``with`` blocks it times: the timed part of a measurement that also does
    untimed work between them (building a generator, feeding a prompt)."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.seconds = 0.0
        self._start: Optional[float] = None

    def __enter__(self) -> "Stopwatch":
        self._start = self.clock.read()
        return self

    def __exit__(self, *exc) -> bool:
        self.seconds += self.clock.read() - self._start
        self._start = None
        return False


def alternate(names: Sequence[Name], rep: int) -> List[Name]:
    """``names`` in their order on even repetitions, reversed on odd ones."""
    names = list(names)
    return names if rep % 2 == 0 else names[::-1]


def repeat(names: Sequence[Name], reps: int, measure: Callable[[Name], Value], warmup: int = 0,
           report: Optional[Callable[[int, Dict[Name, Value]], None]] = None) -> Dict[Name, List[Value]]:
    """``measure(name)`` for every name in each of ``reps`` repetitions, in ``alternate``'s order, after ``warmup``
    untimed rounds in the names' order; ``report(rep, {name: this repetition's value})`` after each repetition.
    Returns every name's values in the order they were measured."""
    for _ in range(warmup):
        for name in names:
            measure(name)
    values: Dict[Name, List[Value]] = {name: [] for name in names}
    for rep in range(reps):
        for name in alternate(names, rep):
            values[name].append(measure(name))
        if report is not None:
            report(rep, {name: values[name][-1] for name in names})
    return values


def medians(series: Mapping[Name, Sequence[float]]) -> Dict[Name, float]:
    """The median of every non-empty series."""
    return {name: statistics.median(values) for name, values in series.items() if len(values)}


def per_rep_ratios(base: Sequence[float], other: Sequence[float]) -> List[float]:
    """``other / base`` of each repetition (the two series measured in the same repetitions)."""
    if len(base) != len(other):
        raise ValueError(f"per-repetition ratios of series of {len(base)} and {len(other)} repetitions")
    return [o / b for b, o in zip(base, other)]


def median_ratio(base: Sequence[float], other: Sequence[float]) -> float:
    """The median of the per-repetition ratios ``other / base``."""
    return statistics.median(per_rep_ratios(base, other))


def ratio_of_medians(base: Sequence[float], other: Sequence[float]) -> float:
    return statistics.median(other) / statistics.median(base)


def set_threads(threads: int) -> int:
    """Use ``threads`` torch threads (0: torch's choice); returns the number in use."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")


def add_clock_option(parser: argparse.ArgumentParser, default: str = "wall") -> None:
    parser.add_argument("--clock", choices=tuple(CLOCKS), default=default,
                        help="wall: elapsed time, as fairseq reports it; cpu: this process's CPU time "
                        "(all its threads), steadier when other jobs share the machine")


def clock_from_args(parser: argparse.ArgumentParser, kind: str, device: str) -> Clock:
    """The ``--clock`` of ``device``; a CPU clock cannot time a GPU's work (``parser.error``, exit 2)."""
    if kind == "cpu" and str(device).startswith("cuda"):
        parser.error("--clock cpu measures CPU time; use --clock wall with --device cuda")
    return Clock(kind, device)
