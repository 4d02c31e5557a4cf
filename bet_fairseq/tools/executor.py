"""The one executor of fairseq runs: command lines, logged runs (a subprocess, or fairseq's CLI inside this
process), and evaluation (BLEU, sacreBLEU, perplexity, bits per character).

Used by the Table 2 driver (``bet-run-row``, the run scripts, the main job), the study (``bet-reproduce``)
and the side-by-side demo, so they build, run and score fairseq the same way. A ``Job`` is one
training + evaluation: its architecture, data and save folder, its dataset (``catalog.py``) and its
fairseq flags (``recipes.py`` merges them).

CPU runs get ``OMP_NUM_THREADS=1`` unless the caller's environment sets it (runs go side by side on the
cores: ``bet-reproduce --jobs``).
"""

import contextlib
import datetime
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from bet_fairseq import catalog, recipes
from bet_fairseq.catalog import Flags
from bet_fairseq.errors import ToolError


class RunFailed(ToolError, RuntimeError):
    """A fairseq run that exited non-zero or produced no result; the message names its log and quotes its last
    line (one line at the top of a command, ``errors.run_tool``: exit status 1, or 2 when fairseq itself
    refused its arguments)."""

    def __init__(self, message, exit_status=1):
        super().__init__(message)
        self.exit_status = exit_status


def failed(tool, rc, log):
    """The RunFailed of ``tool`` that exited with ``rc``: its log's last line says why (fairseq's usage error, the
    plugin's one line, or the last line of a traceback)."""
    last = ""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip() and not line.startswith("# "):
                    last = line.strip()
    except OSError:
        pass
    why = f": {last[:300]}" if last else ""
    return RunFailed(f"{tool} failed (exit {rc}{why}); see {log}", exit_status=2 if rc == 2 else 1)


TOOLS = {"fairseq-train": "fairseq_cli.train", "fairseq-generate": "fairseq_cli.generate",
         "fairseq-eval-lm": "fairseq_cli.eval_lm"}


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return False


def fairseq_command(name: str) -> List[str]:
    """The argv prefix of a fairseq CLI: this interpreter's console script, else one on PATH, else ``-m``."""
    exe = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(exe):
        return [exe]
    found = shutil.which(name)
    if found:
        return [found]
    return [sys.executable, "-m", TOOLS[name]]


@dataclass
class Job:
    """One training and its evaluation on the test split (``checkpoint``: the one evaluated)."""

    arch: str
    data: str
    save_dir: str
    dataset: catalog.Dataset
    train: Flags
    evaluate: Flags
    extra_train: Sequence[str] = ()
    checkpoint: str = "checkpoint_best.pt"
    user_dir: Optional[str] = None
    cpu: bool = field(default_factory=lambda: not has_cuda())

    @property
    def eval_tool(self) -> str:
        return "fairseq-generate" if self.dataset.kind == "mt" else "fairseq-eval-lm"

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.save_dir, self.checkpoint)

    def commands(self) -> Tuple[List[str], List[str]]:
        """(fairseq-train argv, fairseq-generate / fairseq-eval-lm argv)."""
        import bet_fairseq

        user_dir = self.user_dir or bet_fairseq.user_dir()
        device = {"--cpu": True if self.cpu else None}
        train = recipes.merge(self.train, device)
        ev = recipes.merge(self.evaluate, device)
        train_argv = (fairseq_command("fairseq-train") + [self.data, "--user-dir", user_dir, "--arch", self.arch,
                                                           "--save-dir", self.save_dir]
                      + recipes.to_argv(train) + list(self.extra_train))
        eval_argv = (fairseq_command(self.eval_tool) + [self.data, "--user-dir", user_dir, "--path",
                                                         self.checkpoint_path] + recipes.to_argv(ev))
        return train_argv, eval_argv


# ----------------------------------------------------------------------------- running


LIVE = set()  # the fairseq subprocesses running now (stopped on Ctrl-C)
_LIVE_LOCK = threading.Lock()


def _environment():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1" if not has_cuda() else env.get("OMP_NUM_THREADS", "4"))
    return env


