"""``kill PID`` of a study started in the background: SIGINT is ignored there (a shell without job control starts
background commands so, and ``nohup`` keeps it), so SIGTERM is how it is stopped. It must stop the fairseq
processes too, not leave them training, orphaned, into the folders the next invocation resumes."""

import os
import signal
import subprocess
import sys
import time

from cli_utils import ROOT, require_shared


def _as_in_the_background():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _running(pid):
    """Alive and not a zombie (a process that ended but was not reaped yet has state Z)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_stops_the_study_and_its_fairseq_processes(tmp_path):
    data = os.path.dirname(require_shared("multi30k"))
    argv = [sys.executable, "-c", "import sys; from bet_fairseq.tools.study.cli import main; sys.exit(main())",
            "--scale", "smoke", "--part", "headline", "--jobs", "1", "--data-dir", data,
            "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_as_in_the_background,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))
    trainers, deadline = [], time.time() + 300
    try:
        while not trainers and proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
            trainers = [c for c in _children(proc.pid) if "fairseq-train" in _cmdline(c)]
        assert trainers, f"no fairseq-train started (exit status {proc.poll()})"
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)  # to the study alone, as `kill PID` does
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err[-3000:]
        assert "interrupted" in err and "run the same command again" in err, err[-3000:]
        time.sleep(1)
        assert not [t for t in trainers if _running(t)], "fairseq-train still running after the study stopped"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for t in trainers:
            if _running(t):
                os.kill(t, signal.SIGKILL)


def test_a_child_that_ignores_sigint_is_stopped_with_sigterm_not_left_to_the_grace_period():
    """A background study's fairseq processes inherit SIGINT ignored: stopping them with SIGINT would only end
    after the grace period, with SIGKILL."""
    from bet_fairseq.tools import executor

    ignoring = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                preexec_fn=_as_in_the_background)
    default = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],  # whatever pytest inherited
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(1)  # the interpreters are up (their SIGINT handling set)
        assert executor._ignores(ignoring.pid, signal.SIGINT) and not executor._ignores(default.pid, signal.SIGINT)
        executor.stop(ignoring, grace=120)
        executor.stop(default, grace=120)
        assert ignoring.returncode == -signal.SIGTERM  # not -SIGKILL, the grace period's end
        assert default.returncode == -signal.SIGINT  # Python's KeyboardInterrupt, uncaught
    finally:
        for p in (ignoring, default):
            if p.poll() is None:
                p.kill()
