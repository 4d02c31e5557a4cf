"""Decoding with whole models: the decoder fed one token at a time through fairseq's incremental state
gives what it computes on the whole prefix, for every variant; beam search through fairseq-generate
gives each sentence the same hypothesis in a batch as alone (the caches are reordered correctly)."""

import re

import pytest
import torch

from cli_utils import (
    MT_TRAIN, TINY_LM, TINY_TRANSLATION, USER_DIR, binarise_multi30k, build_model, generate_in_process, session_corpus,
    toy_dictionaries, train_in_process, variant_flags,
)

from bet_fairseq.attention import VARIANTS

MT = ["--task", "translation", "-s", "de", "-t", "en"]
CASES = [variant_flags(v) for v in sorted(VARIANTS)] + [
    ["--self-attn-mode", "bet_sf", "--bet-keep-diagonal"],
    ["--self-attn-mode", "bet_sf", "--bet-share-w"],
]
IDS = sorted(VARIANTS) + ["bet_sf_keep_diagonal", "bet_sf_share_w"]


@pytest.fixture(scope="module")
def dicts(tmp_path_factory):
    return toy_dictionaries(tmp_path_factory.mktemp("dicts"))


def steps_and_full(decoder, prev, **kwargs):
    """The decoder's output for every position of ``prev``: fed one token at a time, and all at once."""
    with torch.no_grad():
        full, _ = decoder(prev, **kwargs)
        state = {}
        steps = [decoder(prev[:, : t + 1], incremental_state=state, **kwargs)[0] for t in range(prev.size(1))]
    return torch.cat(steps, dim=1), full


def target_prefix(dictionary, bsz=3, tgt_len=7):
    prev = torch.randint(dictionary.nspecial, len(dictionary), (bsz, tgt_len))
    prev[:, 0] = dictionary.eos()
    return prev


@pytest.mark.parametrize("flags", CASES, ids=IDS)
def test_translation_decoder_incremental_equals_full(dicts, flags):
    torch.manual_seed(0)
    model, task, _ = build_model([dicts, *MT, "--arch", "vanilla_iwslt", *TINY_TRANSLATION, "--dropout", "0", *flags])
    model.eval()
    src = torch.randint(4, 50, (3, 6))
    src[0, :2] = task.source_dictionary.pad()  # left-padded source, as fairseq batches it
    enc = model.encoder(src, src_lengths=(src != task.source_dictionary.pad()).sum(1))
    steps, full = steps_and_full(model.decoder, target_prefix(task.target_dictionary), encoder_out=enc)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("flags", CASES, ids=IDS)
def test_language_model_incremental_equals_full(dicts, flags):
    torch.manual_seed(0)
    model, task, _ = build_model([dicts, "--task", "language_modeling", "--arch", "transformer_lm_wikitext2", *TINY_LM,
                                  "--dropout", "0", *flags])
    model.eval()
    steps, full = steps_and_full(model.decoder, target_prefix(task.target_dictionary))
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def hypotheses(generate_output):
    lines = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", generate_output, re.M)
    return {int(i): (float(score), hyp) for i, score, hyp in lines}


def test_beam_search_batched_equals_one_at_a_time(tmp_path_factory, tmp_path):
    """Beam search reorders the BET(SF) cache (K, V, R and V w) between steps; a batch of 20 sentences with
    beam 4 must give the hypotheses that each sentence gets alone."""
    data = session_corpus(tmp_path_factory, binarise_multi30k, n_test=37)
    ckpt = train_in_process(data, tmp_path / "ckpt", "--arch", "bet_sf_iwslt", *MT_TRAIN, updates=2)
    runs = {}
    for bsz in (1, 20):
        runs[bsz] = hypotheses(generate_in_process([
            data, "--user-dir", USER_DIR, "--path", ckpt, "--beam", "4", "--batch-size", bsz, "--max-len-b", "15",
            "--cpu", "--gen-subset", "test"]))
    assert len(runs[1]) == 37 and runs[1].keys() == runs[20].keys()
    for i in runs[1]:
        assert runs[1][i][1] == runs[20][i][1], i
        assert abs(runs[1][i][0] - runs[20][i][0]) < 1e-3
    assert len({h for _, h in runs[1].values()}) > 1, "degenerate model: every hypothesis is the same"
