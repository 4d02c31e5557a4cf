"""Routing attention (Roy et al. 2021) against the naive loop reference of tests/reference.py: local and
routing heads, causality, decoding, the centroid EMA worked by hand, and the first training batch."""

import copy

import pytest
import torch

from conftest import assert_incremental_equals_full, assert_matches_reference, full_forward, make_attention, padding_mask
from reference import linear, projections, reference_for, route

E, H = 16, 4


def make_routing(routing_heads=2, clusters=3, window=3, decay=0.5, seed=0, embed_dim=E, num_heads=H, **options):
    m = make_attention("routing", embed_dim, num_heads, seed=seed, routing_heads=routing_heads,
                       routing_clusters=clusters, routing_window=window, routing_ema_decay=decay, **options).double()
    m.centroids_initialized.fill_(True)  # fixed (random) centroids: no k-means init
    return m


@pytest.mark.parametrize("routing_heads", [0, 2, 4])
def test_routing_attention_matches_loop_reference(routing_heads):
    m = make_routing(routing_heads=routing_heads)
    x = torch.randn(9, 2, E, dtype=torch.double)
    ref = reference_for(m, x)
    out, w = full_forward(m, x, need_head_weights=True)
    torch.testing.assert_close(out, ref.out)
    torch.testing.assert_close(w.transpose(0, 1), ref.probs)
    fused, _ = full_forward(m, x, need_weights=False)
    torch.testing.assert_close(fused, ref.out)
    # the example is not trivial: routing excludes some past keys and keeps some non-diagonal ones
    local = H - routing_heads
    lower = torch.ones(9, 9, dtype=torch.bool).tril(-1)
    for heads in (ref.probs[:, local:], ref.probs[:, :local]):
        if heads.numel():
            assert (heads[..., lower] == 0).any() and (heads[..., lower] > 0).any()


def test_routing_padding_matches_reference():
    kpm = padding_mask(3, 8, left=[(1, 3)], right=[(0, 2)])
    assert_matches_reference(make_routing(), torch.randn(8, 3, E, dtype=torch.double), kpm, atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_routing_attention_is_causal_with_initialised_centroids(training):
    m = make_routing(routing_heads=3, clusters=2, window=2).train(training)
    state = copy.deepcopy(m.state_dict())
    x = torch.randn(12, 3, E, dtype=torch.double)
    y = x.clone()
    y[7] += 3 * torch.randn(3, E, dtype=torch.double)  # perturb a future token
    out_x, _ = full_forward(m, x, need_weights=False)
    m.load_state_dict(state)  # same centroids for the second forward
    out_y, _ = full_forward(m, y, need_weights=False)
    torch.testing.assert_close(out_x[:7], out_y[:7])
    assert not torch.allclose(out_x[7], out_y[7])


def test_routing_incremental_matches_full_sequence():
    assert_incremental_equals_full(make_routing(), torch.randn(6, 2, E, dtype=torch.double))


def test_centroid_ema_update_matches_hand_computation():
    decay, heads, d = 0.7, 2, 6
    m = make_routing(routing_heads=1, clusters=3, decay=decay, seed=3, embed_dim=12, num_heads=heads,
                     routing_separate_qk=True).train()  # worked by hand for separate keys
    before = m.centroids.clone()[0].tolist()
    x = torch.randn(5, 2, 12, dtype=torch.double)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True  # two padded positions of batch row 1 must not count
    full_forward(m, x, pad, need_weights=False)
    proj = projections(m)
    q = linear(x, proj.q)[..., d:]  # the routing head is the last one
    k = linear(x, proj.k)[..., d:]
    members = {c: [] for c in range(3)}
    for b in range(2):
        for t in range(5):
            if not pad[b, t]:
                for vec in (q[t, b], k[t, b]):
                    c, z = route(vec, before)
                    members[c].append(torch.tensor(z, dtype=torch.double))
    expected = torch.tensor(before, dtype=torch.double)
    for c, zs in members.items():
        if zs:
            new = decay * expected[c] + (1 - decay) * torch.stack(zs).mean(0)
            expected[c] = new / new.norm()
    assert sum(len(z) for z in members.values()) == 2 * 8
    torch.testing.assert_close(m.centroids[0], expected, rtol=1e-6, atol=1e-9)
    m.eval()
    full_forward(m, x, need_weights=False)  # no update outside training
    torch.testing.assert_close(m.centroids[0], expected, rtol=1e-6, atol=1e-9)


def test_first_training_batch_is_routed_with_the_initial_centroids_then_initialises_them():
    m = make_attention("routing", E, H, routing_clusters=3, routing_window=2).train()
    assert not bool(m.centroids_initialized)
    initial = copy.deepcopy(m).eval()
    x = torch.randn(8, 2, E)
    out, _ = full_forward(m, x, need_weights=False)
    torch.testing.assert_close(out, full_forward(initial, x, need_weights=False)[0])
    assert bool(m.centroids_initialized)
    assert not torch.allclose(m.centroids, initial.centroids)
    torch.testing.assert_close(m.centroids.norm(dim=-1), torch.ones(2, 3))
    after_init = m.centroids.clone()
    full_forward(m, x, need_weights=False)  # the second batch: an EMA step, no second k-means
    assert bool(m.centroids_initialized) and not torch.equal(m.centroids, after_init)
