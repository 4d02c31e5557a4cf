"""bet-analyze (docs/method.md, §1.2 and §7): Table 1 statistics against a hand computation and against an
independent per-sentence computation, capture on fairseq attention converted to the capturing
``vanilla`` variant against fairseq's own weights, and the command on real tiny checkpoints trained here."""

import json
import math
import types
from fractions import Fraction

import numpy as np
import pytest
import torch

from cli_utils import MT_TRAIN, binarise_multi30k, cli, session_corpus, train_in_process

from fairseq import models, options
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.modules.multihead_attention import MultiheadAttention

from bet_fairseq.tools.analysis import cli as analyze
from bet_fairseq.tools.analysis.attention_stats import collect_attention_stats
from bet_fairseq.attention.capture import as_capturing_vanilla, capture_attention, decoder_self_attentions
from bet_fairseq.tools.analysis.topk import bpe_words, top_k_words
from bet_fairseq.attention.vanilla import VanillaSelfAttention

TINY_DECODER = "--decoder-layers 2 --decoder-embed-dim 16 --decoder-attention-heads 2 --decoder-ffn-embed-dim 32"
TINY_ENCODER = "--encoder-layers 1 --encoder-embed-dim 16 --encoder-attention-heads 2 --encoder-ffn-embed-dim 32"
HEADS = 2


@pytest.fixture(scope="module")
def vocab():
    d = Dictionary()
    for w in "the a man dog runs on grass in park . is red".split():
        d.add_symbol(w)
    return d


def build(vocab, task_name, arch, flags, seed=0):
    """A tiny model with random weights, built in-process the way fairseq-train builds it."""
    torch.manual_seed(seed)
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["/dev/null", "--task", task_name, "--arch", arch, "--dropout", "0", *flags.split()])
    task = types.SimpleNamespace(source_dictionary=vocab, target_dictionary=vocab)
    return models.build_model(convert_namespace_to_omegaconf(args).model, task).eval()


