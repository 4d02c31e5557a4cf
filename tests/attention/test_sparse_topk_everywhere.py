"""Zhao et al.'s top-k beyond the decoder self-attention: ``SparseTopKAttention`` as the encoder
self-attention and the encoder-decoder attention against the naive float64 loop of tests/reference.py
(with padding, and a tie worked by hand), step-by-step decoding with the encoder keys cached
(``static_kv``) and reordered, and ``--sparse-topk-attention``'s values."""

from argparse import Namespace

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from conftest import make_attention, padding_mask
from reference import reference_attention, reference_topk_cross

from bet_fairseq.attention import resolve_attention
from bet_fairseq.attention.sparse_topk import SparseTopKAttention, parse_sites

E, H, T, S, B = 16, 4, 6, 9, 3


def topk_module(k, cross=False, seed=0, **kwargs):
    torch.manual_seed(seed)
    kind = dict(encoder_decoder_attention=True, kdim=E, vdim=E) if cross else dict(self_attention=True)
    return SparseTopKAttention(E, H, top_k=k, **kind, **kwargs).eval()


@pytest.mark.parametrize("k", [1, 3, 100])
def test_encoder_self_attention_matches_reference(k):
    m = topk_module(k)
    x = torch.randn(S, B, E) * 2
    kpm = padding_mask(B, S, right=[(1, 4), (2, 1)])
    ref = reference_topk_cross(m, x, x, kpm, k)
    # as the encoder layer calls it: no incremental state, where fairseq would take its fused path
    out, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False)
    torch.testing.assert_close(out.double(), ref.out, atol=1e-5, rtol=1e-5)
    _, w = m(x, x, x, key_padding_mask=kpm, need_head_weights=True)
    torch.testing.assert_close(w.transpose(0, 1).double(), ref.probs, atol=1e-6, rtol=1e-5)
    visible = (~kpm).sum(-1).view(B, 1, 1)
    assert torch.equal((w.transpose(0, 1) > 0).sum(-1), torch.clamp(visible, max=k).expand(B, H, S))
    _, mean = m(x, x, x, key_padding_mask=kpm)
    torch.testing.assert_close(mean, w.mean(dim=0))


@pytest.mark.parametrize("k", [2, 5])
def test_cross_attention_matches_reference(k):
    m = topk_module(k, cross=True)
    x, enc = torch.randn(T, B, E) * 2, torch.randn(S, B, E) * 2
    kpm = padding_mask(B, S, right=[(0, 5), (2, 2)])
    ref = reference_topk_cross(m, x, enc, kpm, k)
    out, w = m(x, enc, enc, key_padding_mask=kpm, static_kv=True, need_head_weights=True)
    torch.testing.assert_close(out.double(), ref.out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.transpose(0, 1).double(), ref.probs, atol=1e-6, rtol=1e-5)


def test_a_large_k_is_fairseqs_attention():
    m = topk_module(S, cross=True, seed=3)
    plain = MultiheadAttention(E, H, kdim=E, vdim=E, encoder_decoder_attention=True).eval()
    plain.load_state_dict(m.state_dict())
    x, enc = torch.randn(T, B, E), torch.randn(S, B, E)
    kpm = padding_mask(B, S, right=[(1, 3)])
    out, w = m(x, enc, enc, key_padding_mask=kpm, static_kv=True)
    out2, w2 = plain(x, enc, enc, key_padding_mask=kpm, static_kv=True)
    torch.testing.assert_close(out, out2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, w2, atol=1e-6, rtol=1e-5)


def test_ties_with_the_kth_logit_are_kept():
    """By hand: one head, identity projections; keys (1, 0), (1, 0), (0, 1), query (2, 0): the logits
    are 2/sqrt(2), 2/sqrt(2), 0. With k = 1 both tied keys stay: weights 1/2, 1/2, 0."""
    m = SparseTopKAttention(2, 1, top_k=1, encoder_decoder_attention=True).eval()
    with torch.no_grad():
        for proj in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
            proj.weight.copy_(torch.eye(2))
            proj.bias.zero_()
    keys = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]).view(3, 1, 2)
    values_out, w = m(torch.tensor([[[2.0, 0.0]]]), keys, keys, static_kv=True)
    torch.testing.assert_close(w, torch.tensor([[[0.5, 0.5, 0.0]]]))
    torch.testing.assert_close(values_out, torch.tensor([[[1.0, 0.0]]]))


