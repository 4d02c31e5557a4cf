"""The README's Python examples run as written and are what they say: a causal BET(SF) block that imports no
fairseq, a BET GPT-2 that trains, saves, loads and generates, and (docs/huggingface.md) a cached decoder. Every
Python block of the README is such a marked, checked example; the Python blocks of docs/*.md at least compile.
The README's and the docs' console commands: tests/test_documented_commands.py."""

import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def page_text(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def readme_example(marker: str = "core-example") -> str:
    """The Python block after ``<!-- test:MARKER -->`` in README.md or docs/*.md (exactly one)."""
    blocks = [block for page in PAGES
              for block in re.findall(rf"<!-- test:{marker} -->\n```python\n(.*?)```", page_text(page), flags=re.S)]
    assert len(blocks) == 1, f"README.md and docs/ hold {len(blocks)} marked {marker} examples, not one"
    return blocks[0]


NO_FAIRSEQ = """
import sys
assert not any(name == "fairseq" or name.startswith("fairseq.") for name in sys.modules), "imported fairseq"
"""

CHECKS = {
    "core-example": """
assert y.shape == x.shape and attention.shape == (2, 4, 10, 10)
assert torch.allclose(attention.sum(-1), torch.ones(2, 4, 10))
assert float(attention.detach().triu(1).abs().max()) == 0.0   # causal
assert float(attention.detach().diagonal(dim1=-2, dim2=-1)[..., 1:].abs().max()) == 0.0  # DiagFreeMask; row 0 keeps it
block.eval()
x2 = x.clone(); x2[:, 6:] = torch.randn(2, 4, 64)               # change the future
assert torch.equal(block(x)[:, :6], block(x2)[:, :6])           # the past does not move
""",
    "core-cache-example": """
assert len(cache) == 10 and steps.shape == x.shape
""",
    "hf-example": """
assert type(model).__name__ == "BetGPT2LMHeadModel" and out.shape == (2, 12)
""",
}


def run_readme_example(marker: str, python: str = sys.executable, cwd: str = ROOT):
    """The example and its checks in a fresh interpreter ``python`` (this test process has fairseq loaded)."""
    code = readme_example(marker) + CHECKS[marker] + NO_FAIRSEQ
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("marker", ["core-example", "core-cache-example"])
def test_readme_core_examples_run_without_fairseq(marker):
    run_readme_example(marker)


def test_readme_hf_example_runs_without_fairseq(tmp_path):
    pytest.importorskip("transformers")
    run_readme_example("hf-example", cwd=str(tmp_path))  # it saves a model into its working directory


def test_every_readme_python_block_is_a_checked_example():
    """A Python block added to the README without a marker and checks would never run: each one is marked."""
    text = page_text("README.md")
    blocks = re.findall(r"^```python\n", text, flags=re.M)
    marked = re.findall(r"<!-- test:([\w-]+) -->\n```python\n", text)
    assert len(marked) == len(blocks) >= 2, f"{len(blocks)} Python blocks in README.md, {len(marked)} marked"
    assert set(marked) <= set(CHECKS), f"README examples without checks: {set(marked) - set(CHECKS)}"


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_of_the_docs_compile(page):
    for i, block in enumerate(re.findall(r"^```python\n(.*?)^```", page_text(page), flags=re.S | re.M)):
        compile(block, f"{page}, Python block {i + 1}", "exec")
