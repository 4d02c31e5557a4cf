"""Every variant, in both families, trains a few steps under bfloat16 autocast on CPU with a finite loss
and finite gradients, also with extreme logits (the float16 / ``--fp16`` check needs a GPU)."""

import pytest
import torch

from bet_fairseq.attention import VARIANTS
from cli_utils import TINY_LM, TINY_TRANSLATION, build_model, toy_dictionaries, variant_flags

FAMILIES = {
    "translation": ["--task", "translation", "--source-lang", "de", "--target-lang", "en", "--arch", "vanilla_iwslt",
                    *TINY_TRANSLATION],
    "lm": ["--task", "language_modeling", "--arch", "transformer_lm_wikitext2", "--tokens-per-sample", "16",
           *TINY_LM],
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return toy_dictionaries(tmp_path_factory.mktemp("dicts"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("mode", sorted(VARIANTS))
def test_bfloat16_training_steps_stay_finite(data, family, mode):
    torch.manual_seed(0)
    model, _, _ = build_model([data, *FAMILIES[family], *variant_flags(mode), "--dropout", "0.1"])
    model.train()
    with torch.no_grad():  # extreme logits: every decoder self-attention's queries scaled up a hundredfold
        for name, p in model.named_parameters():
            if "decoder" in name and "self_attn.q_proj.weight" in name:
                p.mul_(100.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    src = torch.randint(4, 50, (3, 6))
    prev = torch.randint(4, 50, (3, 9))
    prev[:, 0] = 2
    target = torch.randint(4, 50, (3, 9))
    for _ in range(3):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(src, torch.full((3,), 6), prev)[0] if family == "translation" else model(prev)[0]
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1))
        assert torch.isfinite(loss), f"{mode} ({family}): loss {loss}"
        loss.backward()
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, f"{mode} ({family}): non-finite gradients in {bad[:3]}"
        optimizer.step()
