"""User-facing failures as one line: the error type our code raises for bad input, and how a command
turns it into one line on stderr and exit status 2 (a traceback is left for bugs).

``InputError`` (a ValueError, so callers and tests that catch ValueError still do) says which option,
file or line is wrong and what to do. Two ways it reaches the user as one line:

- our tools' entry points call ``run_tool(prog, main)``: ``InputError`` -> ``prog: error: ...``, exit 2;
  Ctrl-C -> one line (and the tool's hint on how to go on), exit 130, with worker processes quiet;
- fairseq's commands (``fairseq-train --user-dir bet_fairseq`` ...) load the plugin while they run, so
  ``compat.report_input_errors`` installs ``excepthook``: an ``InputError`` that reaches the top of the
  process is printed as one line and the process exits with status 2. In-process callers (tests,
  ``bet-run-row --in-process``) still get the exception itself.

Pure Python: imports neither fairseq nor torch.
"""

import contextlib
import os
import signal
import sys

__all__ = ["InputError", "one_line", "run_tool", "check_writable_folder", "check_writable_file"]

EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130


class InputError(ValueError):
    """The user's input (an option, a file, a line of it) is wrong: the message names it and says what
    to do. Shown as one line and exit status 2, never as a traceback."""


def one_line(prog, error):
    """``prog: error: message`` on one line (a message's own line breaks become "; ")."""
    text = "; ".join(part.strip() for part in str(error).splitlines() if part.strip())
    return f"{prog}: error: {text}"


def _prog():
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def excepthook(exc_type, exc, tb, _previous=None):
    """``sys.excepthook`` for fairseq's commands: an uncaught InputError is one line and exit status 2
    (raising SystemExit from the hook makes Python exit with that status, atexit handlers included);
    everything else goes to the previous hook (a traceback)."""
    if isinstance(exc, InputError):
        sys.stdout.flush()
        print(one_line(_prog(), exc), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_INPUT_ERROR)
    (_previous or sys.__excepthook__)(exc_type, exc, tb)


def install_excepthook():
    """Chain ``excepthook`` in front of the current hook (idempotent)."""
    current = sys.excepthook
    if getattr(current, "_bet_reports_input_errors", False):
        return

    def hook(exc_type, exc, tb):
        excepthook(exc_type, exc, tb, current)

    hook._bet_reports_input_errors = True
    sys.excepthook = hook


def interrupt_main_process_only():
    """Ctrl-C raises KeyboardInterrupt in this process only: worker processes forked later (our pools,
    fairseq-preprocess's) inherit a handler that ignores it, so they print no traceback and the pool
    never waits on a worker that died; the main process stops them when it unwinds."""
    main_pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() == main_pid:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    if hasattr(signal, "pthread_sigmask"):  # a mask inherited from the parent (a test runner's) would hold it forever
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def worker_pool(processes, initializer, initargs=()):
    """``multiprocessing.Pool`` that Ctrl-C cannot cut in half while it starts: SIGINT waits (blocked) until the
    pool exists and its ``with`` block is entered, so the pool is always terminated as the interrupt unwinds. (A
    pool interrupted inside its constructor was left to the interpreter's exit, whose worker handler forked new
    workers that failed with tracebacks.) Its workers and threads start with SIGINT blocked: the main process
    alone sees Ctrl-C."""
    import multiprocessing

    blocked = hasattr(signal, "pthread_sigmask")
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if blocked else None
    try:
        pool = multiprocessing.Pool(processes, initializer=initializer, initargs=initargs)
    except BaseException:
        if blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
        raise
    with pool:
        if blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a Ctrl-C that came meanwhile is raised here
        yield pool


def run_tool(prog, main, argv=None, interrupted="interrupted; run the same command again to go on"):
    """Run a tool's ``main(argv)`` as a command: its return value is the exit status; InputError is one
    line and status 2; Ctrl-C is one line (``prog: interrupted``) and status 130."""
    from .quiet import quiet_third_party

    quiet_third_party()
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:
        interrupt_main_process_only()
    try:
        status = main(argv)
    except InputError as exc:
        sys.stdout.flush()
        print(one_line(prog, exc), file=sys.stderr, flush=True)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"\n{prog}: {interrupted}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        if previous is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous)
    return status if isinstance(status, int) else 0


def _nearest_existing(path):
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _check_writable(path, folder, option):
    existing = _nearest_existing(folder)
    if not os.path.isdir(existing):
        where = "is a file" if existing == os.path.abspath(path) else f"would be under the file {existing}"
        raise InputError(f"{option} {path}: {where}, not a folder: choose another {option}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: {existing} is not writable: choose another {option} or fix its "
                         "permissions")


def check_writable_folder(path, option):
    """Fail now, before any work, when ``path`` (a folder to be written, created if absent) cannot be
    written: a file, under a file, or not writable. Creates nothing."""
    _check_writable(path, path, option)
    return path


def check_writable_file(path, option):
    """The same for an output file: its folder can be written and the file is not a folder."""
    if os.path.isdir(path):
        raise InputError(f"{option} {path} is a folder; give a file name")
    _check_writable(path, os.path.dirname(os.path.abspath(path)), option)
    return path
