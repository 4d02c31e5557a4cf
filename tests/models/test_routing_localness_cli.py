"""Routing (shared Q/K, commitment term) and localness (centre scale) through fairseq's own commands, in
process: a tiny routing LM trains and fairseq-eval-lm scores it; a tiny localness translation model trains
and fairseq-generate translates (beam search, incremental decoding). The checkpoints keep the options, and
a checkpoint saved before the options existed loads with version 0.1's behaviour."""

import re

import pytest
import torch
from fairseq import checkpoint_utils

from cli_utils import (
    LM_TRAIN, MT_TRAIN, TINY_LM, USER_DIR, binarise_multi30k, binarise_wikitext2, build_model, eval_lm_in_process,
    generate_in_process, session_corpus, toy_dictionaries, train_in_process,
)

from bet_fairseq.attention.capture import decoder_self_attentions

N_TEST = 37  # the test split of tests/models/test_cli_end_to_end.py: one binarised corpus per session


def model_cfg(state):
    return state["cfg"]["model"]


def option(cfg, name):
    return cfg[name] if isinstance(cfg, dict) else getattr(cfg, name)


def attentions(path, variant):
    models, _ = checkpoint_utils.load_model_ensemble([str(path)])
    return [m for m in decoder_self_attentions(models[0]) if m.variant_name == variant]


def without_options(path, out, *names):
    """The checkpoint as one saved before ``names`` existed."""
    state = torch.load(path, weights_only=True)
    cfg = model_cfg(state)
    for name in names:
        if isinstance(cfg, dict):
            del cfg[name]
        else:  # an argparse Namespace
            delattr(cfg, name)
    torch.save(state, out)
    return out


@pytest.fixture(scope="module")
def routing_lm(tmp_path_factory):
    data = session_corpus(tmp_path_factory, binarise_wikitext2)
    checkpoint = train_in_process(data, tmp_path_factory.mktemp("routing_lm"), "--arch", "routing_lm", *LM_TRAIN,
                                  "--routing-clusters", "3", "--routing-window", "4", "--routing-commitment", "0.001")
    return data, checkpoint


def test_routing_lm_trains_with_shared_qk_and_commitment_and_scores(routing_lm):
    data, checkpoint = routing_lm
    state = torch.load(checkpoint, weights_only=True)
    assert option(model_cfg(state), "routing_separate_qk") is False
    assert option(model_cfg(state), "routing_commitment") == pytest.approx(0.001)
    assert bool(state["model"]["decoder.layers.0.self_attn.centroids_initialized"])
    mods = attentions(checkpoint, "routing")
    assert mods and all(m.shared_qk and m.commitment == pytest.approx(0.001) for m in mods)
    result = eval_lm_in_process([data, "--user-dir", USER_DIR, "--path", checkpoint, "--tokens-per-sample", "64",
                                 "--max-tokens", "1024", "--cpu", "--gen-subset", "test"])
    assert 1 < result["perplexity"] < 1e6


def test_routing_checkpoint_from_before_the_options_keeps_version_0_1_routing(routing_lm, tmp_path):
    _, checkpoint = routing_lm
    old = without_options(checkpoint, tmp_path / "old.pt", "routing_separate_qk", "routing_commitment")
    mods = attentions(old, "routing")
    assert mods and all(not m.shared_qk and m.commitment == 0.0 for m in mods)


def test_separate_qk_flag_builds_version_0_1_routing(tmp_path):
    data = toy_dictionaries(tmp_path)
    model, _, _ = build_model([data, "--task", "language_modeling", "--user-dir", USER_DIR, "--arch", "routing_lm",
                               *TINY_LM, "--routing-separate-qk", "--routing-commitment", "0"])
    mods = decoder_self_attentions(model)
    assert mods and all(not m.shared_qk and m.commitment == 0.0 for m in mods)


def test_localness_translation_trains_and_generates_with_centre_scale(tmp_path_factory, tmp_path):
    data = session_corpus(tmp_path_factory, binarise_multi30k, n_test=N_TEST)
    checkpoint = train_in_process(data, tmp_path, "--arch", "localness_iwslt", "--localness-centre-scale", "i",
                                  *MT_TRAIN)
    state = torch.load(checkpoint, weights_only=True)
    assert str(option(model_cfg(state), "localness_centre_scale")) == "i"
    assert {m.centre_offset for m in attentions(checkpoint, "localness")} == {0}
    out = generate_in_process([data, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "3", "--batch-size", "16",
                               "--max-len-b", "20", "--cpu", "--gen-subset", "test"])
    assert "BLEU4" in out
    assert len(re.findall(r"^H-\d+", out, re.M)) == N_TEST, "every test sentence is translated"
    old = without_options(checkpoint, tmp_path / "old.pt", "localness_centre_scale")
    assert {m.centre_offset for m in attentions(old, "localness")} == {1}  # saved before the option: I_i = i + 1