def token_batch(vocab, lengths, left_pad=False, seed=0):
    """Decoder inputs: each row starts with </s> (as fairseq's shifted targets do), then words."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), max(lengths)), vocab.pad())
    for b, n in enumerate(lengths):
        ids = torch.randint(vocab.nspecial, len(vocab), (n,), generator=g)
        ids[0] = vocab.eos()
        if left_pad:
            tokens[b, tokens.size(1) - n:] = ids
        else:
            tokens[b, :n] = ids
    return tokens


def lm_sample(vocab, lengths, left_pad=False, seed=0):
    tokens = token_batch(vocab, lengths, left_pad, seed)
    return {"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor(lengths)}}


# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("left_pad", [False, True])
def test_uniform_attention_matches_hand_computation(vocab, left_pad):
    """Zero q/k projections make every row uniform: row i has weight 1/(i+1) on each of its i+1
    visible keys. CA and HA then follow by hand, padding excluded."""
    model = build(vocab, "language_modeling", "transformer_lm", TINY_DECODER)
    assert all(type(layer.self_attn) is MultiheadAttention for layer in model.decoder.layers)
    for layer in model.decoder.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            torch.nn.init.zeros_(proj.weight)
            torch.nn.init.zeros_(proj.bias)
    attentions = decoder_self_attentions(model, convert=True)  # converts fairseq's modules in place
    assert all(type(a) is VanillaSelfAttention for a in attentions)

    lengths = [2, 5, 3]
    rows = [i for n in lengths for i in range(n)]  # row numbers of all real tokens
    ca_without_row0 = sum(Fraction(1, i + 1) for i in rows if i > 0) / sum(1 for i in rows if i > 0)
    ca_with_row0 = sum(Fraction(1, i + 1) for i in rows) / len(rows)
    n_hist = sum(rows)  # row i has i historical entries
    ha = sum(Fraction(i, i + 1) for i in rows) / n_hist
    ha_second = sum(Fraction(i, (i + 1) ** 2) for i in rows) / n_hist
    ha_std = math.sqrt(ha_second - ha * ha)
    # The batch pads two of the three sentences.
    sample = lm_sample(vocab, lengths, left_pad)
    assert sample["net_input"]["src_tokens"].eq(vocab.pad()).sum() == (5 - 2) + (5 - 3)

    for include_row0, ca in ((False, ca_without_row0), (True, ca_with_row0)):
        acc = collect_attention_stats(model, attentions, [sample], vocab.pad(), include_first_row=include_row0,
                                      ha_over="heads")  # counts per head
        result = acc.result()
        assert set(result) == {"final"}  # no first pass in a vanilla model
        assert len(result["final"]) == 2
        for layer in result["final"]:
            assert layer["CA"] == pytest.approx(float(ca), abs=1e-6)
            assert layer["HA_mean"] == pytest.approx(float(ha), abs=1e-6)
            assert layer["HA_std"] == pytest.approx(ha_std, abs=1e-6)
            assert layer["Ratio"] == pytest.approx(float(ca / ha), rel=1e-5)
            assert layer["hist_count"] == HEADS * n_hist
            assert layer["diag_count"] == HEADS * (len(rows) if include_row0 else len(rows) - len(lengths))
        assert acc.sentences == 3 and acc.tokens == sum(lengths)


def reference_stats(matrices, include_row0=False):
    """Independent numpy computation over the full stacked per-sentence matrices (H, n, n)."""
    diag, hist = [], []
    for m in matrices:
        n = m.shape[-1]
        start = 0 if include_row0 else 1
        diag.append(np.stack([m[:, i, i] for i in range(start, n)]).ravel() if n > start else np.zeros(0))
        r, c = np.tril_indices(n, k=-1)
        hist.append(m[:, r, c].ravel())
    diag, hist = np.concatenate(diag), np.concatenate(hist)
    return {"CA": diag.mean(), "HA_mean": hist.mean(), "HA_std": hist.std(), "Ratio": diag.mean() / hist.mean()}


@pytest.mark.parametrize("arch", ["bet_sf_lm", "transformer_lm_wikitext2_reduced_diag"])
def test_streaming_equals_full_computation(vocab, arch):
    """Sums over several padded batches == numpy over every sentence's own unpadded matrix."""
    model = build(vocab, "language_modeling", arch, TINY_DECODER, seed=3)
    attentions = decoder_self_attentions(model)
    batches = [lm_sample(vocab, lengths, seed=s) for s, lengths in enumerate([[4, 7, 2], [9], [3, 3, 6, 5]])]
    acc = collect_attention_stats(model, attentions, batches, vocab.pad(), ca_rows="skip-first", ha_over="heads")

    # Reference: each sentence alone (batch of one, no padding), matrices kept and stacked.
    per_layer = {"final": [[] for _ in attentions], "first_pass": [[] for _ in attentions]}
    with torch.no_grad(), capture_attention(model) as captured:
        for batch in batches:
            tokens, lengths = batch["net_input"]["src_tokens"], batch["net_input"]["src_lengths"]
            for row, n in zip(tokens, lengths.tolist()):
                model(row[:n].unsqueeze(0), features_only=True)
                for layer, record in enumerate(captured.layers()):
                    per_layer["final"][layer].append(record.probs[0].double().numpy())
                    if record.first_pass is not None:
                        per_layer["first_pass"][layer].append(record.first_pass[0].double().numpy())

    result = acc.result()
    expected_kinds = {"final", "first_pass"} if arch == "bet_sf_lm" else {"final"}
    assert set(result) == expected_kinds
    for kind in expected_kinds:
        for layer, got in enumerate(result[kind]):
            want = reference_stats(per_layer[kind][layer])
            for key in ("CA", "HA_mean", "HA_std", "Ratio"):
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (kind, layer, key)
    # BET(SF)'s DiagFreeMask: A' has no weight on the diagonal after row 0; its first pass has.
    if arch == "bet_sf_lm":
        assert all(layer["CA"] == 0.0 for layer in result["final"])
        assert all(layer["CA"] > 0.0 for layer in result["first_pass"])


