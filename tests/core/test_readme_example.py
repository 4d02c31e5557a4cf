"""The README's plain-PyTorch example runs as written and is what it says: a causal BET(SF) block that
imports no fairseq."""

import os
import re
import subprocess
import sys

from conftest import ROOT


def readme_example() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"<!-- test:core-example -->\n```python\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) == 1, "README.md lost its marked core example"
    return blocks[0]


CHECKS = """
import sys
assert y.shape == x.shape and attention.shape == (2, 4, 10, 10)
assert torch.allclose(attention.sum(-1), torch.ones(2, 4, 10))
assert float(attention.detach().triu(1).abs().max()) == 0.0   # causal
assert float(attention.detach().diagonal(dim1=-2, dim2=-1)[..., 1:].abs().max()) == 0.0  # DiagFreeMask; row 0 keeps it
block.eval()
x2 = x.clone(); x2[:, 6:] = torch.randn(2, 4, 64)               # change the future
assert torch.equal(block(x)[:, :6], block(x2)[:, :6])           # the past does not move
assert not any(name == "fairseq" or name.startswith("fairseq.") for name in sys.modules), "core imported fairseq"
"""


def test_readme_core_example_runs_without_fairseq():
    # A fresh interpreter: this test process has fairseq loaded already.
    code = readme_example() + CHECKS
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
