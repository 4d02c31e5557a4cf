"""The baseline self-attentions (Yang et al. 2018 localness, Zhao et al. 2019 top-k, the Hopfield layer)
against the naive loop-by-loop readings of their papers in tests/reference.py, against fairseq, in
incremental decoding and beam-search reordering, and their parameters and capture."""

import math

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from conftest import assert_decoding_consistent, assert_matches_reference, full_forward, make_attention, make_sharp, padding_mask
from reference import reference_for

E, H, T, B = 16, 4, 11, 3
D = E // H
CASES = [
    ("localness", {}),
    ("sparse_topk", dict(sparse_topk=3)),
    ("sparse_topk", dict(sparse_topk=8)),
    ("sparse_topk", {}),  # the default k
    ("hopfield", dict(hopfield_config="attention")),  # the library configuration: test_hopfield_library.py
    ("hopfield", dict(hopfield_config="attention", hopfield_beta=0.9, hopfield_steps=3)),
]
IDS = ["localness", "topk3", "topk8", "topk_default", "hopfield", "hopfield_beta0.9_steps3"]


@pytest.mark.parametrize("mode, options", CASES, ids=IDS)
@pytest.mark.parametrize("fused", [False, True], ids=["exact", "fused"])
def test_forward_and_weights_match_reference(mode, options, fused):
    m = make_sharp(mode, E, H, **options)
    m.use_fused_attention = fused
    x = torch.randn(T, B, E)
    ref = reference_for(m, x)
    out, _ = full_forward(m, x, need_weights=False)
    torch.testing.assert_close(out.double(), ref.out, atol=1e-5, rtol=1e-5)
    _, w = full_forward(m, x, need_head_weights=True)
    torch.testing.assert_close(w.transpose(0, 1).double(), ref.probs, atol=1e-6, rtol=1e-5)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    assert torch.all(w[..., future] == 0)
    if mode == "sparse_topk":  # random logits have no ties: exactly min(k, i + 1) keys per row
        k = options.get("sparse_topk", 8)
        kept = (w > 0).sum(-1)
        assert torch.equal(kept, torch.clamp(torch.arange(1, T + 1), max=k).expand_as(kept))


@pytest.mark.parametrize("mode, options", CASES[::2], ids=IDS[::2])
def test_padding_matches_reference(mode, options):
    kpm = padding_mask(B, T, left=[(2, 2)], right=[(1, 3)])
    assert_matches_reference(make_sharp(mode, E, H, **options), torch.randn(T, B, E), kpm)


def test_localness_window_lies_in_the_visible_prefix():
    m = make_sharp("localness", E, H, localness_centre_scale="i+1")  # version 0.1's I_i = i + 1
    x = torch.randn(T, B, E) * 3
    positions = torch.arange(T)
    centre, width = m.window(m.q_proj(x), positions)
    assert centre.shape == (B, T)
    assert torch.all(centre > 0) and torch.all(centre < positions + 1)
    assert torch.all(width > 0) and torch.all(width < positions + 1)


def test_hopfield_one_step_is_fairseq_attention():
    """beta = 1/sqrt(d), one step: standard attention with the value weights W_V' = W_K W_V; load a
    fairseq MultiheadAttention's weights with W_V solved for, and compare outputs and weights."""
    torch.manual_seed(1)
    fs = MultiheadAttention(E, H, self_attention=True, dropout=0.0).eval()
    hop = make_attention("hopfield", E, H, hopfield_config="attention")
    assert hop.hopfield_beta == pytest.approx(1 / math.sqrt(D)) and hop.hopfield_steps == 1
    state = {n: p.detach().clone() for n, p in fs.state_dict().items()}
    Wk, bk = state["k_proj.weight"].double(), state["k_proj.bias"].double()
    Wv_fs, bv_fs = state["v_proj.weight"].double(), state["v_proj.bias"].double()
    Wv = Wv_fs @ torch.linalg.inv(Wk)  # (x Wk^T + bk) Wv^T + bv == x Wv_fs^T + bv_fs
    state["v_proj.weight"] = Wv.float()
    state["v_proj.bias"] = (bv_fs - Wv @ bk).float()
    hop.load_state_dict(state)
    x = torch.randn(T, B, E)
    expected, expected_w = full_forward(fs, x, need_weights=True)
    got, got_w = full_forward(hop, x, need_weights=True)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_w, expected_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode, options", CASES, ids=IDS)
def test_incremental_equals_full_and_reorder(mode, options):
    assert_decoding_consistent(make_sharp(mode, E, H, **options), torch.randn(T, B, E), torch.tensor([2, 0, 0]), 4)


@pytest.mark.parametrize("mode", ["localness", "sparse_topk", "hopfield"])
def test_parameters_and_capture(mode):
    m = make_sharp(mode, E, H, **({"hopfield_config": "attention"} if mode == "hopfield" else {}))
    vanilla = MultiheadAttention(E, H, self_attention=True)
    n_extra = sum(p.numel() for p in m.parameters()) - sum(p.numel() for p in vanilla.parameters())
    assert n_extra == (E * E + 2 * E if mode == "localness" else 0)  # W_p, U_p, U_d
    m.capture_attention = True
    x = torch.randn(T, B, E)
    full_forward(m, x, need_weights=False)
    torch.testing.assert_close(m.captured_attention.double(), reference_for(m, x).probs, atol=1e-6, rtol=1e-5)