def _header(argv, suffix=""):
    return f"# {datetime.datetime.now().isoformat(timespec='seconds')} {shlex.join(argv)}{suffix}\n"


def _wait(proc) -> Tuple[int, float]:
    """Wait for ``proc``: (exit status, the CPU seconds of that process alone, user + system; exact also when
    several runs go side by side, which the children's summed rusage is not)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def run_logged(argv: List[str], log_path: str, echo: bool = False) -> Tuple[int, float, float]:
    """``argv`` in a subprocess, its output appended to ``log_path`` (and to our stdout when ``echo``); returns
    (exit status, wall seconds, CPU seconds of the subprocess). An interruption stops the child too (fairseq
    writes checkpoints under a temporary name, so nothing is left half-written)."""
    start = time.time()
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(_header(argv))
        log.flush()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE if echo else log, stderr=subprocess.STDOUT,
                                text=True, env=_environment())
        with _LIVE_LOCK:
            LIVE.add(proc)
        try:
            if echo:
                for line in proc.stdout:
                    log.write(line)
                    sys.stdout.write(line)
            rc, cpu = _wait(proc)
        except BaseException:
            stop(proc)
            raise
        finally:
            with _LIVE_LOCK:
                LIVE.discard(proc)
    return rc, time.time() - start, cpu


def _ignores(pid, signum):
    """Whether process ``pid`` ignores ``signum`` (Linux's /proc; False where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return bool(mask >> (signum - 1) & 1)


def stop(proc, grace=30):
    """Stop a child as Ctrl-C would (SIGINT), with SIGTERM when it ignores SIGINT (the children of a study started
    in the background, which the shell starts so, inherit that); killed if it is still there ``grace`` s later."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM if _ignores(proc.pid, signal.SIGINT) else signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_all():
    with _LIVE_LOCK:
        procs = list(LIVE)
    for proc in procs:
        stop(proc)


@contextlib.contextmanager
def quiet_logging():
    """No console output from the root logger for the duration (fairseq's log goes to the run's log only)."""
    root = logging.getLogger()
    handlers = root.handlers[:]
    root.handlers = []
    try:
        yield
    finally:
        root.handlers = handlers


def run_in_process(argv: List[str], log_path: str, echo: bool = False) -> Tuple[int, float]:
    """Like ``run_logged``, but calls the fairseq CLI's ``cli_main`` in this process (no start-up cost)."""
    import importlib
    import traceback

    import bet_fairseq

    bet_fairseq.register()  # what --user-dir does in a fresh process (here the package is already imported)
    tool = next((t for t in TOOLS if os.path.basename(argv[0]) == t or TOOLS[t] in argv[:3]), None)
    args = argv[1:] if argv[0] != sys.executable else argv[3:]
    module = importlib.import_module(TOOLS[tool])
    start = time.time()
    rc = 0
    with open(log_path, "a", encoding="utf-8") as log, (contextlib.nullcontext() if echo else quiet_logging()):
        log.write(_header(argv, " (in process)"))
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                                               datefmt="%Y-%m-%d %H:%M:%S"))
        root = logging.getLogger()
        old_argv, old_level = sys.argv, root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        sys.argv = [tool, *args]
        # fairseq keeps the best validation loss seen so far on a function attribute; an earlier
        # run in this process would otherwise decide whether this one writes checkpoint_best.pt.
        from fairseq import checkpoint_utils

        if hasattr(checkpoint_utils.save_checkpoint, "best"):
            del checkpoint_utils.save_checkpoint.best
        try:
            with contextlib.redirect_stdout(log):
                module.cli_main()
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            traceback.print_exc(file=log)
            rc = 1
        finally:
            sys.argv = old_argv
            root.removeHandler(handler)
            root.setLevel(old_level)
    return rc, time.time() - start


def execute(argv: List[str], log_path: str, in_process: bool = False, echo: bool = False):
    """(exit status, wall seconds, CPU seconds of the run: of its subprocess, or of this process in process)."""
    if in_process:
        before = time.process_time()
        rc, wall = run_in_process(argv, log_path, echo)
        return rc, wall, time.process_time() - before
    return run_logged(argv, log_path, echo)