def test_captured_weights_equal_fairseqs_own(vocab):
    """A plain fairseq transformer: after the swap, the captured per-head weights equal what
    fairseq's MultiheadAttention itself returns for the same inputs, and the model's output is
    unchanged."""
    model = build(vocab, "translation", "transformer_iwslt_de_en", f"{TINY_ENCODER} {TINY_DECODER}", seed=5)
    originals = [layer.self_attn for layer in model.decoder.layers]
    assert all(type(m) is MultiheadAttention for m in originals)
    src = token_batch(vocab, [6, 4, 5], left_pad=True, seed=1)
    src[:, -1] = vocab.eos()
    prev = token_batch(vocab, [5, 3, 4], seed=2)  # right-padded, as fairseq's collater makes it
    net_input = {"src_tokens": src, "src_lengths": src.ne(vocab.pad()).sum(1), "prev_output_tokens": prev}

    calls = []
    hooks = [m.register_forward_pre_hook(lambda mod, a, kw: calls.append(kw), with_kwargs=True) for m in originals]
    with torch.no_grad():
        before, _ = model(**net_input)
    for h in hooks:
        h.remove()
    fairseq_heads, fairseq_mean = [], []
    with torch.no_grad():
        for m, kw in zip(originals, calls):
            args = dict(query=kw["query"], key=kw["key"], value=kw["value"],
                        key_padding_mask=kw["key_padding_mask"], attn_mask=kw["attn_mask"])
            _, mean = m(**args, need_weights=True)  # fairseq's fused path: weights averaged over heads
            m.skip_embed_dim_check = True  # fairseq's own non-fused implementation, per head
            _, heads = m(**args, need_head_weights=True)
            m.skip_embed_dim_check = False
            fairseq_mean.append(mean)
            fairseq_heads.append(heads.transpose(0, 1))  # (heads, B, T, S) -> (B, heads, T, S)
    assert calls[0]["key_padding_mask"] is not None  # padding was in play

    with pytest.raises(ValueError, match="decoder layer 0: self_attn is fairseq's MultiheadAttention"):
        decoder_self_attentions(model)  # converting is asked for, never done behind the caller's back
    attentions = decoder_self_attentions(model, convert=True)
    assert all(type(a) is VanillaSelfAttention and as_capturing_vanilla(a) is a for a in attentions)
    with torch.no_grad(), capture_attention(model) as captured:
        after, _ = model(**net_input)
        for record, heads, mean in zip(captured.layers(), fairseq_heads, fairseq_mean):
            assert record.probs.shape == heads.shape == (3, HEADS, 5, 5)
            torch.testing.assert_close(record.probs, heads, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(record.probs.mean(1), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_top_k_words_merge_bpe_pieces():
    pieces = ["</s>", "the", "bi@@", "cycle", "is", "red"]
    assert bpe_words(pieces) == ([0, 1, 2, 2, 3, 4], ["</s>", "the", "bicycle", "is", "red"])
    row = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15, 0.0])  # query at "is": "red" is not visible
    top = top_k_words(row, pieces, k=3)
    assert [w for w, _ in top] == ["bicycle", "the", "is"]
    assert [p for _, p in top] == pytest.approx([0.55, 0.2, 0.15])
    assert [w for w, _ in top_k_words(row, pieces, k=9)] == ["bicycle", "the", "is", "</s>"]  # weight-0 "red" never
    assert [w for w, _ in top_k_words(row, pieces, k=2, marker=None)] == ["bi@@", "cycle"]


# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A plain fairseq transformer_iwslt_de_en and a BET(SF), two updates each on real Multi30k."""
    work = tmp_path_factory.mktemp("analysis")
    data = session_corpus(tmp_path_factory, binarise_multi30k, n_test=37)
    trained = {name: train_in_process(data, work / arch, "--arch", arch, *MT_TRAIN, "--no-save-optimizer-state",
                                      updates=2)
               for name, arch in (("vanilla", "transformer_iwslt_de_en"), ("bet_sf", "bet_sf_iwslt"))}
    return dict(trained, data=data, work=work)


