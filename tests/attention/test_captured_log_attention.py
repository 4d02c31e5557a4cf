"""``captured_log_attention``, the log-space attention that losses on attention use (BET(SG)'s pointer
loss), against the float64 reference for every variant, also where float32 probabilities underflow."""

import pytest
import torch

from bet_fairseq.attention import VARIANTS
from conftest import make_sharp
from reference import reference_for

T, B, E, H = 7, 2, 16, 4


@pytest.mark.parametrize("mode", sorted(VARIANTS))
def test_log_attention_matches_the_float64_reference(mode):
    torch.manual_seed(1)
    m = make_sharp(mode, E, H)
    with torch.no_grad():  # sharp rows: some weights far below float32's smallest number (about 1e-45)
        # BET's R in (0, 1) damps the logits; the Hopfield library's normal(0.02) initialisation is small
        m.q_proj.weight.mul_(400.0 if mode in ("bet_sf", "hopfield") else 40.0)
        if mode == "hopfield":
            m.k_proj.weight.mul_(50.0)
    x = torch.randn(T, B, E)
    ref = reference_for(m, x)
    m.capture_attention = True
    m(x, x, x, attn_mask=torch.triu(torch.full((T, T), float("-inf")), 1), need_weights=False)
    got = m.captured_log_attention
    assert got is not None and got.dtype == torch.float32
    visible = ref.probs > 1e-300  # float64 still holds these: compare logs there
    expected = ref.probs.clamp_min(1e-300).log()
    torch.testing.assert_close(got.double()[visible], expected[visible], atol=2e-3, rtol=1e-4)
    future = torch.ones(T, T, dtype=torch.bool).triu(1).expand_as(got)
    assert (got[future] == float("-inf")).all()  # masked keys: log 0
    if mode not in ("sparse_topk",):  # top-k removes the tiny weights itself
        underflow = visible & (m.captured_attention.double() == 0)
        assert underflow.any(), "no float32 underflow: sharpen the test"
