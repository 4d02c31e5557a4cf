"""The baseline self-attentions (Yang et al. 2018 localness, Zhao et al. 2019 top-k, Hopfield layer)
against naive loop-by-loop readings of their papers' equations, against fairseq, in incremental
decoding, with bad options, and end to end through fairseq's training / generation / eval-lm."""

import math
import re

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from cli_utils import COMMON_TRAIN, TINY_LM, TINY_TRANSLATION, USER_DIR, binarise_multi30k, binarise_wikitext2, cli, cli_in_process

import bet_fairseq  # noqa: F401  (registers the architectures)
from bet_fairseq.modules.baseline_attention import (
    HopfieldSelfAttention,
    SparseTopKSelfAttention,
    build_baseline_attention,
    top_k_keep,
)
from bet_fairseq.modules.bird_eye_decoder import bird_eye_self_attentions

E, H, T, B = 16, 4, 11, 3
D = E // H
NEG = float("-inf")


def future_mask(n):
    return torch.triu(torch.full((n, n), NEG), 1)


# ---------------------------------------------------------------- naive references (float64)
def _weights(m):
    lin = lambda l: (l.weight.detach().double(), l.bias.detach().double())  # noqa: E731
    return lin(m.q_proj), lin(m.k_proj), lin(m.v_proj), lin(m.out_proj)


def _softmax_row(values):
    """softmax over a Python list with -inf entries, written out."""
    top = max(values)
    exps = [0.0 if v == NEG else math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


@torch.no_grad()
def reference(m, x, kind, k=None, beta=None, steps=1, kpm=None):
    """x (T, B, E) -> (out (T, B, E), probs (B, H, T, T)), one query and one key at a time."""
    (Wq, bq), (Wk, bk), (Wv, bv), (Wo, bo) = _weights(m)
    x = x.double()
    n, nb, _ = x.shape
    heads = torch.zeros(n, nb, E, dtype=torch.double)
    probs_all = torch.zeros(nb, H, n, n, dtype=torch.double)
    for b in range(nb):
        Qfull = x[:, b] @ Wq.T + bq
        Kfull = x[:, b] @ Wk.T + bk
        # Hopfield: pattern projection Y W_K W_V; the others: X W_V.
        Vfull = (Kfull @ Wv.T + bv) if kind == "hopfield" else (x[:, b] @ Wv.T + bv)
        for h in range(H):
            cols = slice(h * D, (h + 1) * D)
            Q, K, V = Qfull[:, cols], Kfull[:, cols], Vfull[:, cols]
            for i in range(n):
                visible = [j for j in range(n) if j <= i and not (kpm is not None and kpm[b, j])]
                if kind == "localness":
                    Wp = m.localness_w_p.weight.double()
                    Up, Ud = m.localness_u.weight.double()
                    hidden = torch.tanh(Wp @ Qfull[i])
                    I = i + 1  # keys 0..i are visible to query i
                    P = I * torch.sigmoid(Up @ hidden).item()
                    Dw = I * torch.sigmoid(Ud @ hidden).item()
                    sigma = Dw / 2
                    row = [float(Q[i] @ K[j]) / math.sqrt(D) - (j - P) ** 2 / (2 * sigma ** 2)
                           if j in visible else NEG for j in range(n)]
                elif kind == "sparse_topk":
                    row = [float(Q[i] @ K[j]) / math.sqrt(D) if j in visible else NEG for j in range(n)]
                    ranked = sorted((row[j] for j in visible), reverse=True)
                    threshold = ranked[k - 1] if len(ranked) >= k else NEG
                    row = [v if v >= threshold else NEG for v in row]
                elif kind == "hopfield":
                    xi = Q[i]
                    for _ in range(steps - 1):
                        p = _softmax_row([beta * float(xi @ K[j]) if j in visible else NEG for j in range(n)])
                        xi = sum(p[j] * K[j] for j in range(n))
                    row = [beta * float(xi @ K[j]) if j in visible else NEG for j in range(n)]
                else:
                    raise ValueError(kind)
                p = _softmax_row(row)
                probs_all[b, h, i] = torch.tensor(p, dtype=torch.double)
                heads[i, b, cols] = sum(p[j] * V[j] for j in range(n))
    return heads @ Wo.T + bo, probs_all


def make(kind, seed=0, **settings):
    torch.manual_seed(seed)
    m = build_baseline_attention(E, H, kind, dropout=0.0, **settings).eval()
    if kind == "localness":
        with torch.no_grad():  # sharper windows than the init, so that the bias matters
            m.localness_u.weight.normal_(0, 2.0)
    return m


CASES = [
    ("localness", {}),
    ("sparse_topk", dict(sparse_topk=3)),
    ("sparse_topk", dict(sparse_topk=8)),
    ("hopfield", {}),
    ("hopfield", dict(hopfield_beta=0.9, hopfield_steps=3)),
]
IDS = ["localness", "topk3", "topk8", "hopfield", "hopfield_beta0.9_steps3"]


def ref_for(m, x, kpm=None):
    if isinstance(m, SparseTopKSelfAttention):
        return reference(m, x, "sparse_topk", k=m.sparse_topk, kpm=kpm)
    if isinstance(m, HopfieldSelfAttention):
        return reference(m, x, "hopfield", beta=m.hopfield_beta, steps=m.hopfield_steps, kpm=kpm)
    return reference(m, x, "localness", kpm=kpm)


@pytest.mark.parametrize("kind, settings", CASES, ids=IDS)
def test_forward_and_weights_match_reference(kind, settings):
    m = make(kind, **settings)
    x = torch.randn(T, B, E)
    out, w = m(x, x, x, attn_mask=future_mask(T), need_head_weights=True)
    ref_out, ref_probs = ref_for(m, x)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.transpose(0, 1).double(), ref_probs, atol=1e-6, rtol=1e-5)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    assert torch.all(w[..., future] == 0)
    if kind == "sparse_topk":  # random logits have no ties: exactly min(k, i + 1) keys per row
        kept = (w > 0).sum(-1)
        assert torch.equal(kept, torch.clamp(torch.arange(1, T + 1), max=m.sparse_topk).expand_as(kept))


