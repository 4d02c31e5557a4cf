"""The study's scheduler: runs what is left, ``jobs`` at a time, one progress line per run, each finished run kept
in the report's archive at once, within a sitting's time (``--hours``).

    failures, deferred = Scheduler(scale, work, out, datasets, jobs=2, deadline=t).run(runs)

``datasets`` prepares a dataset just before its first run (``ready(dataset)``, ``seconds_to_prepare(dataset)``,
``bin_dir(dataset)``), from the main thread, where Ctrl-C reaches it. From the first run that the estimate says
would end after ``deadline`` (a ``time.time()``), no unfinished run is started: those are left for the next
invocation. A run's estimate is the scale's figure times what the runs finished here took against theirs, or,
before any has, the records in ``history`` (runs finished earlier); the first unfinished run of a dataset not
prepared yet is weighed with its preparation.
"""

import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from bet_fairseq import catalog
from bet_fairseq.tools.executor import RunFailed, stop_all
from . import plan, runs, store


def hms(seconds):
    seconds = int(round(max(0, seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Scheduler:
    def __init__(self, scale, work, out, datasets, jobs=1, in_process=False, deadline=None, hours=None,
                 history=()):
        self.scale, self.work, self.out, self.datasets = scale, work, out, datasets
        self.jobs, self.in_process, self.deadline, self.hours = jobs, in_process, deadline, hours
        self.per_run = plan.SCALE_TABLE[scale].seconds_per_run
        earlier = [self._seconds(r) for r in history if r.get("scale") == scale and r.get("wall_time_s")]
        self.earlier_factor = sum(m for m, _ in earlier) / sum(e for _, e in earlier) if earlier else 1.0
        self.measured = self.estimated = 0.0
        self.out_of_time = self.stopping = False
        self.lock = threading.Lock()
        self.failures, self.deferred = [], []

    def run(self, todo):
        """Run ``todo`` (a list of ``plan.Run``); returns (failures, runs left for the next invocation)."""
        sc = plan.SCALE_TABLE[self.scale]
        if self.jobs > 1 or not self.in_process:
            os.environ.setdefault("OMP_NUM_THREADS", "1")
        elif sc.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            import torch

            torch.set_num_threads(1)  # one thread a run, as in a subprocess (threads spin-wait on a busy machine)
        self.total, self.k, self.left, self.start = len(todo), 0, list(todo), time.time()
        if self.jobs == 1:
            for run in todo:
                if self._admit(run):
                    self._one(run)
            return self.failures, self.deferred
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        queue, pending = list(todo), set()
        try:
            while queue or pending:
                while queue and len(pending) < self.jobs:
                    run = queue.pop(0)
                    if self._admit(run):
                        pending.add(pool.submit(self._one, run))
                if pending:
                    finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        fut.result()
        except BaseException:
            self.stopping = True
            stop_all()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return self.failures, self.deferred

    # ------------------------------------------------------------------ estimates and progress

    def _seconds(self, record):
        return store.run_seconds(record), self.per_run[catalog.dataset(record["dataset"]).kind]

    def estimate(self, run):
        """The run's seconds: the scale's figure, scaled by what the finished runs took against theirs."""
        factor = self.measured / self.estimated if self.estimated else self.earlier_factor
        return self.per_run[catalog.dataset(run.dataset).kind] * factor

    def _progress(self, run, what):
        self.k += 1
        self.left.remove(run)
        eta = sum(self.estimate(r) for r in self.left) / self.jobs
        print(f"[{self.k}/{self.total}] {run.name}: {what} | elapsed {hms(time.time() - self.start)} | "
              f"left ~{hms(eta)}", flush=True)

    def _report(self, run, record, skipped, error=None):
        with self.lock:
            if error is None and not skipped:
                measured, estimated = self._seconds(record)
                self.measured += measured
                self.estimated += estimated
            if error is not None:
                what = f"FAILED: {error}"
            else:
                metric = "BLEU" if record["metric"] == "bleu" else "ppl"
                how = "already done" if skipped else f"{store.run_seconds(record):.0f} s"
                if store.is_copy(record):
                    how += f", a copy of {record[store.COPIED_FROM]}"
                what = f"{metric} {record['value']:.2f} ({how})"
            self._progress(run, what)

    # ------------------------------------------------------------------ what starts

    def _left_for_later(self, run, preparing=0.0, finished=False):
        """Whether ``run`` is left for later (``--hours``), given ``preparing`` seconds of data preparation first;
        a ``finished`` run takes no time but that (it is not redone here, nor checked against data not prepared)."""
        if self.deadline is None:
            return False
        with self.lock:
            need = preparing + (0.0 if finished else self.estimate(run))
            if not self.out_of_time and time.time() + need <= self.deadline:
                return False
            if finished:
                self._progress(run, "finished earlier (not checked against its data, which this sitting leaves "
                                    "unprepared)")
                return True
            self.out_of_time = True
            self.deferred.append(run)
            data = " with its data's preparation" if preparing else ""
            self._progress(run, f"not started: ~{hms(need)}{data} would end past --hours {self.hours:g}")
            return True

    def _admit(self, run):
        """Whether ``run`` goes to a job; its dataset is prepared first unless the run is left for later. Called
        from the main thread (the jobs' threads only run fairseq's commands, which Ctrl-C stops)."""
        if self.datasets.ready(run.dataset):
            return True
        if self._left_for_later(run, self.datasets.seconds_to_prepare(run.dataset),
                                finished=store.done(self.work, run)):
            return False
        self.datasets.bin_dir(run.dataset)
        return True

    def _one(self, run):
        bin_dir = self.datasets.bin_dir(run.dataset)
        if self.stopping or not runs.takes_no_time(run, self.scale, self.work, bin_dir) and self._left_for_later(run):
            return
        try:
            record, skipped = runs.execute(run, self.scale, self.work, bin_dir, in_process=self.in_process)
        except RunFailed as exc:
            if self.stopping:
                return
            self.failures.append(str(exc))
            self._report(run, None, False, exc)
            return
        store.save(self.work, self.out, run)
        self._report(run, record, skipped)
