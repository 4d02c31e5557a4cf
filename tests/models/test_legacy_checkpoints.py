"""Checkpoints trained with version 0.1 (before the variants moved onto one plugin API) load with
today's code and give the outputs that code computed (tests/fixtures/legacy_v0_1/make.py)."""

import os

import pytest
import torch

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "legacy_v0_1")
EXPECTED = torch.load(os.path.join(FIXTURES, "expected.pt"), weights_only=True)
ARCHS = sorted(k for k in EXPECTED if k not in ("src_tokens", "prev_output_tokens"))


def test_every_version_0_1_architecture_name_is_registered():
    from fairseq.models import ARCH_MODEL_REGISTRY

    with open(os.path.join(FIXTURES, "arch_names.txt")) as f:
        names = [line.strip() for line in f if line.strip()]
    assert len(names) == 67
    assert [n for n in names if n not in ARCH_MODEL_REGISTRY] == []


@pytest.mark.parametrize("arch", ARCHS)
def test_legacy_checkpoint_gives_the_same_outputs(arch):
    from fairseq import checkpoint_utils

    kind = "mt" if arch.endswith("iwslt") or "iwslt_de_en" in arch else "lm"
    models, cfg = checkpoint_utils.load_model_ensemble(
        [os.path.join(FIXTURES, f"{arch}.pt")], arg_overrides=dict(data=os.path.join(FIXTURES, kind), **({"source_lang": "de", "target_lang": "en"} if kind == "mt" else {})))
    model = models[0].eval()
    src, prev = EXPECTED["src_tokens"], EXPECTED["prev_output_tokens"]
    with torch.no_grad():
        out = model(src, torch.full((src.size(0),), src.size(1)), prev)[0] if kind == "mt" else model(prev)[0]
    torch.testing.assert_close(out, EXPECTED[arch], rtol=1e-5, atol=1e-5)
