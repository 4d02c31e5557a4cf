"""Transformer-XL's relative attention (Dai et al. 2019, 3.3) against the loop reference of
tests/reference.py, with and without a memory context (a ``key`` longer than the query), and a segment
with the previous one as memory against one pass over both."""

import pytest
import torch

from conftest import assert_matches_reference, full_forward, make_attention, make_sharp, padding_mask
from reference import reference_for

E, H = 8, 2


def make_relative(seed=1):
    return make_sharp("relative", E, H, seed=seed).double()  # u, v ~ N(0, 1): the biases matter


def with_memory(m, x, memory, **kwargs):
    """The segment ``x`` (T, B, E) attending over ``[memory ; x]``, as the Transformer-XL model calls it."""
    context = torch.cat([memory, x], dim=0)
    return m(x, context, context, **kwargs)


@pytest.mark.parametrize("mem_len", [0, 3])
def test_relative_attention_matches_loop_reference(mem_len):
    m = make_relative()
    x = torch.randn(4, 2, E, dtype=torch.double)
    memory = torch.randn(mem_len, 2, E, dtype=torch.double)
    out, probs = with_memory(m, x, memory, need_head_weights=True)
    ref = reference_for(m, x, memory=memory if mem_len else None)
    torch.testing.assert_close(out, ref.out)
    torch.testing.assert_close(probs.transpose(0, 1), ref.probs)
    fused, _ = with_memory(m, x, memory, need_weights=False)
    torch.testing.assert_close(fused, ref.out)


def test_relative_padding_matches_reference():
    kpm = padding_mask(3, 6, left=[(1, 2)], right=[(0, 2)])
    assert_matches_reference(make_relative(), torch.randn(6, 3, E, dtype=torch.double), kpm, atol=1e-7, rtol=1e-7)


def test_segment_with_memory_equals_one_long_segment():
    """Causal attention: segment 2 with segment 1 as memory sees exactly what the last positions of
    [seg1 ; seg2] see in one pass (same keys, same relative distances)."""
    m = make_relative()
    whole = torch.randn(9, 2, E, dtype=torch.double)
    one_pass, w_one = full_forward(m, whole, need_head_weights=True)
    second, w_two = with_memory(m, whole[5:], whole[:5], need_head_weights=True)
    torch.testing.assert_close(second, one_pass[5:])
    torch.testing.assert_close(w_two, w_one[:, :, 5:])
    shorter, _ = with_memory(m, whole[5:], whole[3:5], need_weights=False)  # a shorter memory sees less
    assert not torch.allclose(shorter[-1], one_pass[-1])


def test_relative_parameters_and_odd_dimension():
    m = make_attention("relative", E, H)
    extra = {n: p.numel() for n, p in m.named_parameters() if not n.startswith(("q_proj", "k_proj", "v_proj", "out_proj"))}
    assert extra == {"r_proj.weight": E * E, "u_bias": E, "v_bias": E}
    with pytest.raises(ValueError, match="relative attention needs an even embedding dim"):
        make_attention("relative", 9, 3)
