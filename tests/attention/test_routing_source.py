"""Routing attention closer to Roy et al.'s code: shared queries and keys in the routing heads (against a
loop reference), the k-means commitment term as a gradient (against autograd of the explicit loss),
causality, decoding, the centroid update and the options."""

import copy

import pytest
import torch

from conftest import assert_incremental_equals_full, assert_reorder_continues, full_forward, make_attention, padding_mask
from reference import linear, projections, reference_commitment_loss, reference_for, route

from bet_fairseq.attention.routing import RoutingOptions
from bet_fairseq.core.baselines import with_commitment_gradient

E, H, D = 16, 4, 4


def make_routing(routing_heads=2, clusters=3, window=3, decay=0.5, seed=0, **options):
    m = make_attention("routing", E, H, seed=seed, routing_heads=routing_heads, routing_clusters=clusters,
                       routing_window=window, routing_ema_decay=decay, **options).double()
    m.centroids_initialized.fill_(True)  # fixed (random) centroids: no k-means init
    return m


def test_defaults_share_queries_and_keys_with_the_commitment_term():
    o = RoutingOptions()
    assert o.routing_separate_qk is False and o.routing_commitment == pytest.approx(1e-4)
    assert o.routing_clusters == 16  # about sqrt(512) for the Table 2 rows' 512-token blocks


@pytest.mark.parametrize("routing_heads", [2, 4])
def test_shared_qk_matches_loop_reference(routing_heads):
    m = make_routing(routing_heads=routing_heads)
    x = torch.randn(9, 2, E, dtype=torch.double)
    ref = reference_for(m, x)
    ref_out, ref_probs = ref.out, ref.probs
    out, w = full_forward(m, x, need_head_weights=True)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w.transpose(0, 1), ref_probs)
    fused, _ = full_forward(m, x, need_weights=False)
    torch.testing.assert_close(fused, ref_out)
    # not trivial: routing drops some past keys and keeps some others
    lower = torch.ones(9, 9, dtype=torch.bool).tril(-1)
    routed = ref_probs[:, H - routing_heads:]
    assert (routed[..., lower] == 0).any() and (routed[..., lower] > 0).any()


def test_shared_qk_with_padding_matches_reference():
    m = make_routing()
    kpm = padding_mask(3, 8, left=[(1, 3)], right=[(0, 2)])
    x = torch.randn(8, 3, E, dtype=torch.double)
    ref = reference_for(m, x, kpm)
    out, _ = full_forward(m, x, kpm, need_weights=False)
    torch.testing.assert_close(out, ref.out)


def test_shared_qk_routing_keys_come_from_the_query_projection():
    """k_proj's rows of the routing heads do not matter; its rows of the local heads do."""
    m = make_routing(routing_heads=2)
    x = torch.randn(6, 2, E, dtype=torch.double)
    before, _ = full_forward(m, x, need_weights=False)
    with torch.no_grad():
        m.k_proj.weight[2 * D:].normal_()
    torch.testing.assert_close(full_forward(m, x, need_weights=False)[0], before)
    with torch.no_grad():
        m.k_proj.weight[:D].normal_()
    assert not torch.allclose(full_forward(m, x, need_weights=False)[0], before)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_shared_qk_is_causal(training):
    m = make_routing(routing_heads=3, clusters=2, window=2).train(training)
    state = copy.deepcopy(m.state_dict())
    x = torch.randn(12, 3, E, dtype=torch.double)
    y = x.clone()
    y[7] += 3 * torch.randn(3, E, dtype=torch.double)
    out_x, _ = full_forward(m, x, need_weights=False)
    m.load_state_dict(state)
    out_y, _ = full_forward(m, y, need_weights=False)
    torch.testing.assert_close(out_x[:7], out_y[:7])
    assert not torch.allclose(out_x[7], out_y[7])


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
def test_incremental_and_beam_reorder_match_full_sequence(separate):
    m = make_routing(routing_separate_qk=separate)
    x = torch.randn(6, 3, E, dtype=torch.double)
    assert_incremental_equals_full(m, x)
    assert_reorder_continues(m, x, torch.tensor([2, 0, 0]))


