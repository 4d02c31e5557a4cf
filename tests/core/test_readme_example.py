"""The README's plain-PyTorch and Hugging Face examples run as written and are what they say: a causal BET(SF)
block and a cached decoder that import no fairseq, and a BET GPT-2 that trains, saves, loads and generates."""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


def readme_example(marker: str = "core-example") -> str:
    """The Python block after ``<!-- test:MARKER -->`` in README.md (exactly one)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(rf"<!-- test:{marker} -->\n```python\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) == 1, f"README.md lost its marked {marker} example"
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
