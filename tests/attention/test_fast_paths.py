"""The fast paths of the fairseq variants against the naive reference: BET(SF)'s SDPA second pass (forced
with ``cpu_exact_max_keys = 0``) and the CPU dispatch to the exact path, the one-step decoding path
with the cached R and V w_h, decoding with a left-padded prefix, and fused gradients == exact ones."""

import pytest
import torch

import bet_fairseq.attention.bet_sf as bet_sf_module
from conftest import assert_matches_reference, decode, full_forward, make_sharp, padding_mask
from reference import reference_for

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


@pytest.mark.parametrize("mode, options", [("bet_sf", o) for o in BET_CASES] + [("diag_free", {})],
                         ids=BET_IDS + ["diagfree"])
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
