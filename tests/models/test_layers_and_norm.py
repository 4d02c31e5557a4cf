"""Two model options: ``--self-attn-layers`` (the variant in some decoder layers only, vanilla attention in
the others) and the language models' post-norm layers (the paper's equations 2-3; fairseq's
``--decoder-normalize-before`` still gives pre-norm). The post-norm model is checked against a one-layer
language model written out by hand from its own weights."""

import math

import pytest
import torch
import torch.nn.functional as F

from cli_utils import (
    LM_TRAIN, MT_TRAIN, TINY_LM, binarise_multi30k, binarise_wikitext2, build_model, eval_lm_in_process,
    generate_in_process, session_corpus, toy_dictionaries, train_in_process,
)

from bet_fairseq.attention import VARIANTS
from bet_fairseq.attention.capture import decoder_self_attentions

LM = ["--task", "language_modeling"]


@pytest.fixture(scope="module")
def dicts(tmp_path_factory):
    return toy_dictionaries(tmp_path_factory.mktemp("dicts"))


def lm(dicts, arch, *flags):
    return build_model([dicts, *LM, "--arch", arch, *flags])[0]


@pytest.mark.parametrize("layers, expected", [
    ("0", [0]), ("1-3", [1, 2, 3]), ("0,2-3", [0, 2, 3]), ("all", [0, 1, 2, 3]),
    (None, [0, 1]),  # the localness row: Yang et al.'s lower layers, half of them
])
def test_the_variant_sits_in_the_named_layers_only(dicts, layers, expected):
    flags = ["--decoder-layers", "4", "--decoder-embed-dim", "32", "--decoder-attention-heads", "4"]
    flags += [] if layers is None else ["--self-attn-layers", layers]
    model = lm(dicts, "localness_lm", *flags)
    kinds = [type(m) for m in decoder_self_attentions(model)]
    assert kinds == [VARIANTS["localness" if i in expected else "vanilla"] for i in range(4)]
    params = {n.split(".")[2] for n, _ in model.named_parameters() if "localness" in n}
    assert params == {str(i) for i in expected}


@pytest.mark.parametrize("bad, says", [("4", "outside"), ("2-1", "outside"), ("x", "not a layer index"), ("-1", "not a layer")])
def test_bad_layer_ranges_name_the_flag(dicts, bad, says):
    with pytest.raises(ValueError, match=f"--self-attn-layers.*{says}"):
        lm(dicts, "localness_lm", *TINY_LM, "--self-attn-layers", bad)


def test_language_models_are_post_norm_unless_asked(dicts):
    post = lm(dicts, "vanilla_lm", *TINY_LM)
    assert not post.decoder.layers[0].normalize_before and post.decoder.layer_norm is None
    pre = lm(dicts, "vanilla_lm", *TINY_LM, "--decoder-normalize-before")
    assert pre.decoder.layers[0].normalize_before and pre.decoder.layer_norm is not None


def test_post_norm_language_model_against_a_hand_written_one(dicts):
    """x = scale * E[w] + P; h = LN1(x + MHA(x)); y = LN2(h + FFN(h)); logits = y E^T (shared embeddings)."""
    torch.manual_seed(0)
    model = lm(dicts, "vanilla_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim",
               "24", "--decoder-attention-heads", "2", "--share-decoder-input-output-embed").eval().double()
    tokens = torch.randint(4, 50, (2, 7))
    with torch.no_grad():
        ours = model(tokens)[0]
        dec, layer = model.decoder, model.decoder.layers[0]
        emb = dec.embed_tokens.weight
        x = math.sqrt(16) * emb[tokens] + dec.embed_positions(tokens)
        attn = layer.self_attn
        q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(2, 7, 2, 8).transpose(1, 2) / math.sqrt(8)
        k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(2, 7, 2, 8).transpose(1, 2)
        v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(2, 7, 2, 8).transpose(1, 2)
        future = torch.ones(7, 7, dtype=torch.bool).triu(1)
        a = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(future, float("-inf")), -1) @ v
        a = F.linear(a.transpose(1, 2).reshape(2, 7, 16), attn.out_proj.weight, attn.out_proj.bias)
        h = F.layer_norm(x + a, (16,), layer.self_attn_layer_norm.weight, layer.self_attn_layer_norm.bias)
        f = F.linear(torch.relu(F.linear(h, layer.fc1.weight, layer.fc1.bias)), layer.fc2.weight, layer.fc2.bias)
        y = F.layer_norm(h + f, (16,), layer.final_layer_norm.weight, layer.final_layer_norm.bias)
        expected = y @ emb.T
    torch.testing.assert_close(ours, expected, rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    return (session_corpus(tmp_path_factory, binarise_multi30k, n_test=37),
            session_corpus(tmp_path_factory, binarise_wikitext2))


def test_layer_range_and_post_norm_through_the_command_line(tmp_path, corpora):
    mt_data, lm_data = corpora
    ckpt = train_in_process(mt_data, tmp_path / "mt", "--arch", "bet_sf_iwslt", *MT_TRAIN, "--self-attn-layers", "1")
    out = generate_in_process([mt_data, "--path", ckpt, "--beam", "2", "--gen-subset", "test", "--max-len-b", "5",
                               "--required-batch-size-multiple", "1"])
    assert len([line for line in out.splitlines() if line.startswith("H-")]) == 37
    stored = torch.load(ckpt, weights_only=False)
    assert stored["cfg"]["model"].self_attn_layers == "1"
    assert any("decoder.layers.1.self_attn.bet_w" in k for k in stored["model"])
    assert not any("decoder.layers.0.self_attn.bet_w" in k for k in stored["model"])

    ckpt = train_in_process(lm_data, tmp_path / "lm", "--arch", "bet_sf_lm", *LM_TRAIN)
    assert torch.load(ckpt, weights_only=False)["cfg"]["model"]["decoder_normalize_before"] is False
    result = eval_lm_in_process([lm_data, "--path", ckpt, "--tokens-per-sample", "64", "--max-tokens", "1024"])
    assert math.isfinite(result["loss"])
