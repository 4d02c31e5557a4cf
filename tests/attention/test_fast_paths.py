"""The fast paths of the fairseq variants against the naive reference: BET(SF)'s SDPA second pass (forced
with ``cpu_exact_max_keys = 0``) and the CPU dispatch to the exact path, the one-step decoding path
with the cached R and V w_h, decoding with a left-padded prefix, fused gradients == exact ones, and BET(SF)'s
one-token decoding step (every form and diagonal setting, after a beam reorder, its derived weights)."""

import pytest
import torch

import bet_fairseq.attention.bet_sf as bet_sf_module
from conftest import assert_matches_reference, decode, full_forward, make_sharp, padding_mask
from reference import reference_bet_authors, reference_for

E, H, T, B = 16, 4, 7, 3
BET_CASES = [{}, dict(bet_keep_diagonal=True), dict(bet_share_w=True)]
BET_IDS = ["bet_sf", "keepdiag", "sharew"]


@pytest.mark.parametrize("options", BET_CASES, ids=BET_IDS)
def test_sdpa_path_matches_reference_with_padding(options):
    m = make_sharp("bet_sf", E, H, **options)
    m.cpu_exact_max_keys = 0  # force SDPA for the second pass
    assert_matches_reference(m, torch.randn(T, B, E), padding_mask(B, T, left=[(1, 2)], right=[(0, 3)]))


def test_dispatch_takes_exact_path_on_short_cpu_sequences(monkeypatch):
    m = make_sharp("bet_sf", E, H)

    def no_sdpa(*args, **kwargs):
        raise AssertionError("SDPA path taken")

    monkeypatch.setattr(bet_sf_module, "bet_sf_fused", no_sdpa)
    x = torch.randn(T, B, E)
    full_forward(m, x, need_weights=False)  # T <= cpu_exact_max_keys: exact
    m.cpu_exact_max_keys = 0
    with pytest.raises(AssertionError, match="SDPA path taken"):
        full_forward(m, x, need_weights=False)
    m.use_fused_attention = False  # off: always exact
    full_forward(m, x, need_weights=False)


@pytest.mark.parametrize("mode, options", [("bet_sf", o) for o in BET_CASES] + [("diag_free", {}),
                                                                                ("diag_scale", dict(diag_scale=0.2))],
                         ids=BET_IDS + ["diagfree", "reduced"])
def test_one_step_decoding_matches_reference(mode, options):
    """Beam-search steps (no masks, cached R and V w_h) against the naive full-sequence reference."""
    m = make_sharp(mode, E, H, **options)
    x = torch.randn(T, B, E)
    ref = reference_for(m, x)
    outs, weights, state = decode(m, x, need_head_weights=True)
    for t, w in enumerate(weights):  # the step's weights are the reference's row t (no future keys yet)
        torch.testing.assert_close(w.transpose(0, 1)[:, :, 0].double(), ref.probs[:, :, t, : t + 1],
                                   atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(outs.double(), ref.out, atol=1e-5, rtol=1e-5)
    saved = m._get_input_buffer(state)
    if mode == "bet_sf":
        torch.testing.assert_close(saved["prev_variant_bet_r"].double(), ref.r, atol=1e-6, rtol=1e-5)
        assert saved["prev_variant_bet_vw"].shape == (B, H, T), "V w_h is cached batch-first, one value per key"


@pytest.mark.parametrize("mode", ["bet_sf", "diag_scale", "diag_free"])
def test_decoding_with_padding_in_the_cache_matches_reference(mode):
    """The masked (non-shortcut) step path: a left-padded prefix, as with fairseq's prefix tokens."""
    m = make_sharp(mode, E, H, **({"diag_scale": 0.2} if mode == "diag_scale" else {}))
    x = torch.randn(T, B, E)
    kpm = padding_mask(B, T, left=[(2, 2)])  # sentence 2 starts at position 2
    got, _, _ = decode(m, x, key_padding_mask=kpm, need_weights=False)
    assert torch.isfinite(got).all(), "NaN from the fully padded first rows leaked into later steps"
    torch.testing.assert_close(got.double(), reference_for(m, x, kpm).out, atol=1e-5, rtol=1e-5)
    # the padded sentence equals its unpadded suffix decoded on its own
    torch.testing.assert_close(got[2:, 2:3].double(), reference_for(m, x[2:, 2:3]).out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode, options", [("bet_sf", {}), ("bet_sf", dict(bet_keep_diagonal=True)),
                                           ("diag_scale", dict(diag_scale=0.2)), ("diag_free", {})],
                         ids=["bet_sf", "bet_sf_keepdiag", "diag_scale", "diag_free"])
def test_fused_gradients_match_exact(mode, options):
    m = make_sharp(mode, E, H, **options)
    m.cpu_exact_max_keys = 0  # bet_sf: the SDPA path even for short CPU sequences
    x = torch.randn(T, B, E)
    kpm = padding_mask(B, T, left=[(1, 2)])
    grads = []
    for fused in (False, True):
        m.zero_grad()
        m.use_fused_attention = fused
        out, _ = full_forward(m, x, kpm, need_weights=False)
        out.square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for name in grads[0]:
        assert torch.isfinite(grads[1][name]).all(), name
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------------------- BET(SF)'s decoding step
STEP_CASES = BET_CASES + [dict(bet_form=f, bet_keep_diagonal=k) for f in ("authors", "authors_lm") for k in (0, 1)]
STEP_IDS = BET_IDS + ["authors", "authors-keepdiag", "authors_lm", "authors_lm-keepdiag"]


