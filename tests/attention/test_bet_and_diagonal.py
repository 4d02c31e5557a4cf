"""The paper's variants as fairseq modules (vanilla, Reduced / Magnified Diag, DiagFreeMask, BET(SF) and its
options) against the naive reference of the method (docs/method.md; tests/reference.py) and against fairseq."""

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from conftest import assert_decoding_consistent, assert_matches_reference, decode, full_forward, make_sharp, padding_mask
from reference import reference_for

E, H, T, B = 16, 4, 7, 3
CASES = [
    ("vanilla", {}),
    ("diag_scale", dict(diag_scale=0.2)),
    ("diag_scale", dict(diag_scale=2.0)),
    ("diag_free", {}),
    ("bet_sf", {}),
    ("bet_sf", dict(bet_keep_diagonal=True)),
    ("bet_sf", dict(bet_share_w=True)),
]
IDS = ["vanilla", "reduced", "magnified", "diagfree", "bet_sf", "bet_sf_keepdiag", "bet_sf_sharew"]


def force_fused(m, fused=True):
    """The fused (SDPA) paths, also where the CPU would pick the exact one for short sequences."""
    m.use_fused_attention = fused
    if hasattr(m, "cpu_exact_max_keys"):
        m.cpu_exact_max_keys = 0 if fused else type(m).cpu_exact_max_keys


@pytest.mark.parametrize("mode, options", CASES, ids=IDS)
@pytest.mark.parametrize("fused", [False, True], ids=["exact", "fused"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_full_forward_matches_reference(mode, options, fused, padded):
    m = make_sharp(mode, E, H, **options)
    force_fused(m, fused)
    # right padding (fairseq's target side) and left padding (queries without keys give zeros)
    kpm = padding_mask(B, T, left=[(2, 3)], right=[(1, 2)]) if padded else None
    assert_matches_reference(m, torch.randn(T, B, E), kpm)


@pytest.mark.parametrize("mode, options", CASES, ids=IDS)
def test_weights_match_reference_and_respect_masks(mode, options):
    m = make_sharp(mode, E, H, **options)
    x = torch.randn(T, B, E)
    _, w = full_forward(m, x, need_head_weights=True)
    w = w.transpose(0, 1)  # fairseq returns heads first
    torch.testing.assert_close(w.double(), reference_for(m, x).probs, atol=1e-6, rtol=1e-5)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    assert torch.all(w[..., future] == 0), "future positions must get exactly zero weight"
    assert torch.allclose(w[..., 0, 0], torch.ones(())), "row 0 keeps its diagonal (it sees only itself)"
    diag = torch.diagonal(w, dim1=-2, dim2=-1)[..., 1:]
    assert m.masks_diagonal == (mode == "diag_free" or (mode == "bet_sf" and not options.get("bet_keep_diagonal")))
    assert torch.all(diag == 0) if m.masks_diagonal else torch.all(diag > 0)


@pytest.mark.parametrize("share_w", [False, True])
def test_r_in_unit_interval_and_w_is_the_only_new_parameter(share_w):
    torch.manual_seed(0)
    vanilla = MultiheadAttention(E, H, self_attention=True)
    bet = make_sharp("bet_sf", E, H, bet_share_w=share_w)
    n_vanilla = sum(p.numel() for p in vanilla.parameters())
    n_bet = sum(p.numel() for p in bet.parameters())
    assert n_bet - n_vanilla == (1 if share_w else H) * 2 * (E // H)
    assert [n for n, _ in bet.named_parameters() if n not in dict(vanilla.named_parameters())] == ["bet_w"]
    x = torch.randn(T, B, E) * 5
    ref = reference_for(bet, x)
    assert torch.all((ref.r > 0) & (ref.r < 1))
    bet.capture_attention = True
    _, _, state = decode(bet, x)  # R as cached per key by the decoder, and the captured first pass
    torch.testing.assert_close(bet._get_input_buffer(state)["prev_variant_bet_r"].double(), ref.r, atol=1e-6, rtol=1e-5)
    full_forward(bet, x, need_weights=False)
    torch.testing.assert_close(bet.captured_first_pass.double(), ref.first, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(bet.captured_attention.double(), ref.probs, atol=1e-6, rtol=1e-5)


def test_vanilla_equals_fairseq_attention():
    torch.manual_seed(0)
    fs = MultiheadAttention(E, H, self_attention=True, dropout=0.0).eval()
    m = make_sharp("vanilla", E, H)
    m.load_state_dict(fs.state_dict())
    x = torch.randn(T, B, E)
    expected, expected_w = full_forward(fs, x, need_weights=True)
    got, _ = full_forward(m, x, need_weights=True)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    m.capture_attention = True  # the exact path, used for analysis, also equals fairseq
    got, got_w = full_forward(m, x, need_weights=True)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_w, expected_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode, options", CASES, ids=IDS)
def test_incremental_equals_full_and_reorder(mode, options):
    m = make_sharp(mode, E, H, **options)
    state, cached = assert_decoding_consistent(m, torch.randn(T, B, E), torch.tensor([2, 0, 0]))
    saved = m._get_input_buffer(state)
    assert saved["prev_key"].shape == (B, H, T, E // H)
    if mode == "bet_sf":
        assert saved["prev_variant_bet_r"].shape == (B, H, T), "R is cached batch-first, one value per key"
        assert saved["prev_variant_bet_vw"].shape == (B, H, T), "so is V w_h"
        assert {"prev_variant_bet_r", "prev_variant_bet_vw"} <= set(cached), "and both are reordered"


def test_state_dict_with_other_share_w_is_a_clear_error():
    per_head, shared = make_sharp("bet_sf", E, H), make_sharp("bet_sf", E, H, bet_share_w=True)
    sd = {f"layer.{k}": v for k, v in per_head.state_dict().items()}
    with pytest.raises(ValueError, match=r"layer\.bet_w has shape \(4, 8\), this model expects \(1, 8\) "
                                         r"\(--bet-share-w differs"):
        shared.upgrade_state_dict_named(sd, "layer")
