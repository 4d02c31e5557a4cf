"""The fast paths of BirdEyeMultiheadAttention (bet_sf) against the naive reference.

Covers what tests/test_attention.py does not reach since the CPU dispatch: the SDPA path itself
(forced with ``cpu_exact_max_keys = 0``), its first pass on the value scores V w_h (both the CPU
form and the padded SDPA form used on GPUs), and the mask-free one-step decoding path with the
cached V w_h, each compared with tests/reference_attention.py.
"""

import pytest
import torch

from bet_fairseq.modules import BirdEyeMultiheadAttention
from reference_attention import reference_self_attention

E, H, T, B = 16, 4, 7, 3
BET_MODES = [dict(mode="bet_sf"), dict(mode="bet_sf", keep_diagonal=True), dict(mode="bet_sf", share_w=True)]
BET_IDS = ["bet_sf", "keepdiag", "sharew"]


def future_mask(n):
    return torch.triu(torch.full((n, n), float("-inf")), 1)


def make(settings, seed=0):
    torch.manual_seed(seed)
    m = BirdEyeMultiheadAttention(E, H, dropout=0.0, **settings).eval()
    if m.bet_w is not None:
        with torch.no_grad():
            m.bet_w.normal_(0, 0.5)
    return m


def ref(m, x, kpm=None):
    return reference_self_attention(x, m, m.mode, m.diag_scale, m.keep_diagonal, m.bet_w, kpm)


@pytest.mark.parametrize("settings", BET_MODES, ids=BET_IDS)
def test_sdpa_path_matches_reference_with_padding(settings):
    m = make(settings)
    m.cpu_exact_max_keys = 0  # force SDPA for the second pass
    x = torch.randn(T, B, E)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[0, -3:] = True
    out, _ = m(x, x, x, key_padding_mask=kpm, attn_mask=future_mask(T), need_weights=False)
    ref_out, _, _, _ = ref(m, x, kpm)
    keep = ~kpm.T
    torch.testing.assert_close(out.double()[keep], ref_out[keep], atol=1e-5, rtol=1e-5)


def test_dispatch_takes_exact_path_on_short_cpu_sequences(monkeypatch):
    m = make(dict(mode="bet_sf"))
    calls = []
    monkeypatch.setattr(m, "_fused_attention", lambda *a: calls.append("fused") or (_ for _ in ()).throw(
        AssertionError("SDPA path taken")))
    x = torch.randn(T, B, E)
    m(x, x, x, attn_mask=future_mask(T), need_weights=False)  # T <= cpu_exact_max_keys: exact
    m.cpu_exact_max_keys = 0
    with pytest.raises(AssertionError, match="SDPA path taken"):
        m(x, x, x, attn_mask=future_mask(T), need_weights=False)


@pytest.mark.parametrize("use_sdpa", [False, True], ids=["cpu_form", "gpu_sdpa_form"])
def test_first_pass_value_scores_equal_h_dot_w(use_sdpa):
    """softmax(D) (V w) == (softmax(D) V) w, written out by hand."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, H, T, E // H, dtype=torch.double) for _ in range(3))
    w = torch.randn(H, E // H, 1, dtype=torch.double)
    allowed = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    got = BirdEyeMultiheadAttention._first_pass_value_scores(q, k, torch.matmul(v, w), allowed, use_sdpa)
    a = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~allowed, float("-inf")), dim=-1)
    h = a @ v  # the first-pass output H
    expected = torch.stack([h[:, i] @ w[i] for i in range(H)], dim=1)
    tol = 1e-10 if use_sdpa else 1e-6  # the CPU form takes its softmax in float32, like the module
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("settings", BET_MODES + [dict(mode="diag_free")], ids=BET_IDS + ["diagfree"])
def test_one_step_decoding_matches_reference(settings):
    """Beam-search steps (no masks, cached R and V w_h) against the naive full-sequence reference."""
    m = make(settings)
    x = torch.randn(T, B, E)
    ref_out, ref_probs, _, ref_r = ref(m, x)
    state, outs = {}, []
    for t in range(T):
        xt = x[t : t + 1]
        out, w = m(xt, xt, xt, incremental_state=state, need_head_weights=True)
        outs.append(out)
        # the step's weights are the reference's row t (future keys do not exist yet)
        torch.testing.assert_close(w.transpose(0, 1)[:, :, 0].double(), ref_probs[:, :, t, : t + 1],
                                   atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(torch.cat(outs).double(), ref_out, atol=1e-5, rtol=1e-5)
    saved = m._get_input_buffer(state)
    if m.mode == "bet_sf":
        torch.testing.assert_close(saved["prev_bet_r"].double(), ref_r, atol=1e-6, rtol=1e-5)
        assert saved["prev_bet_vw"].shape == (B, H, T), "V w_h is cached batch-first, one value per key"


def test_decoding_with_padding_in_the_cache_matches_reference():
    """The masked (non-shortcut) step path: a left-padded prefix, as with fairseq's prefix tokens."""
    m = make(dict(mode="bet_sf"))
    x = torch.randn(T, B, E)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[2, :2] = True  # sentence 2 starts at position 2
    ref_out, _, _, _ = ref(m, x, kpm)
    state, outs = {}, []
    for t in range(T):
        xt = x[t : t + 1]
        out, _ = m(xt, xt, xt, key_padding_mask=kpm[:, t : t + 1], incremental_state=state, need_weights=False)
        outs.append(out)
    got = torch.cat(outs).double()
    assert torch.isfinite(got[2:]).all(), "NaN from the fully padded first rows leaked into later steps"
    torch.testing.assert_close(got[:, :2], ref_out[:, :2], atol=1e-5, rtol=1e-5)
    # the padded sentence equals its unpadded suffix decoded on its own (the reference cannot take
    # left padding: its fully masked rows are NaN and spread through R)
    suffix_out, _, _, _ = ref(m, x[2:, 2:3])
    torch.testing.assert_close(got[2:, 2:3], suffix_out, atol=1e-5, rtol=1e-5)