@pytest.mark.parametrize("kind, settings", CASES[::2], ids=IDS[::2])
def test_padding_matches_reference(kind, settings):
    m = make(kind, **settings)
    x = torch.randn(T, B, E)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, -3:] = True  # right padding, as fairseq's target side
    out, _ = m(x, x, x, key_padding_mask=kpm, attn_mask=future_mask(T), need_weights=False)
    ref_out, _ = ref_for(m, x, kpm)
    keep = ~kpm.T  # padded query rows are never read
    torch.testing.assert_close(out.double()[keep], ref_out[keep], atol=1e-5, rtol=1e-5)


def test_top_k_ties_and_short_rows_worked_by_hand():
    allowed = torch.tensor([[True, True, True, True, False]])
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0, 9.0]])  # 9.0 is not allowed (future/padding)
    assert top_k_keep(logits, allowed, 1).tolist() == [[True, False, True, False, False]]  # tie at the top
    assert top_k_keep(logits, allowed, 2).tolist() == [[True, False, True, False, False]]
    assert top_k_keep(logits, allowed, 3).tolist() == [[True, False, True, True, False]]
    assert top_k_keep(logits, allowed, 8).tolist() == [[True, True, True, True, False]]  # fewer than k
    tie = torch.tensor([[5.0, 2.0, 2.0, 1.0]])
    assert top_k_keep(tie, torch.ones(1, 4, dtype=torch.bool), 2).tolist() == [[True, True, True, False]]


def test_localness_window_lies_in_the_visible_prefix():
    m = make("localness")
    x = torch.randn(T, B, E) * 3
    positions = torch.arange(T)
    centre, width = m.window(m.q_proj(x), positions)
    assert centre.shape == (B, T)
    assert torch.all(centre > 0) and torch.all(centre < positions + 1)
    assert torch.all(width > 0) and torch.all(width < positions + 1)


def test_hopfield_one_step_is_fairseq_attention():
    """beta = 1/sqrt(d), one step: standard attention with the value weights W_V' = W_K W_V; load a
    fairseq MultiheadAttention's weights with W_V solved for, and compare outputs and weights."""
    torch.manual_seed(1)
    fs = MultiheadAttention(E, H, self_attention=True, dropout=0.0).eval()
    hop = build_baseline_attention(E, H, "hopfield", dropout=0.0).eval()
    assert hop.hopfield_beta == pytest.approx(1 / math.sqrt(D))
    state = {n: p.detach().clone() for n, p in fs.state_dict().items()}
    Wk, bk = state["k_proj.weight"].double(), state["k_proj.bias"].double()
    Wv_fs, bv_fs = state["v_proj.weight"].double(), state["v_proj.bias"].double()
    Wv = Wv_fs @ torch.linalg.inv(Wk)  # (x Wk^T + bk) Wv^T + bv == x Wv_fs^T + bv_fs
    state["v_proj.weight"] = Wv.float()
    state["v_proj.bias"] = (bv_fs - Wv @ bk).float()
    hop.load_state_dict(state)
    x = torch.randn(T, B, E)
    expected, expected_w = fs(x, x, x, attn_mask=future_mask(T), need_weights=True)
    got, got_w = hop(x, x, x, attn_mask=future_mask(T), need_weights=True)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_w, expected_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind, settings", CASES, ids=IDS)