def make_bet(options):
    m = make_sharp("bet_sf", E, H, **options)
    if m.bet_form != "equations":
        with torch.no_grad():  # R far from its init, so that it matters visibly
            m.bet_authors_w.weight.normal_(0, 1.0)
            m.bet_authors_w.bias.normal_(0, 1.0)
    return m


def bet_reference(m, x):
    return reference_for(m, x) if m.bet_form == "equations" else reference_bet_authors(m, x)


def count_steps(monkeypatch):
    """Counts the calls of the decoding step's core functions (the fast path taken)."""
    calls = []
    for name in ("bet_sf_step", "bet_authors_step"):
        real = getattr(bet_sf_module, name)
        monkeypatch.setattr(bet_sf_module, name, lambda *a, _real=real, **kw: calls.append(1) or _real(*a, **kw))
    return calls


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("options", STEP_CASES, ids=STEP_IDS)
def test_decoding_step_matches_reference(options, grad, monkeypatch):
    """Every step after the first takes the one-token path (as fairseq's generator runs it, without gradients, and
    with them), and each step's output is the reference's row: R, V w_h and the DiagFreeMask as the equations."""
    m = make_bet(options)
    x = torch.randn(T, B, E)
    calls = count_steps(monkeypatch)
    with torch.set_grad_enabled(grad):
        got, _, state = decode(m, x, need_weights=False)
    assert len(calls) == T - 1, "the first step has no cache; every later one takes the fast path"
    ref = bet_reference(m, x)
    torch.testing.assert_close(got.double(), ref.out, atol=1e-5, rtol=1e-5)
    saved = m._get_input_buffer(state)
    torch.testing.assert_close(saved["prev_variant_bet_r"].double(), ref.r, atol=1e-6, rtol=1e-5)
    assert saved["prev_key"].shape == saved["prev_value"].shape == (B, H, T, E // H)
    if m.bet_form == "equations":
        assert saved["prev_variant_bet_vw"].shape == (B, H, T)


@pytest.mark.parametrize("options", STEP_CASES, ids=STEP_IDS)
def test_decoding_step_after_a_beam_reorder_matches_reference(options, monkeypatch):
    """Beam search reorders the cache (every tensor of it batch-first) between fast steps; the derived step
    weights are not per hypothesis and stay out of the reordered buffer."""
    m = make_bet(options)
    x = torch.randn(T, B, E)
    order = torch.tensor([2, 0, 0])
    calls = count_steps(monkeypatch)
    with torch.no_grad():
        _, _, state = decode(m, x[:3], need_weights=False)
        buffer = m._get_input_buffer(state)
        assert all(t.size(0) == B for t in buffer.values() if t is not None), "the cache is batch-first"
        before = {name: t.clone() for name, t in buffer.items() if t is not None}
        m.reorder_incremental_state(state, order)
        after = m._get_input_buffer(state)
        for name, t in before.items():
            assert torch.equal(after[name], t.index_select(0, order)), f"{name} was not reordered"
        got, _, _ = decode(m, x[3:, order], state, need_weights=False)
    assert len(calls) == T - 1
    torch.testing.assert_close(got.double(), bet_reference(m, x[:, order]).out[3:], atol=1e-5, rtol=1e-5)


def test_step_weights_are_derived_once_per_generation_and_follow_new_weights(monkeypatch):
    """Without gradients the derived weights are kept in the incremental state: once per generation, and a new
    generation after the weights changed (a training step, a loaded checkpoint) derives them again."""
    m = make_bet({})
    x = torch.randn(T, B, E)
    derived = []
    real = m.derive_step_weights
    monkeypatch.setattr(m, "derive_step_weights", lambda: derived.append(1) or real())
    with torch.no_grad():
        decode(m, x, need_weights=False)
        assert len(derived) == 1
        m.v_proj.weight.mul_(-1.5)
        m.bet_w.normal_(0, 0.5)
        got, _, _ = decode(m, x, need_weights=False)
    assert len(derived) == 2
    torch.testing.assert_close(got.double(), reference_for(m, x).out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(need_weights=True), dict(key_padding_mask="pad")], ids=["weights", "padding"])
def test_steps_that_need_weights_or_see_padding_take_the_general_path(kwargs, monkeypatch):
    m = make_bet({})
    x = torch.randn(T, B, E)
    if kwargs.get("key_padding_mask") == "pad":
        kwargs = dict(key_padding_mask=padding_mask(B, T, left=[(2, 2)]), need_weights=False)
    calls = count_steps(monkeypatch)
    got, _, _ = decode(m, x, **kwargs)
    assert not calls
    torch.testing.assert_close(got.double(), reference_for(m, x, kwargs.get("key_padding_mask")).out,
                               atol=1e-5, rtol=1e-5)
