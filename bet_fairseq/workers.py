"""Worker processes for the data tools (tokenising, BPE, parsing): ``worker_pool(n, initializer, initargs)``
gives ``pool.imap(fn, iterable, chunksize)``, lazy and in order, as ``multiprocessing.Pool.imap`` does.

Why not ``multiprocessing.Pool`` on Linux's default ``fork``:

- fork copies a process that may run other threads (an in-process caller's: fairseq's data-loading threads
  that a training run leaves behind, tqdm's monitor, torch's OpenMP pool); a lock one of them held at the
  fork stays held forever in the child. The workers here are *spawned*: a fresh interpreter each, so the
  initialiser's arguments are pickled and sent down the worker's start-up pipe: keep them small (names,
  paths; a large object goes through a file). While it writes them the main process holds the pipe's
  reading end too, so a worker that died before reading them all would leave it blocked for ever.
  A spawned worker imports the caller's main module: a script that starts a pool runs under
  ``if __name__ == "__main__":``.
- ``multiprocessing.Pool`` waits forever for the result of a worker that died (killed, out of memory) and
  restarts a worker whose initialiser fails, forever. ``concurrent.futures`` notices both
  (``BrokenProcessPool``), which becomes a ``WorkerDied`` error here.

Ctrl-C: workers start with SIGINT blocked and ignored, so only the main process sees it; leaving the ``with``
block by an exception (the KeyboardInterrupt among them) cancels the queued chunks and terminates the
workers.

Pure Python: imports neither fairseq nor torch.
"""

import collections
import contextlib
import itertools
import signal

from .errors import ToolError

__all__ = ["WorkerDied", "chunks", "worker_pool"]


class WorkerDied(ToolError):
    """A worker process ended without a result (killed, out of memory, or its initialiser failed)."""


def _start_worker(initializer, initargs):
    """Each worker's first step: Ctrl-C is the main process's to handle; then the caller's initialiser."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


def chunks(iterable, size):
    """Lists of ``size`` consecutive items (the last one shorter), read as they are asked for."""
    items = iter(iterable)
    return iter(lambda: list(itertools.islice(items, size)), [])


def _map_chunk(fn, items):
    return [fn(item) for item in items]


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT held back (delivered when this ends): processes started meanwhile inherit the blocked mask."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class WorkerPool:
    """Spawned worker processes that map a function over an iterable (see the module docstring)."""

    def __init__(self, executor, processes):
        self._executor = executor
        self._window = 2 * processes  # chunks in flight: every worker busy, one more queued each

    def _submit(self, fn, chunk):
        with _sigint_blocked():  # submit starts the worker processes, one at a time as they are needed
            return self._executor.submit(_map_chunk, fn, chunk)

    def imap(self, fn, iterable, chunksize=1):
        """``fn`` of every item, in order, computed ``chunksize`` items to a task; the iterable is read as
        the workers need it, never all at once."""
        from concurrent.futures.process import BrokenProcessPool

        tasks = chunks(iterable, chunksize)
        pending = collections.deque(self._submit(fn, chunk) for chunk in itertools.islice(tasks, self._window))
        while pending:
            try:
                results = pending.popleft().result()
            except BrokenProcessPool as exc:
                raise WorkerDied(f"a worker process ended without its result ({exc}); its error, if it had one, "
                                 "is printed above; out of memory? run again with fewer workers") from None
            for chunk in itertools.islice(tasks, 1):
                pending.append(self._submit(fn, chunk))
            yield from results


@contextlib.contextmanager
def worker_pool(processes, initializer=None, initargs=()):
    """``processes`` spawned workers, each set up by ``initializer(*initargs)`` (module-level, picklable),
    for the ``with`` block; an exception leaving it (Ctrl-C included) terminates them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    executor = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start_worker, initargs=(initializer, initargs))
    try:
        yield WorkerPool(executor, processes)
    except BaseException:
        _terminate(executor)
        raise
    executor.shutdown(wait=True)


def _terminate(executor):
    """Stop the workers now, whatever they are doing (``shutdown`` alone waits for their running tasks)."""
    if hasattr(executor, "terminate_workers"):  # Python >= 3.14
        executor.terminate_workers()
        return
    processes = list((getattr(executor, "_processes", None) or {}).values())  # shutdown forgets them
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=10)
