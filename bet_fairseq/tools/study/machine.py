"""The machine and the code a run or a report was made by, kept in each record: a study spans sittings, machines
and commits."""

import os
import platform
import subprocess

from bet_fairseq.tools import executor

# what "the code" of a commit is: a report or kept runs written into docs/results do not make it uncommitted
CODE = ("bet_fairseq", "preprocess", "setup.py", "pyproject.toml")
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def code_commit(root=None):
    """The git commit of the code running the study (with "+ uncommitted changes" when ``CODE`` differs from it),
    or None."""
    root = root or CHECKOUT
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", *CODE],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (commit + (" + uncommitted changes" if dirty else "")) if commit else None


def processor():
    """The CPU's model name (``/proc/cpuinfo``, else what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor()


def gpu_name():
    """The first GPU's name, or None (none, or a CUDA that answers is_available but not the name)."""
    if not executor.has_cuda():
        return None
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # pragma: no cover
        return None


def machine_name():
    """This machine in a few words."""
    gpu = gpu_name()
    return f"{processor()}, {os.cpu_count()} CPUs" + (f", GPU {gpu}" if gpu else "")
