"""What every registered ``--self-attn-mode`` must do, whatever its math: causal from its first training
batch, incremental decoding equal to the full forward, a beam-search reorder of every cached tensor,
left padding without NaN or leaks, capture, and bfloat16 training that stays finite at extreme values."""

import pytest
import torch

from bet_fairseq.attention import VARIANTS
from conftest import assert_incremental_equals_full, assert_reorder_continues, decode, full_forward, make_attention, padding_mask

E, H, T, B = 16, 4, 7, 3
MODES = sorted(VARIANTS)
# options that make each variant do something visible at these tiny sizes (any other variant: defaults)
OPTIONS = {
    "diag_scale": dict(diag_scale=0.2),
    "sparse_topk": dict(sparse_topk=2),
    "hopfield": dict(hopfield_beta=0.7, hopfield_steps=2),
    "routing": dict(routing_clusters=2, routing_window=2),
}


def build(mode, seed=0, dropout=0.0):
    return make_attention(mode, E, H, seed=seed, dropout=dropout, **OPTIONS.get(mode, {}))


def left_padding():
    """Row 1 starts at position 2; row 2 has one real token, the last."""
    return padding_mask(B, T, left=[(1, 2), (2, T - 1)])


@pytest.mark.parametrize("need_weights", [False, True], ids=["fast", "exact"])
@pytest.mark.parametrize("mode", MODES)
def test_fresh_module_is_causal_on_its_first_training_batch(mode, need_weights):
    torch.manual_seed(1)
    x = torch.randn(T, B, E)
    t = 3
    y = x.clone()
    y[t + 1:] = torch.randn(T - t - 1, B, E)  # other tokens after position t
    outs = []
    for inp in (x, y):
        m = build(mode).train()  # fresh each time: the first batch (routing: random centroids, then k-means)
        outs.append(full_forward(m, inp, need_weights=need_weights)[0])
    assert torch.equal(outs[0][: t + 1], outs[1][: t + 1]), "a position saw a later token"
    assert not torch.allclose(outs[0][t + 1:], outs[1][t + 1:])


@pytest.mark.parametrize("mode", MODES)
def test_incremental_decoding_equals_full_forward(mode):
    torch.manual_seed(2)
    m = build(mode)
    state = assert_incremental_equals_full(m, torch.randn(T, B, E))
    assert m._get_input_buffer(state)["prev_key"].shape == (B, H, T, E // H)


@pytest.mark.parametrize("mode", MODES)
def test_reorder_incremental_state_reorders_every_cached_tensor(mode):
    torch.manual_seed(3)
    assert_reorder_continues(build(mode), torch.randn(T, B, E), torch.tensor([2, 0, 0]))


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("mode", MODES)
def test_left_padding_is_finite_and_does_not_leak(mode, training):
    torch.manual_seed(4)
    kpm = left_padding()
    x = torch.randn(T, B, E)
    y = x.clone()
    y[kpm.T] = 1e3 * torch.randn(int(kpm.sum()), E)  # other (and large) padding content
    outs, states = [], []
    for inp in (x, y):
        m = build(mode).train(training)
        out, _ = full_forward(m, inp, kpm, need_weights=False)
        exact, weights = full_forward(m.eval(), inp, kpm, need_weights=True)
        assert torch.isfinite(out).all() and torch.isfinite(exact).all(), "a query without keys gave NaN/inf"
        assert torch.isfinite(weights).all()
        outs.append(out)
        states.append(m.state_dict())
    real = ~kpm.T
    assert torch.equal(outs[0][real], outs[1][real]), "padding content reached a real position"
    for name in states[0]:  # routing's centroid update ignores padding too
        assert torch.equal(states[0][name], states[1][name]), name
    if not training:  # the masked decoding step (a left-padded prefix) gives the same
        steps, _, _ = decode(m, y, key_padding_mask=kpm)
        assert torch.isfinite(steps).all()
        torch.testing.assert_close(steps[real], outs[1][real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_capture_keeps_the_per_head_weights_with_gradients(mode):
    torch.manual_seed(5)
    m = build(mode)
    x = torch.randn(T, B, E)
    plain, _ = full_forward(m, x, need_weights=False)
    m.capture_attention = True
    out, weights = full_forward(m, x, need_head_weights=True)
    captured = m.captured_attention
    assert captured.shape == (B, H, T, T) and captured.requires_grad
    torch.testing.assert_close(out, plain, atol=1e-6, rtol=1e-5)  # capturing does not change the output
    torch.testing.assert_close(captured, weights.transpose(0, 1))
    torch.testing.assert_close(captured.sum(-1), torch.ones(B, H, T))
    assert torch.all(captured[..., torch.ones(T, T, dtype=torch.bool).triu(1)] == 0)
    full_forward(m, x, need_weights=False)  # capture does not depend on need_weights
    torch.testing.assert_close(m.captured_attention, captured)


# ------------------------------------------------------------------------------- bfloat16 training
def huge_logits(m):
    """Logits of about +-1e4 (q scaled up)."""
    m.q_proj.weight.mul_(1e4)
    m.q_proj.bias.mul_(1e4)


def narrow_window(m):
    """Localness: sigmoid(U tanh(W_p q)) ~ 0.0025 for every query (sigma ~ 0.001 (i + 1))."""
    m.q_proj.weight[0].zero_()
    m.q_proj.bias[0] = 1.0  # q_0 = 1 for every token ...
    m.localness_w_p.weight.zero_()
    m.localness_w_p.weight[:, 0] = 10.0  # ... so tanh(W_p q) = tanh(10) ~ 1 in every component
    m.localness_u.weight.fill_(-6.0 / E)  # U . 1 = -6, sigmoid(-6) = 0.0025


def saturated_w(m):
    """BET: R_j = sigmoid(w . [H_j ; K_j]) saturated at 0 or 1."""
    m.bet_w.normal_(0, 1e3)


EXTREME_CASES = [(mode, "plain") for mode in MODES] + [(mode, "huge_logits") for mode in MODES] + [
    ("localness", "narrow_window"), ("bet_sf", "saturated_w")]
EXTREMES = {"plain": lambda m: None, "huge_logits": huge_logits, "narrow_window": narrow_window,
            "saturated_w": saturated_w}


@pytest.mark.parametrize("mode, case", EXTREME_CASES, ids=[f"{m}-{c}" for m, c in EXTREME_CASES])
def test_bfloat16_training_steps_stay_finite(mode, case):
    torch.manual_seed(6)
    m = build(mode, dropout=0.1).train()
    with torch.no_grad():
        EXTREMES[case](m)
    if case == "narrow_window":
        visible = torch.arange(1, T + 1).view(T, 1)
        _, width = m.window(m.q_proj(torch.randn(T, B, E)), torch.arange(T))
        assert torch.all(width < 0.003 * visible.T)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, target = torch.randn(T, B, E), torch.randn(T, B, E)
    kpm = left_padding()
    for step in range(3):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = full_forward(m, x, kpm, need_weights=step == 1)  # fast, exact, fast
        loss = (out.float() - target).square().mean()
        assert torch.isfinite(loss), f"step {step}: loss {loss}"
        loss.backward()
        for name, p in m.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), f"step {step}: gradient of {name}"
        opt.step()