def test_command_on_real_checkpoints(checkpoints, capsys):
    import matplotlib.image

    data, work = checkpoints["data"], checkpoints["work"]
    out = work / "out"
    # BET(SF) through the real console script; row 0 excluded (--ca-rows skip-first).
    cli("bet-analyze", "stats", checkpoints["bet_sf"], "--data", data, "--split", "valid", "--cpu",
        "--max-tokens", "300", "--out", out / "sf", "--no-progress", "--ca-rows", "skip-first")
    sf = json.loads((out / "sf.json").read_text())
    assert sf["self_attn_mode"] == "bet_sf" and sf["sentences"] == 100
    assert len(sf["matrices"]["final"]) == 2 and len(sf["matrices"]["first_pass"]) == 2
    assert all(layer["CA"] == 0.0 for layer in sf["matrices"]["final"])  # DiagFreeMask, rows after the first
    assert all(layer["CA"] > 0.0 for layer in sf["matrices"]["first_pass"])
    md = (out / "sf.md").read_text()
    assert "| CA | 0.0000 | 0.0000 |" in md and "| HA(mean) |" in md and "| Ratio |" in md
    # Row 0 included: only row 0 keeps its diagonal (weight 1), so CA(A') = sentences / tokens.
    analyze.main(["stats", checkpoints["bet_sf"], "--data", data, "--cpu", "--include-first-row",
                  "--out", str(out / "sf_row0"), "--no-progress"])
    sf0 = json.loads((out / "sf_row0.json").read_text())
    for layer in sf0["matrices"]["final"]:
        assert layer["CA"] == pytest.approx(sf0["sentences"] / sf0["tokens"], rel=1e-9)

    # The plain fairseq checkpoint (fairseq MultiheadAttention, converted for capture).
    analyze.main(["stats", checkpoints["vanilla"], "--data", data, "--cpu", "--out", str(out / "vanilla"),
                  "--no-progress"])
    van = json.loads((out / "vanilla.json").read_text())
    assert set(van["matrices"]) == {"final"} and van["arch"] == "transformer_iwslt_de_en"
    assert (van["ca_rows"], van["ha_over"]) == ("all", "head-mean") and van["definition"] in (out / "vanilla.md").read_text()
    for layer in van["matrices"]["final"]:
        assert 0 < layer["CA"] < 1 and 0 < layer["HA_mean"] < 1
        assert layer["Ratio"] == pytest.approx(layer["CA"] / layer["HA_mean"])

    # Top-k side by side, heatmaps and bars.
    capsys.readouterr()
    analyze.main(["topk", checkpoints["vanilla"], checkpoints["bet_sf"], "--data", data, "--cpu",
                  "--indices", "3", "--labels", "Transformer", "BET(SF)", "--out", str(out / "topk.md")])
    topk = (out / "topk.md").read_text()
    assert "Transformer: top-3" in topk and "BET(SF): top-3" in topk and "valid sentence 3" in topk
    analyze.main(["heatmap", checkpoints["bet_sf"], "--data", data, "--cpu", "--index", "1", "--layers", "1",
                  "--out-dir", str(out / "heat"), "--heads", "0,mean"])
    analyze.main(["heatmap", checkpoints["bet_sf"], "--data", data, "--cpu", "--index", "1", "--layers", "2",
                  "--heads", "mean", "--matrix", "first_pass", "--out-dir", str(out / "heat"), "--prefix", "A_"])
    analyze.main(["bars", str(out / "vanilla.json"), str(out / "sf.json"), "--labels", "Transformer", "BET(SF)",
                  "--out", str(out / "bars.png")])
    pngs = sorted(p.name for p in (out / "heat").iterdir())
    assert pngs == ["A_layer2_mean.png", "layer1_head0.png", "layer1_mean.png"]
    for path in [*(out / "heat").iterdir(), out / "bars.png"]:
        image = matplotlib.image.imread(str(path))
        assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50


def test_bad_input_is_a_clear_error(checkpoints, tmp_path, capsys):
    assert analyze.main(["stats", str(tmp_path / "missing.pt"), "--data", checkpoints["data"]]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("a man runs .\n")  # a translation model needs source<TAB>target
    assert analyze.main(["topk", checkpoints["vanilla"], "--data", checkpoints["data"], "--cpu", "--text", str(bad)]) == 2
    assert f"{bad}:1" in capsys.readouterr().err
    assert analyze.main(["heatmap", checkpoints["vanilla"], "--data", checkpoints["data"], "--cpu", "--index", "0",
                         "--matrix", "first_pass", "--out-dir", str(tmp_path)]) == 2
    assert "not a BET(SF) model" in capsys.readouterr().err