def test_incremental_equals_full_and_reorder(kind, settings):
    m = make(kind, **settings)
    x = torch.randn(T, B, E)
    full, _ = m(x, x, x, attn_mask=future_mask(T), need_weights=False)
    state = {}
    steps = [m(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state)[0] for t in range(T)]
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=1e-5)
    assert m._get_input_buffer(state)["prev_key"].shape == (B, H, T, D)  # batch-first cache

    order = torch.tensor([2, 0, 0])  # beam search reorders the cache mid-sequence
    state = {}
    for t in range(4):
        m(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state)
    m.reorder_incremental_state(state, order)
    x2 = x[:, order]
    outs = [m(x2[t : t + 1], x2[t : t + 1], x2[t : t + 1], incremental_state=state)[0] for t in range(4, T)]
    full2, _ = m(x2, x2, x2, attn_mask=future_mask(T))
    torch.testing.assert_close(torch.cat(outs), full2[4:], atol=1e-5, rtol=1e-5)


def test_capture_and_parameters():
    for kind in ("localness", "sparse_topk", "hopfield"):
        m = make(kind)
        vanilla = MultiheadAttention(E, H, self_attention=True)
        n_extra = sum(p.numel() for p in m.parameters()) - sum(p.numel() for p in vanilla.parameters())
        assert n_extra == (E * E + 2 * E if kind == "localness" else 0), kind  # W_p, U_p, U_d
        m.capture_attention = True
        x = torch.randn(T, B, E)
        m(x, x, x, attn_mask=future_mask(T), need_weights=False)
        assert m.captured_attention.shape == (B, H, T, T)
        torch.testing.assert_close(m.captured_attention.sum(-1), torch.ones(B, H, T))


