"""User-facing failures as one line: the error types our code raises, and the two places that turn them
into one line on stderr and an exit status (a traceback is left for bugs).

The classes (code raises them; none prints, none is a SystemExit, so in-process callers and tests get
the exception itself):

- ``ToolError``: a failure the user can act on, shown as one line; ``exit_status`` says how it ends.
- ``InputError(ToolError, ValueError)``: the user's input (an option, a file, a line of it) is wrong; the
  message names it and says what to do; exit status 2. Subclasses name where it comes from
  (``PrepareError``, ``CheckpointError``, ``SyntaxHintError``, ...); a ValueError, so callers that catch
  ValueError still do.
- ``executor.RunFailed(ToolError, RuntimeError)``: a fairseq run that failed; the message names its log;
  exit status 1.

Who turns them into a line (nothing is installed by importing a module):

- our tools' entry points call ``run_tool(prog, main)``: ``ToolError`` -> ``prog: error: ...`` and its exit
  status; Ctrl-C (and SIGTERM, as Ctrl-C) -> one line with the tool's hint on how to go on, exit 130, with
  worker processes quiet;
- fairseq's commands (``fairseq-train --user-dir bet_fairseq`` ...) load the plugin while they run, so
  ``compat.report_input_errors`` (called when the plugin registers) installs ``excepthook``: a
  ``ToolError`` that reaches the top of the process is printed as one line and the process exits with
  its status.

Pure Python: imports neither fairseq nor torch.
"""

import os
import signal
import sys
import threading

__all__ = ["ToolError", "InputError", "one_line", "run_tool", "check_writable_folder", "check_writable_file",
           "check_positive", "check_at_least"]

EXIT_FAILED = 1
EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130


class ToolError(Exception):
    """A failure the user can act on: shown as one line (``prog: error: message``) and ``exit_status``,
    never as a traceback."""

    exit_status = EXIT_FAILED


class InputError(ToolError, ValueError):
    """The user's input (an option, a file, a line of it) is wrong: the message names it and says what
    to do. Shown as one line and exit status 2, never as a traceback."""

    exit_status = EXIT_INPUT_ERROR


def one_line(prog, error):
    """``prog: error: message`` on one line (a message's own line breaks become "; ")."""
    text = "; ".join(part.strip() for part in str(error).splitlines() if part.strip())
    return f"{prog}: error: {text}"


def reported_error(exc):
    """The ToolError that ``exc`` is, or that it was raised while handling (fairseq re-raises some errors as a bare
    ``Exception`` that names none of it: "Cannot load model parameters ..."); None when there is none (a bug)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ToolError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _prog():
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def excepthook(exc_type, exc, tb, _previous=None):
    """``sys.excepthook`` for fairseq's commands: an uncaught ToolError is one line and its exit status
    (raising SystemExit from the hook makes Python exit with that status, atexit handlers included);
    everything else goes to the previous hook (a traceback)."""
    error = reported_error(exc)
    if error is not None:
        sys.stdout.flush()
        print(one_line(_prog(), error), file=sys.stderr, flush=True)
        raise SystemExit(error.exit_status)
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
    """Ctrl-C raises KeyboardInterrupt in this process only: worker processes forked later
    (fairseq-preprocess's pool) inherit a handler that ignores it, so they print no traceback and the pool
    never waits on a worker that died; the main process stops them when it unwinds. (Our own pools,
    ``workers.worker_pool``, spawn their workers with SIGINT ignored.)"""
    main_pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() == main_pid:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    if hasattr(signal, "pthread_sigmask"):  # a mask inherited from the parent (a test runner's) would hold it forever
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def run_tool(prog, main, argv=None, interrupted="interrupted; run the same command again to go on"):
    """Run a tool's ``main(argv)`` as a command: its return value is the exit status; a ToolError is one
    line and its status (2 for an InputError); Ctrl-C, or ``kill`` (SIGTERM, taken as Ctrl-C where no one
    chose another handler, so that the tool cleans up the same way), is one line (``prog: interrupted``)
    and status 130."""
    from .quiet import quiet_third_party

    quiet_third_party()
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main_thread else None
    if previous is signal.default_int_handler:
        interrupt_main_process_only()
    previous_term = signal.getsignal(signal.SIGTERM) if main_thread else None
    if previous_term == signal.SIG_DFL:
        main_pid = os.getpid()
        signal.signal(signal.SIGTERM, lambda signum, frame: _interrupt(signum, main_pid))
    try:
        status = main(argv)
    except Exception as exc:
        error = reported_error(exc)
        if error is None:
            raise
        sys.stdout.flush()
        print(one_line(prog, error), file=sys.stderr, flush=True)
        return error.exit_status
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"\n{prog}: {interrupted}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        if previous is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous)
        if previous_term == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return status if isinstance(status, int) else 0


def _interrupt(signum, main_pid):
    """SIGTERM as Ctrl-C in the process that installed it (a forked worker ends quietly instead)."""
    if os.getpid() == main_pid:
        raise KeyboardInterrupt
    os._exit(128 + signum)


def check_positive(value, option, what="number"):
    """``value`` (an int or float option) is > 0 (and finite), else an InputError naming ``option``."""
    return check_at_least(value, option, 0, what, strict=True)


def check_at_least(value, option, minimum, what="number", strict=False):
    """``value`` >= ``minimum`` (> with ``strict``) and finite, else an InputError naming ``option``; None passes."""
    import math

    if value is None:
        return value
    ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise InputError(f"{option} must be a {what} {bound}, got {value}")
    return value


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
