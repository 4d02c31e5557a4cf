"""BirdEyeMultiheadAttention against the naive reference of BET_SPEC and against fairseq."""

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from bet_fairseq.modules import BirdEyeMultiheadAttention
from reference_attention import reference_self_attention

E, H, T, B = 16, 4, 7, 3
MODES = [
    dict(mode="vanilla"),
    dict(mode="diag_scale", diag_scale=0.2),
    dict(mode="diag_scale", diag_scale=2.0),
    dict(mode="diag_free"),
    dict(mode="bet_sf"),
    dict(mode="bet_sf", keep_diagonal=True),
    dict(mode="bet_sf", share_w=True),
]
IDS = ["vanilla", "reduced", "magnified", "diagfree", "bet_sf", "bet_sf_keepdiag", "bet_sf_sharew"]


def future_mask(n):
    return torch.triu(torch.full((n, n), float("-inf")), 1)


def make(settings, seed=0):
    torch.manual_seed(seed)
    m = BirdEyeMultiheadAttention(E, H, dropout=0.0, **settings).eval()
    if m.bet_w is not None:
        with torch.no_grad():
            m.bet_w.normal_(0, 0.5)  # far from the init so that R varies visibly
    return m


def ref(m, x, kpm=None):
    return reference_self_attention(x, m, m.mode, m.diag_scale, m.keep_diagonal, m.bet_w, kpm)


@pytest.mark.parametrize("settings", MODES, ids=IDS)
@pytest.mark.parametrize("fused", [False, True], ids=["exact", "fused"])
def test_full_forward_matches_reference(settings, fused):
    m = make(settings)
    m.use_fused_attention = fused
    x = torch.randn(T, B, E)
    out, _ = m(x, x, x, attn_mask=future_mask(T), need_weights=False)
    ref_out, _, _, _ = ref(m, x)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("settings", MODES, ids=IDS)
def test_weights_match_reference_and_respect_masks(settings):
    m = make(settings)
    x = torch.randn(T, B, E)
    _, w = m(x, x, x, attn_mask=future_mask(T), need_head_weights=True)
    _, ref_probs, _, _ = ref(m, x)
    w = w.transpose(0, 1)  # fairseq returns heads first
    torch.testing.assert_close(w.double(), ref_probs, atol=1e-6, rtol=1e-5)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    assert torch.all(w[..., future] == 0), "future positions must get exactly zero weight"
    assert torch.allclose(w[..., 0, 0], torch.ones(())), "row 0 keeps its diagonal (it sees only itself)"
    diag = torch.diagonal(w, dim1=-2, dim2=-1)[..., 1:]
    if m.masks_diagonal:
        assert torch.all(diag == 0)
    else:
        assert torch.all(diag > 0)