@pytest.mark.parametrize(
    "kind, kwargs, message",
    [
        ("bogus", {}, "unknown baseline 'bogus'"),
        ("sparse_topk", dict(sparse_topk=0), "--sparse-topk must be a whole number >= 1"),
        ("sparse_topk", dict(sparse_topk=-3), "--sparse-topk must be a whole number >= 1"),
        ("hopfield", dict(hopfield_beta=0.0), "--hopfield-beta must be a finite number > 0"),
        ("hopfield", dict(hopfield_beta=-1.0), "--hopfield-beta must be a finite number > 0"),
        ("hopfield", dict(hopfield_beta=float("inf")), "--hopfield-beta must be a finite number > 0"),
        ("hopfield", dict(hopfield_steps=0), "--hopfield-steps must be a whole number >= 1"),
        ("localness", dict(sparse_topk=4), "--sparse-topk only applies"),
        ("sparse_topk", dict(hopfield_steps=2), "only apply to --self-attn-baseline hopfield"),
    ],
)
def test_bad_settings_are_clear_errors(kind, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_baseline_attention(E, H, kind, **kwargs)


def test_missing_baseline_is_a_clear_error():
    from argparse import Namespace

    from bet_fairseq.modules.baseline_decoder import baseline_settings

    with pytest.raises(ValueError, match="no --self-attn-baseline given"):
        baseline_settings(Namespace())


SIZE_FIELDS = ("encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim",
               "decoder_ffn_embed_dim", "encoder_attention_heads", "decoder_attention_heads")


@pytest.mark.parametrize("name", ["localness", "sparse_topk", "hopfield"])
def test_architectures_have_the_sizes_of_the_other_rows(name):
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY

    pairs = [(f"{name}_iwslt", "transformer_iwslt_de_en"), (f"{name}_wmt_en_de", "transformer_wmt_en_de"),
             (f"{name}_lm", "transformer_lm_wikitext2"), (f"{name}_lm_wikitext103", "transformer_lm_wikitext103"),
             (f"{name}_lm_enwik8", "transformer_lm_enwik8")]
    for ours, theirs in pairs:
        a, b = Namespace(), Namespace()
        ARCH_CONFIG_REGISTRY[ours](a)
        ARCH_CONFIG_REGISTRY[theirs](b)
        assert a.self_attn_baseline == name
        assert {f: getattr(a, f, None) for f in SIZE_FIELDS} == {f: getattr(b, f, None) for f in SIZE_FIELDS}, ours
    a = Namespace()
    ARCH_CONFIG_REGISTRY[f"{name}_lm_enwik8"](a)
    sizes = (a.decoder_layers, a.decoder_embed_dim, a.decoder_attention_heads, a.decoder_ffn_embed_dim)
    assert sizes == (6, 512, 4, 2048)


# ---------------------------------------------------------------- end to end
ARCHS = ["localness", "sparse_topk", "hopfield"]


def _train_in_process(argv):
    from fairseq_cli import train as train_cli

    cli_in_process(train_cli, argv)


def test_end_to_end(tmp_path):
    """Every baseline arch trains (in process); one real fairseq-train + fairseq-generate and one
    fairseq-train + fairseq-eval-lm; bad options through fairseq-train's parser are clear errors."""
    mt = binarise_multi30k(str(tmp_path / "mt"), n_train=300, n_valid=40, n_test=16)
    lm = binarise_wikitext2(str(tmp_path / "lm"), n_train=200, n_valid=30, n_test=30)
    for name in ARCHS:
        _train_in_process([mt, "--user-dir", USER_DIR, "--arch", f"{name}_iwslt", *TINY_TRANSLATION,
                           *COMMON_TRAIN, "--max-tokens", "1000", "--max-update", "2",
                           "--save-dir", tmp_path / f"{name}_mt", "--no-save"])
        _train_in_process([lm, "--task", "language_modeling", "--user-dir", USER_DIR, "--arch", f"{name}_lm",
                           *TINY_LM, *COMMON_TRAIN, "--tokens-per-sample", "32", "--max-tokens", "512",
                           "--max-update", "2", "--save-dir", tmp_path / f"{name}_lm", "--no-save"])

    save = tmp_path / "sparse_ckpt"
    cli("fairseq-train", mt, "--user-dir", USER_DIR, "--arch", "sparse_topk_iwslt", "--sparse-topk", "4",
        *TINY_TRANSLATION, *COMMON_TRAIN, "--max-tokens", "1500", "--max-update", "3", "--save-dir", save)
    state = torch.load(save / "checkpoint_last.pt", weights_only=True)
    assert state["cfg"]["model"].self_attn_baseline == "sparse_topk"
    assert state["cfg"]["model"].sparse_topk == 4
    out = cli("fairseq-generate", mt, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
              "--beam", "3", "--batch-size", "8", "--max-len-b", "15", "--cpu", "--gen-subset", "test").stdout
    assert "BLEU4" in out
    assert len(re.findall(r"^H-\d+", out, re.M)) == 16

    save = tmp_path / "hopfield_lm_ckpt"
    cli("fairseq-train", lm, "--task", "language_modeling", "--user-dir", USER_DIR, "--arch", "hopfield_lm",
        "--hopfield-steps", "2", *TINY_LM, *COMMON_TRAIN, "--tokens-per-sample", "32", "--max-tokens", "512",
        "--max-update", "3", "--save-dir", save)
    proc = cli("fairseq-eval-lm", lm, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
               "--tokens-per-sample", "32", "--max-tokens", "512", "--cpu", "--gen-subset", "test")
    ppl = float(re.search(r"Perplexity: ([\d.]+)", proc.stdout + proc.stderr).group(1))
    assert 1 < ppl < 1e6
    from fairseq import checkpoint_utils

    models, _ = checkpoint_utils.load_model_ensemble([str(save / "checkpoint_last.pt")])
    attns = bird_eye_self_attentions(models[0])
    assert len(attns) == 2 and all(isinstance(a, HopfieldSelfAttention) and a.hopfield_steps == 2 for a in attns)

    with pytest.raises(ValueError, match="--hopfield-beta must be a finite number > 0"):
        _train_in_process([mt, "--user-dir", USER_DIR, "--arch", "hopfield_iwslt", "--hopfield-beta", "0",
                           *TINY_TRANSLATION, *COMMON_TRAIN, "--max-tokens", "1000", "--max-update", "1",
                           "--save-dir", tmp_path / "bad"])
    with pytest.raises(ValueError, match="do not apply to a --self-attn-baseline model"):
        _train_in_process([mt, "--user-dir", USER_DIR, "--arch", "localness_iwslt", "--self-attn-mode", "bet_sf",
                           *TINY_TRANSLATION, *COMMON_TRAIN, "--max-tokens", "1000", "--max-update", "1",
                           "--save-dir", tmp_path / "bad"])
