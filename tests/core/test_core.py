"""The plain-PyTorch math of ``bet_fairseq.core`` (no fairseq module involved): masks, the safe softmax,
each variant's functions, BET(SF) exact == fused, and ``BirdEyeSelfAttention`` against the reference."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from bet_fairseq.core import (
    BirdEyeSelfAttention,
    bet_sf_attention,
    causal_allowed,
    diagonal_free,
    hopfield_logits,
    localness_bias,
    masked_softmax,
    own_position,
    relative_logits,
    relative_sinusoids,
    safe_sdpa,
    scale_diagonal,
    top_k_keep,
)
from bet_fairseq.core.baselines import nearest_centroid, routing_vectors
from bet_fairseq.core.kernels import first_pass_value_scores
from bet_fairseq.core.paths import bet_sf_fused
from conftest import padding_mask
from reference import NEG, reference_attention, reference_first_pass_value_scores, route, sinusoid, softmax_row

E, H, T, B = 16, 4, 7, 3
D = E // H


def qkv(seed=0, bsz=2, heads=H, tgt=T, src=T, dim=D, dtype=torch.float):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(bsz, heads, tgt, dim, generator=g, dtype=dtype)
    k, v = (torch.randn(bsz, heads, src, dim, generator=g, dtype=dtype) for _ in range(2))
    return q, k, v


def padded_allowed(bsz=2, tgt=T, src=T, left=3, right=2):
    """Causal, with batch row 0 left-padded (``left`` queries without keys) and row 1 right-padded."""
    kpm = padding_mask(bsz, src, left=[(0, left)], right=[(1, right)])
    return causal_allowed(tgt, src) & ~kpm.view(bsz, 1, 1, src)


# ------------------------------------------------------------------------------- masks
def test_masks_worked_by_hand():
    assert causal_allowed(2, 4).int().tolist() == [[[[1, 1, 1, 0], [1, 1, 1, 1]]]]  # the last 2 of 4 positions
    assert own_position(2, 4).int().tolist() == [[0, 0, 1, 0], [0, 0, 0, 1]]
    allowed = causal_allowed(3, 3)
    assert diagonal_free(allowed).int().tolist() == [[[[1, 0, 0], [1, 0, 0], [1, 1, 0]]]]  # row 0 keeps itself
    padded = allowed & torch.tensor([True, False, True])  # key 1 is padding: row 1 has only itself
    assert diagonal_free(padded).int().tolist() == [[[[1, 0, 0], [1, 0, 0], [1, 0, 0]]]]
    no_history = allowed & torch.tensor([False, True, True])
    assert diagonal_free(no_history).int().tolist() == [[[[0, 0, 0], [0, 1, 0], [0, 1, 0]]]]


def test_masked_softmax_and_safe_sdpa_give_zero_rows_and_finite_gradients_without_keys():
    q, k, v = qkv(1)
    q.requires_grad_(True)
    allowed = padded_allowed()
    logits = torch.matmul(q, k.transpose(-1, -2))
    probs = masked_softmax(logits, allowed)
    empty = ~allowed.any(-1)  # (B, 1, T): the first 3 queries of row 0
    assert int(empty.sum()) == 3
    assert torch.all(probs[empty.expand(-1, H, -1)] == 0)
    expected = torch.tensor([softmax_row([float(a) if ok else NEG for a, ok in zip(row, ok_row)])
                             for row, ok_row in zip(logits[1, 0].tolist(), allowed[1, 0].tolist())])
    torch.testing.assert_close(probs[1, 0], expected)
    out = safe_sdpa(q, k, v, allowed)
    torch.testing.assert_close(out, torch.matmul(probs, v), atol=1e-6, rtol=1e-5)
    assert torch.all(out[empty.expand(-1, H, -1)] == 0)
    for result in (probs, out):
        (grad,) = torch.autograd.grad(result.square().sum(), q)
        assert torch.isfinite(grad).all()
    torch.testing.assert_close(masked_softmax(logits, None), logits.softmax(-1))


def test_masked_softmax_runs_in_float32_under_bfloat16():
    logits = (torch.randn(2, H, T, T) * 8).bfloat16()
    allowed = causal_allowed(T, T)
    assert masked_softmax(logits, allowed).dtype == torch.bfloat16
    got = masked_softmax(logits, allowed, torch.float32)
    expected = F.softmax(logits.float().masked_fill(~allowed, NEG), dim=-1)
    assert got.dtype == torch.float32 and torch.equal(got, expected)  # not a bfloat16 softmax cast up


# ------------------------------------------------------------------------------- variants' functions
def test_scale_diagonal_worked_by_hand():
    logits = torch.arange(8.0).view(2, 4)  # the last 2 queries of 4 positions
    assert scale_diagonal(logits, 0.5).tolist() == [[0.0, 1.0, 1.0, 3.0], [4.0, 5.0, 6.0, 3.5]]


def test_top_k_ties_and_short_rows_worked_by_hand():
    allowed = torch.tensor([[True, True, True, True, False]])
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0, 9.0]])  # 9.0 is not allowed (future/padding)
    assert top_k_keep(logits, allowed, 1).tolist() == [[True, False, True, False, False]]  # tie at the top
    assert top_k_keep(logits, allowed, 2).tolist() == [[True, False, True, False, False]]
    assert top_k_keep(logits, allowed, 3).tolist() == [[True, False, True, True, False]]
    assert top_k_keep(logits, allowed, 8).tolist() == [[True, True, True, True, False]]  # fewer than k
    tie = torch.tensor([[5.0, 2.0, 2.0, 1.0]])
    assert top_k_keep(tie, torch.ones(1, 4, dtype=torch.bool), 2).tolist() == [[True, True, True, False]]
    assert top_k_keep(tie, None, 1).tolist() == [[True, False, False, False]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_localness_bias_is_the_gaussian_in_float32(dtype):
    centre = torch.tensor([[0.5, 2.0]], dtype=dtype)
    width = torch.tensor([[1.0, 0.002]], dtype=dtype)  # the second window is very narrow
    bias = localness_bias(centre, width, 4)
    assert bias.shape == (1, 1, 2, 4) and bias.dtype == torch.float32
    assert torch.isfinite(bias).all(), "a narrow window overflowed (half-precision bias)"
    c, w = centre.double().tolist()[0], width.double().tolist()[0]
    expected = [[-((j - c[i]) ** 2) / (2 * (w[i] / 2) ** 2) for j in range(4)] for i in range(2)]
    torch.testing.assert_close(bias[0, 0].double(), torch.tensor(expected, dtype=torch.double), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 3])
def test_hopfield_logits_against_the_update_rule(steps):
    q, k, _ = qkv(2, bsz=1, heads=1)
    beta, allowed = 0.8, causal_allowed(T, T)
    got = hopfield_logits(q, k, beta, steps, allowed)
    for i in range(T):
        xi = q[0, 0, i].double()
        for _ in range(steps - 1):
            p = softmax_row([beta * float(xi @ k[0, 0, j].double()) if j <= i else NEG for j in range(T)])
            xi = sum(p[j] * k[0, 0, j].double() for j in range(T))
        expected = torch.stack([beta * xi @ k[0, 0, j].double() for j in range(i + 1)])
        torch.testing.assert_close(got[0, 0, i, : i + 1].double(), expected, atol=1e-5, rtol=1e-5)


def test_relative_sinusoids_and_logits():
    torch.testing.assert_close(relative_sinusoids(5, 8).double(),
                               torch.tensor([sinusoid(d, 8) for d in range(5)], dtype=torch.double))
    with pytest.raises(ValueError, match="even model dimension"):
        relative_sinusoids(3, 7)
    q, k, _ = qkv(3, tgt=3, src=5)  # 3 queries after 2 memory positions
    r, u, v = torch.randn(H, 5, D), torch.randn(H, D), torch.randn(H, D)
    got = relative_logits(q, k, r, u, v)
    for b, h, i, j in [(0, 0, 0, 0), (1, 2, 1, 3), (0, 3, 2, 4), (1, 1, 2, 0)]:
        dist = 2 + i - j
        expected = (q[b, h, i] + u[h]) @ k[b, h, j] + (q[b, h, i] + v[h]) @ r[h, dist]
        torch.testing.assert_close(got[b, h, i, j], expected)


def test_routing_vectors_and_nearest_centroid_against_reference():
    x = torch.randn(2, 2, 5, D).bfloat16()
    vec = routing_vectors(x)
    assert vec.dtype == torch.float32  # at least float32, whatever comes in
    centroids = F.normalize(torch.randn(2, 3, D), dim=-1)
    got = nearest_centroid(vec, centroids)
    for b in range(2):
        for h in range(2):
            for t in range(5):
                cluster, z = route(x[b, h, t].float(), centroids[h].tolist())
                torch.testing.assert_close(vec[b, h, t], torch.tensor(z, dtype=torch.float32), atol=1e-5, rtol=1e-5)
                assert int(got[b, h, t]) == cluster


# ------------------------------------------------------------------------------- BET(SF)
@pytest.mark.parametrize("use_sdpa", [False, True], ids=["cpu_form", "gpu_sdpa_form"])
def test_first_pass_value_scores_equal_h_dot_w(use_sdpa):
    """softmax(D) (V w) == (softmax(D) V) w, written out by hand."""
    q, k, v = qkv(1, dtype=torch.double)
    w = torch.randn(H, D, 1, dtype=torch.double)
    allowed = causal_allowed(T, T)
    got = first_pass_value_scores(q, k, torch.matmul(v, w), allowed, use_sdpa)
    tol = 1e-10 if use_sdpa else 1e-6  # the CPU form takes its softmax in float32, like the module
    torch.testing.assert_close(got, reference_first_pass_value_scores(q, k, v, w, allowed), atol=tol, rtol=tol)


@pytest.mark.parametrize("keep_diagonal", [False, True])
@pytest.mark.parametrize("shared_w", [False, True])
def test_bet_sf_fused_equals_exact_with_padding(keep_diagonal, shared_w):
    q, k, v = qkv(4)
    w = torch.randn(1 if shared_w else H, 2 * D)
    for t in (q, k, v, w):
        t.requires_grad_(True)
    allowed = padded_allowed()
    exact, probs, first, r, vw = bet_sf_attention(q, k, v, w, allowed, keep_diagonal)
    fused = bet_sf_fused(q, k, v, w, allowed, keep_diagonal)
    torch.testing.assert_close(fused, exact, atol=1e-5, rtol=1e-5)
    empty = (~allowed.any(-1)).expand(-1, H, -1)
    assert torch.all(exact[empty] == 0) and torch.all(fused[empty] == 0) and torch.all(probs[empty] == 0)
    assert r.shape == vw.shape == (2, H, T) and torch.all((r > 0) & (r < 1))
    grads = [torch.autograd.grad(out.square().sum(), (q, k, v, w)) for out in (exact, fused)]
    for g_exact, g_fused in zip(*grads):
        assert torch.isfinite(g_exact).all() and torch.isfinite(g_fused).all()
        torch.testing.assert_close(g_fused, g_exact, atol=1e-5, rtol=1e-4)


def test_bet_sf_one_step_with_cached_r_equals_the_full_pass():
    q, k, v = qkv(5)
    w = torch.randn(H, 2 * D)
    full, probs, _, r, vw = bet_sf_attention(q, k, v, w, causal_allowed(T, T))
    # the last query alone, everything visible (allowed=None), R and V w_h of the earlier keys cached
    step, step_probs, _, step_r, step_vw = bet_sf_attention(q[:, :, -1:], k, v, w, None, prev_r=r[..., :-1],
                                                            prev_vw=vw[..., :-1])
    torch.testing.assert_close(step, full[:, :, -1:], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(step_probs, probs[:, :, -1:], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(step_r, r, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(step_vw, vw)


# ------------------------------------------------------------------------------- the drop-in module
def make_block(seed=0, **kwargs):
    torch.manual_seed(seed)
    block = BirdEyeSelfAttention(E, H, **kwargs).eval()
    with torch.no_grad():
        block.w.normal_(0, 0.5)  # far from the init so that R varies visibly
    return block


def block_reference(block, x, padding_mask=None):
    """The reference on a batch-first input; returns (out (B, T, E), probs)."""
    ref = reference_attention(block, x.transpose(0, 1), "bet_sf", key_padding_mask=padding_mask,
                              options=SimpleNamespace(bet_keep_diagonal=block.keep_diagonal))
    return ref.out.transpose(0, 1), ref.probs


@pytest.mark.parametrize("kwargs", [{}, dict(keep_diagonal=True), dict(share_w=True)],
                         ids=["bet_sf", "keepdiag", "sharew"])
def test_bird_eye_self_attention_matches_reference(kwargs):
    block = make_block(**kwargs)
    assert block.w.shape == (1 if kwargs.get("share_w") else H, 2 * D)
    n_standard = 4 * (E * E + E)  # q, k, v and output projections
    assert sum(p.numel() for p in block.parameters()) - n_standard == block.w.numel()
    x = torch.randn(B, T, E)
    pad = padding_mask(B, T, left=[(1, 2)], right=[(2, 3)])
    for mask in (None, pad):
        ref_out, ref_probs = block_reference(block, x, mask)
        out, probs = block(x, mask, return_attention=True)
        torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(probs.double(), ref_probs, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(block(x, mask).double(), ref_out, atol=1e-5, rtol=1e-5)  # fused


def test_bird_eye_self_attention_gradients_and_bfloat16():
    block = make_block().train()
    x = torch.randn(B, T, E, requires_grad=True)
    pad = padding_mask(B, T, left=[(0, 3)])
    for exact in (False, True):
        out = block(x, pad, return_attention=exact)
        out = out[0] if exact else out
        grads = torch.autograd.grad(out.square().sum(), [x, *block.parameters()])
        assert all(torch.isfinite(g).all() for g in grads)
    block.eval()
    expected = block(x, pad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, probs = block(x, pad, return_attention=True)
        fast = block(x, pad)
    assert out.dtype == fast.dtype == torch.bfloat16
    for got in (out, fast):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.float(), expected, atol=0.1, rtol=0.05)
    rows = probs.float().sum(-1)
    real_rows = ~pad.view(B, 1, T).expand(-1, H, -1)
    torch.testing.assert_close(rows[real_rows], torch.ones(int(real_rows.sum())), atol=1e-2, rtol=0)
    assert torch.all(rows[~real_rows] == 0)


def test_bird_eye_self_attention_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="not divisible"):
        BirdEyeSelfAttention(10, 4)
