"""BET(SF)'s CPU training kernel (both passes on one Q K^T per query range, recomputed in the backward)
against the equations computed densely in float64: outputs and gradients, several query ranges, right
padding, the DiagFreeMask options; and that it is the path taken."""

import pytest
import torch

from bet_fairseq.core import kernels
from bet_fairseq.core.kernels import query_chunks
from bet_fairseq.core.paths import bet_sf_fused
from bet_fairseq.core.masks import causal_allowed

B, H, D = 2, 2, 4


def dense_bet_sf(q, k, v, w, allowed, keep_diagonal):
    """The paper's equations, float64, H = A V formed in full, R from [H ; K] per head."""
    q, k, v, w = (t.double() for t in (q, k, v, w))
    scores = q @ k.transpose(-1, -2)
    first = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    h = first @ v
    w = w.expand(H, -1)
    r = torch.sigmoid(torch.einsum("bhtd,hd->bht", torch.cat([h, k], -1), w))
    final = allowed.clone().expand(q.size(0), 1, -1, -1).clone()
    if not keep_diagonal:
        tgt = q.size(2)
        for i in range(tgt):
            if final[:, :, i, :i].any():  # every row here has history except row 0
                final[:, :, i, i] = False
    return torch.softmax((scores * r[:, :, None, :]).masked_fill(~final, float("-inf")), -1) @ v


@pytest.mark.parametrize("tgt", [7, 300])
@pytest.mark.parametrize("keep_diagonal, shared_w, right_pad", [(False, False, False), (True, False, True),
                                                               (False, True, True)])
def test_kernel_matches_the_equations(monkeypatch, tgt, keep_diagonal, shared_w, right_pad):
    torch.manual_seed(tgt)
    q, k, v = (torch.randn(B, H, tgt, D, requires_grad=True) for _ in range(3))
    w = torch.randn(1 if shared_w else H, 2 * D, requires_grad=True)
    allowed = causal_allowed(tgt, tgt)
    if right_pad:  # sentence 1 ends 3 tokens early: its padded keys are masked, no row is left without keys
        pad = torch.zeros(B, tgt, dtype=torch.bool)
        pad[1, -3:] = True
        allowed = allowed & ~pad.view(B, 1, 1, tgt)
    calls = []
    kernel = kernels._BetSFCausal.apply
    monkeypatch.setattr(kernels._BetSFCausal, "apply", lambda *a: calls.append(a[-1]) or kernel(*a))
    got = bet_sf_fused(q, k, v, w, allowed, keep_diagonal)
    assert len(calls) == 1 and [(s, e) for s, e, _, _ in calls[0]] == query_chunks(allowed, tgt, tgt)
    # first masked key column per range: row s masks key s + 1 on (causal); DiagFreeMask also key s itself,
    # except row 0's lone diagonal (padding sits in later columns)
    assert [(c1, c2) for s, _, c1, c2 in calls[0]] == [
        (s + 1, s + 1 if keep_diagonal or s == 0 else s) for s, _ in query_chunks(allowed, tgt, tgt)]
    assert len(calls[0]) == (4 if tgt == 300 else 1)  # 300 // 64 ranges
    want = dense_bet_sf(q, k, v, w, allowed, keep_diagonal)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    grad_out = torch.randn_like(want)
    grads_got = torch.autograd.grad((got.double() * grad_out).sum(), (q, k, v, w))
    grads_want = torch.autograd.grad((want * grad_out).sum(), (q, k, v, w))
    for name, g, g_want in zip("qkvw", grads_got, grads_want):
        torch.testing.assert_close(g.double(), g_want.double(), atol=1e-5, rtol=1e-4, msg=lambda m: f"gradient of {name}: {m}")


def test_query_ranges_only_for_causal_masks():
    tgt = 512
    assert query_chunks(causal_allowed(tgt, tgt), tgt, tgt) == [(i * 64, (i + 1) * 64) for i in range(8)]
    assert query_chunks(causal_allowed(100, 100), 100, 100) == [(0, 100)]  # under 2 x 64 rows: one range
    assert len(query_chunks(causal_allowed(2048, 2048), 2048, 2048)) == 16  # at most 16 ranges of 128
    everything = torch.ones(1, 1, tgt, tgt, dtype=torch.bool)  # a query may see a later key: one range
    assert query_chunks(everything, tgt, tgt) == [(0, tgt)]
    assert query_chunks(None, tgt, tgt) == [(0, tgt)]


