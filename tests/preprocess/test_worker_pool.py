"""``bet_fairseq.workers.worker_pool``, the data tools' worker processes: results in order and lazily; workers that
ignore Ctrl-C and are stopped at once when it comes, also while they start; a worker that dies or whose
initialiser fails is an error, never a wait; workers start from a fresh interpreter, not a copy of a process
that runs other threads."""

import functools
import json
import operator
import os
import signal
import subprocess
import sys

import pytest

from bet_fairseq.workers import WorkerDied, worker_pool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_results_come_in_order_and_the_input_is_read_as_needed():
    read = []

    def numbers():
        for i in range(40):
            read.append(i)
            yield i

    with worker_pool(2) as pool:
        results = pool.imap(abs, (-i for i in numbers()), chunksize=3)
        first = next(results)
        read_at_first = len(read)
        rest = list(results)
    assert [first, *rest] == list(range(40))
    assert read_at_first <= (4 + 1) * 3  # two chunks per worker in flight and the next one: not the whole input


def test_workers_are_spawned_not_forked():
    """A fork would copy this process, with the locks its other threads held; a spawned worker is a fresh
    interpreter: none of this process's modules (pytest among them) are loaded there."""
    pytest_loaded = "'pytest' in __import__('sys').modules"
    with worker_pool(1) as pool:
        in_worker, = pool.imap(eval, [pytest_loaded])
        pid, = pool.imap(operator.methodcaller("__call__"), [os.getpid])
    assert eval(pytest_loaded) and not in_worker
    assert pid != os.getpid()


def test_workers_ignore_ctrl_c_and_hold_it_back():
    with worker_pool(2) as pool:
        handlers = set(pool.imap(signal.getsignal, [signal.SIGINT] * 4))
        masks = list(pool.imap(functools.partial(signal.pthread_sigmask, signal.SIG_BLOCK), [[]] * 4))
    assert handlers == {signal.SIG_IGN}
    assert all(signal.SIGINT in mask for mask in masks)


def test_a_worker_that_dies_is_an_error_not_a_wait():
    with pytest.raises(WorkerDied, match="a worker process ended without its result"):
        with worker_pool(2) as pool:
            list(pool.imap(os._exit, [0, 0, 0]))


def test_a_failing_initialiser_is_an_error_not_a_restart_loop():
    with pytest.raises(WorkerDied, match="a worker process ended without its result"):
        with worker_pool(2, int, ("not a number",)) as pool:
            list(pool.imap(abs, range(4)))


CTRL_C_WHILE_A_WORKER_STARTS = """
import json, multiprocessing.context, os, signal, time
from bet_fairseq import errors
from bet_fairseq.workers import worker_pool

started = []
start = multiprocessing.context.SpawnProcess.start

def start_as_ctrl_c_comes(self):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the pool starts a worker
    start(self)
    started.append(self)

multiprocessing.context.SpawnProcess.start = start_as_ctrl_c_comes
errors.interrupt_main_process_only()
begin = time.monotonic()
try:
    with worker_pool(2) as pool:
        list(pool.imap(time.sleep, [60] * 4))
    raise SystemExit("the interrupt was not raised")
except KeyboardInterrupt:
    pass
print(json.dumps({"started": len(started), "alive": [p.is_alive() for p in started],
                  "seconds": time.monotonic() - begin}))
"""


def test_ctrl_c_while_a_worker_starts_stops_every_worker_at_once():
    """The interrupt waits until the worker process exists, then unwinds the ``with`` block, which terminates the
    workers without waiting for their tasks (a minute each)."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_A_WORKER_STARTS], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["started"] >= 1 and report["alive"] == [False] * report["started"], report
    assert report["seconds"] < 30, report
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_script_without_the_main_guard_gets_an_error_not_a_hang(tmp_path):
    """A spawned worker imports the caller's main module, which here starts a pool again: Python refuses that in
    the worker, and the caller gets WorkerDied."""
    script = tmp_path / "unguarded.py"
    script.write_text("from bet_fairseq.workers import worker_pool\n"
                      "with worker_pool(2) as pool:\n"
                      "    print(list(pool.imap(abs, [-1, -2])))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode != 0
    assert "if __name__ == '__main__'" in done.stderr  # Python's own advice, from the worker
    assert "WorkerDied: a worker process ended without its result" in done.stderr
