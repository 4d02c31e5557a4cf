"""Localness (Yang et al. 2018) with the predicted centre inside the keys a query sees: I_i = i (the
default) against a loop reference, version 0.1's I_i = i + 1 as an option, causality and decoding."""

import pytest
import torch

from conftest import assert_incremental_equals_full, assert_reorder_continues, full_forward, make_sharp, padding_mask
from reference import reference_for

from bet_fairseq.attention.localness import LocalnessOptions

E, H, T, B = 16, 4, 7, 3


def test_default_centre_scale_is_in_range():
    assert str(LocalnessOptions().localness_centre_scale) == "i"


@pytest.mark.parametrize("scale", ["i", "i+1"])
@pytest.mark.parametrize("fused", [False, True], ids=["weights", "no-weights"])
def test_matches_loop_reference(scale, fused):
    m = make_sharp("localness", E, H, localness_centre_scale=scale).double()
    x = torch.randn(T, B, E, dtype=torch.double) * 2
    ref = reference_for(m, x)
    ref_out, ref_probs = ref.out, ref.probs
    out, w = full_forward(m, x, need_weights=not fused, need_head_weights=not fused)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)  # the bias is float32 by design
    if not fused:
        torch.testing.assert_close(w.transpose(0, 1), ref_probs, atol=1e-5, rtol=1e-5)


def test_padding_matches_reference():
    m = make_sharp("localness", E, H).double()
    x = torch.randn(T, B, E, dtype=torch.double)
    kpm = padding_mask(B, T, right=[(0, 2), (2, 1)])
    ref = reference_for(m, x, kpm)
    out, _ = full_forward(m, x, kpm, need_weights=False)
    torch.testing.assert_close(out, ref.out, atol=1e-5, rtol=1e-5)


def test_centre_lies_within_the_visible_keys():
    """I_i = i: 0 < P_i < i for i >= 1 (and P_0 = 0), so the centre never passes the query's own key;
    version 0.1's I_i = i + 1 lets it do so."""
    x = torch.randn(T, B, E) * 3
    positions = torch.arange(T)
    m = make_sharp("localness", E, H)
    centre, width = m.window(m.q_proj(x), positions)
    assert torch.all(centre[:, 1:] > 0) and torch.all(centre[:, 1:] < positions[1:])
    assert torch.all(centre[:, 0] == 0) and torch.all(width[:, 0] == 0)
    assert torch.all(width >= 0) and torch.all(width[:, 1:] < positions[1:])
    old = make_sharp("localness", E, H, localness_centre_scale="i+1")
    centre_old, _ = old.window(old.q_proj(x), positions)
    torch.testing.assert_close(centre_old[:, 1:] / (positions[1:] + 1), centre[:, 1:] / positions[1:])  # one sigmoid
    assert (centre_old > positions).any()


@pytest.mark.parametrize("scale", ["i", "i+1"])
def test_causal_and_decoding_equals_full(scale):
    m = make_sharp("localness", E, H, localness_centre_scale=scale)
    x = torch.randn(T, B, E)
    y = x.clone()
    y[4] += 3 * torch.randn(B, E)
    out_x, _ = full_forward(m, x, need_weights=False)
    out_y, _ = full_forward(m, y, need_weights=False)
    torch.testing.assert_close(out_x[:4], out_y[:4])
    assert not torch.allclose(out_x[4], out_y[4])
    assert_incremental_equals_full(m, x)
    assert_reorder_continues(m, x, torch.tensor([2, 0, 0]))


def test_training_step_has_finite_gradients_at_the_first_position():
    """I_0 = 0 gives the first query an empty window (width 0): the bias and gradients stay finite."""
    m = make_sharp("localness", E, H).train()
    out, _ = full_forward(m, torch.randn(T, B, E), need_weights=False)
    out.square().sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_bad_scale_is_a_clear_error():
    with pytest.raises(ValueError, match="--localness-centre-scale"):
        make_sharp("localness", E, H, localness_centre_scale="i+2")
