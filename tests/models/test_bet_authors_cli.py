"""The authors' BET(SF) through fairseq's own commands, in process: a tiny ``bet_sf_iwslt --bet-form authors``
trains a few updates and fairseq-generate translates with beam search (incremental decoding, reordered caches);
a tiny ``bet_sf_lm --bet-form authors_lm`` trains and fairseq-eval-lm scores it. The checkpoints keep the form."""

import re

import torch
from fairseq import checkpoint_utils

from cli_utils import (
    LM_TRAIN, MT_TRAIN, USER_DIR, binarise_multi30k, binarise_wikitext2, eval_lm_in_process, generate_in_process,
    session_corpus, train_in_process,
)

from bet_fairseq.attention.capture import decoder_self_attentions

N_TEST = 37  # the test split of tests/models/test_cli_end_to_end.py: one binarised corpus per session


def assert_checkpoint_has_form(path, form):
    state = torch.load(path, weights_only=True)
    cfg = state["cfg"]["model"]
    assert (cfg["bet_form"] if isinstance(cfg, dict) else cfg.bet_form) == form
    assert "decoder.layers.0.self_attn.bet_out_proj2.weight" in state["model"]
    assert "decoder.layers.0.self_attn.bet_w" not in state["model"]
    models, _ = checkpoint_utils.load_model_ensemble([str(path)])
    assert {str(a.options.bet_form) for a in decoder_self_attentions(models[0])} == {form}


def test_translation_with_the_authors_form_trains_and_generates(tmp_path_factory, tmp_path):
    data = session_corpus(tmp_path_factory, binarise_multi30k, n_test=N_TEST)
    checkpoint = train_in_process(data, tmp_path, "--arch", "bet_sf_iwslt", "--bet-form", "authors", *MT_TRAIN)
    assert_checkpoint_has_form(checkpoint, "authors")
    out = generate_in_process([data, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "3", "--batch-size", "16",
                               "--max-len-b", "20", "--cpu", "--gen-subset", "test"])
    assert "BLEU4" in out
    assert len(re.findall(r"^H-\d+", out, re.M)) == N_TEST, "every test sentence is translated"


def test_language_model_with_the_authors_lm_form_trains_and_scores(tmp_path_factory, tmp_path):
    data = session_corpus(tmp_path_factory, binarise_wikitext2)
    checkpoint = train_in_process(data, tmp_path, "--arch", "bet_sf_lm", "--bet-form", "authors_lm", *LM_TRAIN)
    assert_checkpoint_has_form(checkpoint, "authors_lm")
    result = eval_lm_in_process([data, "--user-dir", USER_DIR, "--path", checkpoint, "--tokens-per-sample", "64",
                                 "--max-tokens", "1024", "--cpu", "--gen-subset", "test"])
    assert 1 < result["perplexity"] < 1e6
