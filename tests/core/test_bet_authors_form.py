"""The authors' BET(SF) (``--bet-form authors`` / ``authors_lm``) as plain PyTorch functions (no fairseq module):
against the naive loop-by-loop reference ``reference_bet_authors``, exact == fused, one decoding step with the
cached R, dropout on the first pass, the head layout and clear errors."""

import pytest
import torch
from torch import nn

from bet_fairseq.core import bet_authors_attention, causal_allowed
from bet_fairseq.core.author_form import bet_authors_r
from bet_fairseq.core.functional import merge_heads, split_heads
from bet_fairseq.core.kernels import bet_authors_fused
from conftest import padding_mask
from reference import reference_bet_authors

E, H, T, B = 16, 4, 6, 3
D = E // H
R_INPUT = {"authors": "key", "authors_lm": "query"}


class AuthorsWeights(nn.Module):
    """The parameters the authors' form uses, named as the fairseq variant names them (the reference reads them):
    q, k, v and the first pass's ``out_proj``, ``bet_authors_w`` = Linear(2 d, 1) and ``bet_out_proj2``."""

    def __init__(self, form, keep_diagonal=False, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(E, E) for _ in range(4))
        self.bet_authors_w = nn.Linear(2 * D, 1)
        self.bet_out_proj2 = nn.Linear(E, E)
        with torch.no_grad():  # far from the init so that R varies visibly
            self.bet_authors_w.weight.normal_(0, 1.0)
            self.bet_authors_w.bias.normal_(0, 1.0)
        self.num_heads = H
        self.form, self.keep_diagonal = form, keep_diagonal
        self.options = type("Options", (), dict(bet_form=form, bet_keep_diagonal=keep_diagonal))

    def project(self, x):
        """(B, T, E) -> q (scaled), k, v as (B, H, T, d)."""
        return split_heads(self.q_proj(x), H) * D ** -0.5, split_heads(self.k_proj(x), H), split_heads(self.v_proj(x), H)

    def args(self):
        return self.bet_authors_w.weight, self.bet_authors_w.bias, self.out_proj

    def forward(self, x, pad=None, fused=False, dropout=None):
        q, k, v = self.project(x)
        allowed = causal_allowed(T, T) if pad is None else causal_allowed(T, T) & ~pad.view(B, 1, 1, T)
        if fused:
            out = bet_authors_fused(q, k, v, *self.args(), allowed, self.keep_diagonal, R_INPUT[self.form])
            return self.bet_out_proj2(merge_heads(out)), None, None, None
        out, probs, first, r = bet_authors_attention(q, k, v, *self.args(), allowed, self.keep_diagonal,
                                                     R_INPUT[self.form], dropout)
        return self.bet_out_proj2(merge_heads(out)), probs, first, r


def pad_mask():
    """Right padding (fairseq's target side) and left padding (queries without keys give zeros)."""
    return padding_mask(B, T, left=[(2, 3)], right=[(1, 2)])


@pytest.mark.parametrize("keep_diagonal", [False, True], ids=["diagfree", "keepdiag"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("form", ["authors", "authors_lm"])
def test_matches_the_loop_by_loop_reference(form, padded, keep_diagonal):
    m = AuthorsWeights(form, keep_diagonal)
    x = torch.randn(B, T, E)
    pad = pad_mask() if padded else None
    with torch.no_grad():
        out, probs, first, r = m(x, pad)
    ref = reference_bet_authors(m, x.transpose(0, 1), pad)
    torch.testing.assert_close(out.double(), ref.out.transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs.double(), ref.probs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(first.double(), ref.first, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(r.double(), ref.r, atol=1e-6, rtol=1e-5)
    assert r.shape == (B, H, T) and torch.all((r > 0) & (r < 1)) and r.std() > 0.05, "R varies"


def test_the_two_forms_differ_on_the_same_weights():
    """So that each form's reference comparison tells [K ; H] from [Q ; H]."""
    x = torch.randn(B, T, E)
    with torch.no_grad():
        outs = [AuthorsWeights(form)(x)[0] for form in ("authors", "authors_lm")]
    assert (outs[0] - outs[1]).abs().max() > 1e-2


@pytest.mark.parametrize("keep_diagonal", [False, True], ids=["diagfree", "keepdiag"])
@pytest.mark.parametrize("form", ["authors", "authors_lm"])
def test_fused_equals_exact_with_padding(form, keep_diagonal):
    m = AuthorsWeights(form, keep_diagonal)
    x = torch.randn(B, T, E, requires_grad=True)
    exact, fused = m(x, pad_mask())[0], m(x, pad_mask(), fused=True)[0]
    torch.testing.assert_close(fused, exact, atol=1e-5, rtol=1e-5)
    grads = [torch.autograd.grad(out.square().sum(), (x, *m.parameters())) for out in (exact, fused)]
    for g_exact, g_fused in zip(*grads):
        assert torch.isfinite(g_exact).all() and torch.isfinite(g_fused).all()
        torch.testing.assert_close(g_fused, g_exact, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("form", ["authors", "authors_lm"])
def test_one_step_with_the_cached_r_equals_the_full_pass(form):
    m = AuthorsWeights(form)
    with torch.no_grad():
        q, k, v = m.project(torch.randn(B, T, E))
        full, probs, _, r = bet_authors_attention(q, k, v, *m.args(), causal_allowed(T, T), r_input=R_INPUT[form])
        # the last query alone, every key visible (allowed=None), R of the earlier keys cached
        step, step_probs, _, step_r = bet_authors_attention(q[:, :, -1:], k, v, *m.args(), None,
                                                            r_input=R_INPUT[form], prev_r=r[..., :-1])
    torch.testing.assert_close(step, full[:, :, -1:], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(step_probs, probs[:, :, -1:], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(step_r, r, atol=1e-6, rtol=1e-5)


def test_attention_dropout_applies_to_the_first_pass_too():
    """As in the authors' code: with every first-pass weight dropped, A V = 0, so H is out_proj's bias."""
    m = AuthorsWeights("authors")
    with torch.no_grad():
        x = torch.randn(B, T, E)
        _, _, _, r = m(x, dropout=torch.zeros_like)
        _, k, _ = m.project(x)
        h = m.out_proj.bias.view(H, 1, D).expand(B, H, T, D)
        expected = torch.sigmoid(m.bet_authors_w(torch.cat([k, h], dim=-1))).squeeze(-1)
    torch.testing.assert_close(r, expected)


def test_merge_heads_is_fairseqs_layout_and_split_heads_inverts_it():
    x = torch.randn(B, H, T, D)
    merged = merge_heads(x)
    assert merged.shape == (B, T, E)
    assert torch.equal(merged[1, 2, 3 * D:4 * D], x[1, 3, 2])  # head h in columns h*d .. (h+1)*d - 1
    assert torch.equal(split_heads(merged, H), x)


def test_bad_arguments_are_clear_errors():
    m = AuthorsWeights("authors")
    q, k, v = m.project(torch.randn(B, T, E))
    with pytest.raises(ValueError, match=r"r_input must be one of \('key', 'query'\), got 'value'"):
        bet_authors_r(q, k, v, *m.args(), r_input="value")
    with pytest.raises(ValueError, match="R of the 5 keys before the 1 queries is needed"):
        bet_authors_r(q[:, :, -1:], k, v[:, :, -1:], *m.args())