def test_incremental_cross_attention_equals_full():
    m = topk_module(3, cross=True, seed=1)
    x, enc = torch.randn(T, B, E) * 2, torch.randn(S, B, E) * 2
    kpm = padding_mask(B, S, right=[(0, 2), (1, 5)])
    full, full_w = m(x, enc, enc, key_padding_mask=kpm, static_kv=True)
    state, outs, weights = {}, [], []
    for t in range(T):  # as the decoder layer calls it at each step
        out, w = m(x[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=state, static_kv=True)
        outs.append(out)
        weights.append(w)
    torch.testing.assert_close(torch.cat(outs), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(weights, dim=1), full_w, atol=1e-6, rtol=1e-5)
    assert m._get_input_buffer(state)["prev_key"].shape == (B, H, S, E // H)  # encoder keys cached once



@pytest.mark.parametrize("beam", [1, 2])
def test_cached_encoder_keys_follow_beam_search(beam):
    """Two sentences x two beams: the rows of one sentence share its encoder output, so fairseq leaves
    the cache alone on a reorder within sentences and selects rows when finished sentences leave; with
    ``set_beam_size`` (what fairseq-generate sets) one copy per sentence is kept and shared by its beams."""
    m = topk_module(3, cross=True, seed=1)
    m.set_beam_size(beam)
    sources, source_kpm = torch.randn(S, 2, E) * 2, padding_mask(2, S, right=[(1, 4)])
    rows = torch.tensor([0, 0, 1, 1])
    enc, kpm, x = sources[:, rows], source_kpm[rows], torch.randn(T, 4, E) * 2
    state = {}
    for t, order in enumerate([None, torch.tensor([1, 1, 3, 2]), None, torch.tensor([2, 3]), None, None]):
        if order is not None:
            m.reorder_incremental_state(state, order)
            enc, kpm, x = enc[:, order], kpm[order], x[:, order]
        out, _ = m(x[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=state, static_kv=True)
        torch.testing.assert_close(out.double(), reference_topk_cross(m, x[t:t + 1], enc, kpm, 3).out,
                                   atol=1e-5, rtol=1e-5)
    assert m._get_input_buffer(state)["prev_key"].size(0) == 2 // beam


def test_gradients_reach_only_the_kept_keys():
    m = topk_module(2, cross=True, seed=2).train()
    x, enc = torch.randn(1, 1, E), torch.randn(S, 1, E, requires_grad=True)
    out, w = m(x, enc, enc, static_kv=True, need_head_weights=True)
    out.sum().backward()
    kept = (w[:, 0, 0] > 0).any(dim=0)  # keys some head kept
    assert kept.sum() <= 2 * H
    assert torch.all(enc.grad[~kept, 0].abs().sum(-1) == 0) and torch.all(enc.grad[kept, 0].abs().sum(-1) > 0)


def test_decoder_self_attention_without_ds_is_plain_attention():
    m = make_attention("sparse_topk", E, H, sparse_topk=1, sparse_topk_attention="es,dc")
    x = torch.randn(T, B, E)
    future = torch.triu(torch.full((T, T), float("-inf")), 1)
    out, _ = m(x, x, x, attn_mask=future, need_weights=False)
    torch.testing.assert_close(out.double(), reference_attention(m, x, "vanilla").out, atol=1e-5, rtol=1e-5)
    sparse = make_attention("sparse_topk", E, H, sparse_topk=1, sparse_topk_attention="ds es")
    out, _ = sparse(x, x, x, attn_mask=future, need_weights=False)
    torch.testing.assert_close(out.double(), reference_attention(sparse, x, "sparse_topk").out, atol=1e-5, rtol=1e-5)


def test_sites_parse_commas_and_spaces():
    assert parse_sites("es,ds,dc") == parse_sites("dc ds es") == parse_sites(" es, ds ,dc ") == {"es", "ds", "dc"}
    assert parse_sites(["dc"]) == {"dc"}


@pytest.mark.parametrize("value, message", [
    ("es,xs", "--sparse-topk-attention: 'xs' is not one of es (encoder self-attention), ds"),
    ("encoder", "--sparse-topk-attention: 'encoder' is not one of"),
    ("", "--sparse-topk-attention: name at least one of es, ds, dc"),
    (" , ", "--sparse-topk-attention: name at least one of es, ds, dc"),
])
def test_a_bad_value_names_the_flag(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_attention(Namespace(self_attn_mode="sparse_topk", sparse_topk_attention=value), H)


def test_the_flag_with_another_mode_is_an_error():
    with pytest.raises(ValueError, match="--sparse-topk-attention es only applies to --self-attn-mode sparse_topk"):
        resolve_attention(Namespace(self_attn_mode="vanilla", sparse_topk_attention="es"), H)
