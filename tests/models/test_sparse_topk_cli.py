"""``--sparse-topk-attention`` through fairseq's command line: which attentions of the built model keep
the top k (encoder self ``es``, decoder self ``ds``, encoder-decoder ``dc``), the translation rows'
default (all three, as Zhao et al.'s code), language models, a bad value, and fairseq-train ->
fairseq-generate with all three."""

import re

import pytest
import torch
from fairseq import checkpoint_utils

from cli_utils import (
    MT_TRAIN, TINY_LM, TINY_TRANSLATION, USER_DIR, binarise_multi30k, build_model, generate_in_process,
    session_corpus, toy_dictionaries, train_in_process,
)

from bet_fairseq.attention.sparse_topk import SparseTopKAttention, SparseTopKSelfAttention, parse_sites

N_TEST = 37  # as tests/models/test_cli_end_to_end.py: the same session corpus


@pytest.fixture(scope="module")
def dicts(tmp_path_factory):
    return toy_dictionaries(tmp_path_factory.mktemp("dicts"))


def sparse_sites(model):
    """{site: the layers whose attention there keeps the top k}, with every top-k module's k."""
    sites = {"es": 0, "ds": 0, "dc": 0}
    ks = set()
    for layer in getattr(getattr(model, "encoder", None), "layers", []):
        if isinstance(layer.self_attn, SparseTopKAttention):
            sites["es"] += 1
            ks.add(layer.self_attn.top_k)
    for layer in model.decoder.layers:
        attn = layer.self_attn
        if isinstance(attn, SparseTopKSelfAttention) and "ds" in parse_sites(attn.options.sparse_topk_attention):
            sites["ds"] += 1
            ks.add(attn.top_k)
        if isinstance(getattr(layer, "encoder_attn", None), SparseTopKAttention):
            sites["dc"] += 1
            ks.add(layer.encoder_attn.top_k)
    top_k_modules = [m for m in model.modules() if isinstance(m, SparseTopKAttention)]
    assert len(top_k_modules) == sites["es"] + sites["dc"], "no top-k module outside the encoder/cross slots"
    return sites, ks


MT = ["--task", "translation", "-s", "de", "-t", "en", *TINY_TRANSLATION]


@pytest.mark.parametrize("argv, sites, k", [
    (["--arch", "sparse_topk_iwslt"], dict(es=2, ds=2, dc=2), {8}),
    (["--arch", "sparse_topk_wmt_en_de", "--sparse-topk", "3"], dict(es=2, ds=2, dc=2), {3}),
    (["--arch", "sparse_topk_iwslt", "--sparse-topk-attention", "ds"], dict(es=0, ds=2, dc=0), {8}),
    (["--arch", "sparse_topk_iwslt", "--sparse-topk-attention", "dc es", "--sparse-topk", "5"],
     dict(es=2, ds=0, dc=2), {5}),
    (["--arch", "vanilla_iwslt", "--self-attn-mode", "sparse_topk", "--sparse-topk-attention", "es"],
     dict(es=2, ds=0, dc=0), {8}),
    (["--arch", "sparse_topk_iwslt", "--self-attn-layers", "1"], dict(es=2, ds=1, dc=2), {8}),
    (["--arch", "vanilla_iwslt"], dict(es=0, ds=0, dc=0), set()),
    (["--arch", "bet_sf_iwslt"], dict(es=0, ds=0, dc=0), set()),
], ids=["iwslt_row", "wmt_row", "ds", "es_dc", "es_on_vanilla_arch", "ds_in_layer_1", "vanilla", "bet_sf"])
def test_the_option_reaches_every_intended_module(dicts, argv, sites, k):
    model, _, args = build_model([dicts, *MT, *argv])
    assert sparse_sites(model) == (sites, k)


def test_the_translation_rows_store_all_three(dicts):
    _, _, args = build_model([dicts, *MT, "--arch", "sparse_topk_iwslt"])
    assert args.sparse_topk_attention == "es,ds,dc"


@pytest.mark.parametrize("given", [[], ["--sparse-topk-attention", "es,ds,dc"]], ids=["default", "es_dc_ignored"])
def test_language_models_sparsify_their_only_attention(dicts, given):
    model, _, _ = build_model([dicts, "--task", "language_modeling", *TINY_LM, "--arch", "sparse_topk_lm", *given])
    assert sparse_sites(model) == (dict(es=0, ds=2, dc=0), {8})


def test_a_bad_value_is_a_clear_error(dicts):
    with pytest.raises(ValueError, match=re.escape("--sparse-topk-attention: 'cross' is not one of es")):
        build_model([dicts, *MT, "--arch", "sparse_topk_iwslt", "--sparse-topk-attention", "es,cross"])


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory):
    return session_corpus(tmp_path_factory, binarise_multi30k, n_test=N_TEST)


def test_train_and_generate_with_all_three(mt_data, tmp_path):
    checkpoint = train_in_process(mt_data, tmp_path / "ckpt", "--arch", "sparse_topk_iwslt", *MT_TRAIN,
                                  "--sparse-topk", "2")
    state = torch.load(checkpoint, weights_only=True)
    stored = state["cfg"]["model"]
    assert (stored.sparse_topk_attention, stored.sparse_topk) == ("es,ds,dc", 2)
    models, _ = checkpoint_utils.load_model_ensemble([checkpoint])
    assert sparse_sites(models[0]) == (dict(es=2, ds=2, dc=2), {2})
    out = generate_in_process([mt_data, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "3",
                               "--batch-size", "16", "--max-len-b", "20", "--cpu", "--gen-subset", "test"])
    assert len(re.findall(r"^H-\d+", out, re.M)) == N_TEST, "every test sentence is translated"