def test_shared_qk_centroid_update_counts_each_token_once():
    """With Q = K a token has one routing vector: the EMA averages the (non-padding) queries only."""
    decay = 0.7
    m = make_routing(routing_heads=1, clusters=3, decay=decay, seed=3).train()
    before = m.centroids.clone()[0].tolist()
    x = torch.randn(5, 2, E, dtype=torch.double)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    full_forward(m, x, pad, need_weights=False)
    q = linear(x, projections(m).q)[..., 3 * D:]  # the routing head is the last one
    members = {c: [] for c in range(3)}
    for b in range(2):
        for t in range(5):
            if not pad[b, t]:
                c, z = route(q[t, b], before)
                members[c].append(torch.tensor(z, dtype=torch.double))
    expected = torch.tensor(before, dtype=torch.double)
    for c, zs in members.items():
        if zs:
            new = decay * expected[c] + (1 - decay) * torch.stack(zs).mean(0)
            expected[c] = new / new.norm()
    torch.testing.assert_close(m.centroids[0], expected, rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------------------- the commitment gradient
def test_commitment_gradient_function_equals_autograd_of_the_explicit_loss():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 4, dtype=torch.double, requires_grad=True)
    centroids = torch.nn.functional.normalize(torch.randn(2, 3, 4, dtype=torch.double), dim=-1)
    keep = torch.tensor([[True] * 5, [True, True, True, False, False]])
    upstream = torch.randn_like(x)
    divisor, weight = 0.5, 0.3
    y = with_commitment_gradient(x, centroids, keep, weight, first_head=1, divisor=divisor)
    torch.testing.assert_close(y, x)  # the identity forward
    (y * upstream).sum().backward()
    xr = x.detach()[:, 1:].clone().requires_grad_()
    reference_commitment_loss(xr / divisor, centroids, keep, weight).backward()
    expected = upstream.clone()
    expected[:, 1:] += xr.grad
    torch.testing.assert_close(x.grad, expected)
    assert xr.grad.abs().sum() > 0 and (x.grad[:, 0] == upstream[:, 0]).all()


def grads(m, x, kpm=None, seed=1):
    """Parameter gradients of a fixed linear read-out of one training forward."""
    m.zero_grad()
    out, _ = full_forward(m, x, kpm, need_weights=False)
    torch.manual_seed(seed)
    (out * torch.randn_like(out)).sum().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
def test_module_adds_exactly_the_commitment_gradient(separate):
    """Training with --routing-commitment beta changes the gradients by autograd of beta * the explicit
    per-token loss (queries, and keys when separate; padding excluded), and nothing else."""
    beta = 0.05
    m = make_routing(routing_heads=2, routing_separate_qk=separate, routing_commitment=beta).train()
    off = copy.deepcopy(m)
    off.commitment = 0.0
    centroids = m.centroids.clone()
    x = torch.randn(7, 3, E, dtype=torch.double)
    kpm = padding_mask(3, 7, right=[(1, 2)])
    with_term, without = grads(m, x, kpm), grads(off, x, kpm)
    keep = ~kpm
    names = ["q_proj.weight", "q_proj.bias"] + (["k_proj.weight", "k_proj.bias"] if separate else [])
    params = {n: dict(m.named_parameters())[n].detach().clone().requires_grad_() for n in names}
    loss = 0
    for which in ("q", "k") if separate else ("q",):
        w, b = params[f"{which}_proj.weight"], params[f"{which}_proj.bias"]
        vec = (x @ w.T + b)[..., 2 * D:].reshape(7, 3, 2, D).permute(1, 2, 0, 3)  # routing heads, (B, H, T, d)
        loss = loss + reference_commitment_loss(vec, centroids, keep, beta)
    loss.backward()
    for n in with_term:
        expected = without[n] + (params[n].grad if n in params else 0)
        torch.testing.assert_close(with_term[n], expected, rtol=1e-7, atol=1e-10)
    assert params["q_proj.weight"].grad.abs().sum() > 0


def test_no_commitment_outside_training_or_before_the_centroids_exist():
    m = make_routing(routing_commitment=0.5)
    x = torch.randn(5, 2, E, dtype=torch.double)
    off = copy.deepcopy(m)
    off.commitment = 0.0
    torch.testing.assert_close(grads(m, x), grads(off, x))  # eval mode
    fresh = make_attention("routing", E, H, routing_clusters=3, routing_commitment=0.5).double().train()
    fresh_off = copy.deepcopy(fresh)
    fresh_off.commitment = 0.0
    torch.testing.assert_close(grads(fresh, x), grads(fresh_off, x))  # first batch: random centroids


def test_commitment_refuses_float16_loss_scaling():
    m = make_attention("routing", E, H, routing_clusters=3).half().train()
    m.centroids_initialized.fill_(True)
    x = torch.randn(4, 2, E).half()
    with pytest.raises(ValueError, match="--routing-commitment"):
        full_forward(m, x, need_weights=False)


@pytest.mark.parametrize("value", [-1e-4, float("nan"), float("inf"), "x"])
def test_bad_commitment_is_a_clear_error(value):
    with pytest.raises(ValueError, match="--routing-commitment"):
        make_attention("routing", E, H, routing_commitment=value)