def test_padding_matches_reference():
    m = make(dict(mode="bet_sf"))
    x = torch.randn(T, B, E)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, -2:] = True  # right padding, as fairseq's target side
    for fused in (False, True):
        m.use_fused_attention = fused
        out, _ = m(x, x, x, key_padding_mask=kpm, attn_mask=future_mask(T), need_weights=False)
        ref_out, _, _, _ = ref(m, x, kpm)
        keep = ~kpm.T  # padded query rows are never read
        torch.testing.assert_close(out.double()[keep], ref_out[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("share_w", [False, True])
def test_r_in_unit_interval_and_w_is_the_only_new_parameter(share_w):
    torch.manual_seed(0)
    vanilla = MultiheadAttention(E, H, self_attention=True)
    bet = make(dict(mode="bet_sf", share_w=share_w))
    n_vanilla = sum(p.numel() for p in vanilla.parameters())
    n_bet = sum(p.numel() for p in bet.parameters())
    head_dim = E // H
    assert n_bet - n_vanilla == (1 if share_w else H) * 2 * head_dim
    assert [n for n, _ in bet.named_parameters() if n not in dict(vanilla.named_parameters())] == ["bet_w"]
    x = torch.randn(T, B, E) * 5
    _, _, _, r = ref(bet, x)
    bet.capture_attention = True
    bet(x, x, x, attn_mask=future_mask(T))
    assert torch.all((r > 0) & (r < 1))


def test_vanilla_equals_fairseq_attention():
    torch.manual_seed(0)
    fs = MultiheadAttention(E, H, self_attention=True, dropout=0.0).eval()
    m = BirdEyeMultiheadAttention(E, H, dropout=0.0).eval()
    m.load_state_dict(fs.state_dict())
    x = torch.randn(T, B, E)
    expected, expected_w = fs(x, x, x, attn_mask=future_mask(T), need_weights=True)
    got, got_w = m(x, x, x, attn_mask=future_mask(T), need_weights=True)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    m.capture_attention = True  # the exact path, used for analysis, also equals fairseq
    got, got_w = m(x, x, x, attn_mask=future_mask(T), need_weights=True)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_w, expected_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("settings", MODES, ids=IDS)
def test_incremental_equals_full(settings):
    m = make(settings)
    x = torch.randn(T, B, E)
    full, _ = m(x, x, x, attn_mask=future_mask(T), need_weights=False)
    state = {}
    steps = []
    for t in range(T):
        xt = x[t : t + 1]
        out, _ = m(xt, xt, xt, incremental_state=state, need_weights=False)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=1e-5)
    saved = m._get_input_buffer(state)
    assert saved["prev_key"].shape == (B, H, T, E // H)
    if m.mode == "bet_sf":
        assert saved["prev_bet_r"].shape == (B, H, T), "R is cached batch-first, one value per key"


@pytest.mark.parametrize("settings", MODES, ids=IDS)
def test_reorder_incremental_state(settings):
    """After reordering the cache, decoding continues as if the batch had been in that order."""
    m = make(settings)
    x = torch.randn(T, B, E)
    order = torch.tensor([2, 0, 0])
    state = {}
    for t in range(3):
        m(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state)
    m.reorder_incremental_state(state, order)
    x2 = x[:, order]
    outs = [m(x2[t : t + 1], x2[t : t + 1], x2[t : t + 1], incremental_state=state)[0] for t in range(3, T)]
    full, _ = m(x2, x2, x2, attn_mask=future_mask(T))
    torch.testing.assert_close(torch.cat(outs), full[3:], atol=1e-5, rtol=1e-5)


def test_fused_gradients_match_exact():
    m = make(dict(mode="bet_sf"))
    x = torch.randn(T, B, E)
    grads = []
    for fused in (False, True):
        m.zero_grad()
        m.use_fused_attention = fused
        out, _ = m(x, x, x, attn_mask=future_mask(T), need_weights=False)
        out.square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="sparse"), "unknown mode"),
        (dict(mode="diag_scale", diag_scale=0.0), "> 0"),
        (dict(mode="diag_scale", diag_scale=-1.0), "> 0"),
        (dict(mode="diag_scale", diag_scale=float("nan")), "> 0"),
        (dict(mode="bet_sf", diag_scale=0.5), "only applies"),
        (dict(mode="vanilla", keep_diagonal=True), "only apply"),
    ],
)
def test_bad_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BirdEyeMultiheadAttention(E, H, **kwargs)


def test_state_dict_from_other_mode_is_a_clear_error():
    vanilla = make(dict(mode="vanilla"))
    bet = make(dict(mode="bet_sf"))
    sd = {f"layer.{k}": v for k, v in vanilla.state_dict().items()}
    with pytest.raises(ValueError, match="not trained with --self-attn-mode bet_sf"):
        bet.upgrade_state_dict_named(sd, "layer")
    sd = {f"layer.{k}": v for k, v in bet.state_dict().items()}
    with pytest.raises(ValueError, match="it is a BET"):
        vanilla.upgrade_state_dict_named(sd, "layer")
