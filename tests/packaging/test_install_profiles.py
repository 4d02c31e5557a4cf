"""The installation profiles: ``pip install .`` into a fresh virtual environment that holds only torch gives a working
``bet_fairseq.core`` without fairseq or spaCy; ``pip install '.[hf]'`` adds transformers and a working
``bet_fairseq.hf``. The README's examples run there. Minutes: runs with BET_TEST_INSTALL_PROFILES=1 only."""

import os
import shutil
import subprocess
import sys
import time
import venv

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "core"))
from test_readme_example import run_readme_example  # noqa: E402

TORCH = "torch==2.13.0"  # the CPU build this machine's pip finds on local disk

pytestmark = [
    pytest.mark.install_profiles,
    pytest.mark.timeout(3600),  # two fresh environments installed from scratch: beyond the suite's 10 minutes a test
    pytest.mark.skipif(os.environ.get("BET_TEST_INSTALL_PROFILES") != "1",
                       reason="builds virtual environments (minutes): set BET_TEST_INSTALL_PROFILES=1"),
]


def pip(python, *args):
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"pip install {' '.join(args)} failed:\n{proc.stderr[-4000:]}"


def importable(python, name) -> bool:
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({name!r}) else 1)"
    return subprocess.run([python, "-c", probe], cwd="/").returncode == 0


def source_copy(target):
    """The tracked and untracked-but-not-ignored files of the checkout (what a release holds), so that pip builds
    from a clean tree and leaves nothing in the checkout."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(os.path.dirname(os.path.join(target, name)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), os.path.join(target, name))
    return target


def test_torch_only_install_then_the_hf_extra(tmp_path):
    start = time.time()
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    pip(python, TORCH)
    repo = source_copy(str(tmp_path / "repo"))
    pip(python, repo)
    for absent in ("fairseq", "spacy", "transformers", "sacrebleu"):
        assert not importable(python, absent), f"pip install . pulled in {absent}"
    work = tmp_path / "work"
    work.mkdir()
    old = os.environ.pop("PYTHONPATH", None)  # the installed package, not this checkout
    try:
        for marker in ("core-example", "core-cache-example"):
            run_readme_example(marker, python, cwd=str(work))
        pip(python, f"{repo}[hf]")
        assert importable(python, "transformers") and not importable(python, "fairseq")
        run_readme_example("hf-example", python, cwd=str(work))
    finally:
        if old is not None:
            os.environ["PYTHONPATH"] = old
    print(f"install profiles: {time.time() - start:.0f} s")