@pytest.mark.parametrize("keep_diagonal", [False, True])
def test_mask_free_causal_sdpa_form_matches_the_equations(keep_diagonal):
    """The GPU form (no mask tensor: is_causal, DiagFreeMask as the causal mask shifted by one key), run on CPU."""
    torch.manual_seed(3)
    tgt = 9
    q, k, v = (torch.randn(B, H, tgt, D, requires_grad=True) for _ in range(3))
    w = torch.randn(H, 2 * D, requires_grad=True)
    got = kernels.bet_sf_causal_sdpa(q, k, v, w, keep_diagonal)
    want = dense_bet_sf(q, k, v, w, causal_allowed(tgt, tgt), keep_diagonal)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    grads_got = torch.autograd.grad(got.square().sum(), (q, k, v, w))
    grads_want = torch.autograd.grad(want.square().sum(), (q, k, v, w))
    for g, g_want in zip(grads_got, grads_want):
        torch.testing.assert_close(g.double(), g_want.double(), atol=1e-5, rtol=1e-4)


def test_first_pass_by_query_ranges_matches_the_equations():
    """The CPU first pass of the other paths (bfloat16, attention dropout): A (V w_h) and its gradients, 3 ranges."""
    torch.manual_seed(4)
    tgt = 200
    q, k, vw = torch.randn(B, H, tgt, D, requires_grad=True), torch.randn(B, H, tgt, D, requires_grad=True), \
        torch.randn(B, H, tgt, 1, requires_grad=True)
    allowed = causal_allowed(tgt, tgt)
    assert len(query_chunks(allowed, tgt, tgt)) == 3
    got = kernels.first_pass_value_scores(q, k, vw, allowed, use_sdpa=False)
    scores = (q.double() @ k.double().transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
    want = torch.softmax(scores, -1) @ vw.double()
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)
    for g, g_want in zip(torch.autograd.grad(got.square().sum(), (q, k, vw)),
                         torch.autograd.grad(want.square().sum(), (q, k, vw))):
        torch.testing.assert_close(g.double(), g_want.double(), atol=1e-5, rtol=1e-4)


def test_kernel_with_key_scores_that_underflow_to_zero():
    """R_j = 0 exactly in float32 (a large w): the forward reuses the first pass's masked logits for D * R, so a
    masked logit of -inf would turn into 0 * -inf = NaN there; the result must still be the equations'."""
    torch.manual_seed(5)
    tgt = 150
    q, k, v = (torch.randn(B, H, tgt, D, requires_grad=True) for _ in range(3))
    w = (torch.randn(H, 2 * D) * 60).requires_grad_()
    allowed = causal_allowed(tgt, tgt)
    first = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~allowed, float("-inf")), -1)
    r32 = torch.sigmoid(torch.einsum("bhtd,hd->bht", torch.cat([first @ v, k], -1), w))
    assert (r32 == 0).any() and (r32 > 0).any()  # the case under test: some keys' R underflows to 0
    got = bet_sf_fused(q, k, v, w, allowed)
    want = dense_bet_sf(q, k, v, w, allowed, keep_diagonal=False)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    for g, g_want in zip(torch.autograd.grad(got.square().sum(), (q, k, v)),
                         torch.autograd.grad(want.square().sum(), (q, k, v))):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.double(), g_want.double(), atol=1e-4, rtol=1e-4)


def test_masks_remembered_between_calls_follow_the_mask():
    """``bet_sf_fused`` remembers what it derives from the last mask (every layer of a forward passes the same one):
    alternating masks, and one edited in place, must each give their own equations."""
    torch.manual_seed(6)
    tgt = 140
    q, k, v = (torch.randn(B, H, tgt, D) for _ in range(3))
    w = torch.randn(H, 2 * D)
    causal = causal_allowed(tgt, tgt)
    pad = torch.zeros(B, 1, 1, tgt, dtype=torch.bool)
    pad[0, ..., -5:] = True
    padded = causal & ~pad
    for allowed in (causal, padded, causal, padded):
        torch.testing.assert_close(bet_sf_fused(q, k, v, w, allowed).double(),
                                   dense_bet_sf(q, k, v, w, allowed, False), atol=1e-5, rtol=1e-5)
    padded[1, ..., -2:] = False  # the same tensor, written in place
    torch.testing.assert_close(bet_sf_fused(q, k, v, w, padded).double(), dense_bet_sf(q, k, v, w, padded, False),
                               atol=1e-5, rtol=1e-5)