# ----------------------------------------------------------------------------- reading the results


def parse_bleu(text: str) -> Optional[float]:
    m = re.search(r"BLEU4 = ([\d.]+)", text)
    return float(m.group(1)) if m else None


def parse_eval_lm(text: str):
    """(loss in bits per token, perplexity) of fairseq-eval-lm's output."""
    m = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", text)
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


def last_num_updates(log_path: str) -> Optional[int]:
    n = None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.search(r'"(?:train_|valid_)?num_updates": "?(\d+)', line)
            if m:
                n = int(m.group(1))
    return n


def detokenised(text: str, lang: str):
    """(hypotheses, references) of fairseq-generate output (H-/T- lines), Moses-detokenised, in test-set order."""
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang)
    hyps, refs = {}, {}
    for line in text.splitlines():
        m = re.match(r"^([HT])-(\d+)\t(.*)$", line)
        if not m:
            continue
        kind, idx, rest = m.groups()
        if kind == "H":
            rest = rest.split("\t", 1)[1] if "\t" in rest else ""
            hyps[int(idx)] = md.detokenize(rest.split())
        else:
            refs[int(idx)] = md.detokenize(rest.split())
    ids = sorted(set(hyps) & set(refs))
    return [hyps[i] for i in ids], [refs[i] for i in ids]


def scores(text: str, dataset: catalog.Dataset) -> Dict[str, object]:
    """The metrics of an evaluation's output: ``value`` (the dataset's metric) and the figures beside it.
    Translation: tokenised BLEU4 (fairseq's), sacreBLEU of the Moses-detokenised hypotheses against the
    detokenised references, the number of hypotheses (and ``hypotheses`` / ``references``, the detokenised
    lines); language models: loss in bits per token, perplexity (bits per character for enwik8)."""
    if dataset.kind == "mt":
        import sacrebleu

        hyps, refs = detokenised(text, dataset.target)
        return {"value": parse_bleu(text), "bleu": parse_bleu(text),
                "sacrebleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2) if hyps else None,
                "sentences": len(hyps), "hypotheses": hyps, "references": refs}
    loss2, ppl = parse_eval_lm(text)
    return {"value": loss2 if dataset.metric == "bpc" else ppl, "loss_base2": loss2, "ppl": ppl}


def train(job: Job, in_process: bool = False, echo: bool = False) -> Dict[str, object]:
    """fairseq-train of ``job`` (resuming from its checkpoint_last.pt, as fairseq does); its timing."""
    os.makedirs(job.save_dir, exist_ok=True)
    log = os.path.join(job.save_dir, "train.log")
    resumed = os.path.exists(os.path.join(job.save_dir, "checkpoint_last.pt"))
    rc, wall, cpu = execute(job.commands()[0], log, in_process, echo)
    if rc != 0:
        raise failed("fairseq-train", rc, log)
    return {"train_wall_s": round(wall, 1), "train_cpu_s": None if cpu is None else round(cpu, 1),
            "resumed": resumed, "num_updates": last_num_updates(log)}


def evaluate(job: Job, in_process: bool = False, echo: bool = False) -> Dict[str, object]:
    """The evaluation of ``job``'s checkpoint on the test split: ``scores`` plus its timing (a fresh eval.log)."""
    if not os.path.exists(job.checkpoint_path):
        raise RunFailed(f"no checkpoint {job.checkpoint_path} to evaluate")
    log = os.path.join(job.save_dir, "eval.log")
    if os.path.exists(log):
        os.remove(log)
    rc, wall, cpu = execute(job.commands()[1], log, in_process, echo)
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if rc != 0:
        raise failed(job.eval_tool, rc, log)
    result = scores(text, job.dataset)
    if result["value"] is None:
        raise RunFailed(f"no {job.dataset.metric} in {log}")
    result.update(eval_wall_s=round(wall, 1), eval_cpu_s=None if cpu is None else round(cpu, 1))
    return result
